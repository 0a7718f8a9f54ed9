"""Control characters from config values never reach a terminal or a pipe raw: ``plan``, ``why``,
``run -n -p``, the drift notes and ``run``'s own lines escape them as ``show`` does, one line per step."""

from __future__ import annotations

from .helpers import marinbuild, marinbuild_in_process, on_terminal, write_marinfile

# A window-title OSC, a screen clear, a bell and a raw newline, in a versioned field and a plain one.
HOSTILE = "\\x1b]0;PWNED\\x07 a\\x1b[2J\\nsecond line"
MARINFILE = f"""
from marinbuild import step, versioned
step("a", cmd="echo {{msg}}", config={{"msg": versioned("v1 {HOSTILE}"), "plain": "p1 {HOSTILE}"}})
step("b", cmd="echo b", config={{"n": versioned(1)}})
"""

RAW = ("\x1b", "\x07")


def _assert_defused(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)
    assert "\\x1b]0;PWNED\\x07" in text, text


def test_plan_why_and_dry_run_commands_escape_control_characters_one_line_per_step(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    write_marinfile(project, MARINFILE.replace("v1 ", "v2 ").replace("p1 ", "p2 "))
    plan = marinbuild_in_process("plan", cwd=project)
    assert plan.returncode == 0, plan.stderr
    _assert_defused(plan.stdout)
    rows = [line for line in plan.stdout.splitlines() if line.startswith(("a ", "b "))]
    assert len(rows) == 2 and "second line" in rows[0] and "second line" not in plan.stdout.replace(rows[0], "")
    why = marinbuild_in_process("why", "a", cwd=project)
    assert why.returncode == 0, why.stderr
    _assert_defused(why.stdout)
    assert not any(line.startswith("second line") for line in why.stdout.splitlines())
    dry = marinbuild("run", "-n", "-p", cwd=project)
    assert dry.returncode == 0, dry.stderr
    _assert_defused(dry.stdout)
    commands = [line for line in dry.stdout.splitlines() if line.startswith("[a] $ ")]
    assert len(commands) == 1 and "v2" in commands[0] and "second line" in commands[0]
    terminal = on_terminal(project, "plan", columns=100)
    assert not any(c in terminal for c in RAW) and "PWNED" in terminal


def test_a_drift_note_quoting_a_plain_field_is_escaped(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    write_marinfile(project, MARINFILE.replace("p1 ", "p2 "))
    plan = marinbuild_in_process("plan", cwd=project)
    assert plan.returncode == 0, plan.stderr
    notes = [line for line in plan.stderr.splitlines() if "plain field plain changed" in line]
    assert len(notes) == 1, plan.stderr
    _assert_defused(plan.stderr)
    why = marinbuild_in_process("why", "a", cwd=project)
    _assert_defused(why.stdout)


def test_a_reason_quoting_rich_markup_is_shown_as_written_on_a_terminal(project):
    marinfile = """
from marinbuild import step, versioned
step("a", cmd="true", config={"tag": versioned("V [bold]x[/] [/nope]")})
"""
    write_marinfile(project, marinfile.replace("V ", "v1 "))
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    write_marinfile(project, marinfile.replace("V ", "v2 "))
    for wide in ((), ("--wide",)):
        shown = on_terminal(project, "plan", *wide, columns=200)
        assert "[bold]x[/] [/nope]" in shown and "Traceback" not in shown, shown
