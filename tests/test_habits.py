"""What make and Snakemake users type: ``-B``, ``list``/``--list``, completion of step names, a bare
``marinbuild -n``, a live view with a percentage and the time left, a retries line of used causes only."""

from __future__ import annotations

from .helpers import marinbuild, marinbuild_in_process, on_terminal, write_marinfile

MARINFILE = """
from marinbuild import step, versioned
data = step("data", cmd="echo data", config={"n": versioned(1)})
for lr in (1, 2):
    step(f"train/lr{lr}", cmd="echo {lr}", config={"lr": versioned(lr), "data": data})
step("report", cmd="echo report", config={"k": versioned(0)})
"""


def test_dash_b_forces_every_step_as_make_does(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", "-q", cwd=project).returncode == 0
    forced = marinbuild("run", "-B", "-q", "train/lr1", cwd=project)
    assert forced.returncode == 0, forced.stderr
    assert forced.stdout.startswith("2 done"), forced.stdout  # train/lr1 and the data it needs
    planned = marinbuild_in_process("plan", "-B", cwd=project)
    assert "4 to run" in planned.stdout, planned.stdout


def test_list_prints_step_names_one_a_line(project):
    write_marinfile(project, MARINFILE)
    every = marinbuild_in_process("list", cwd=project)
    assert every.returncode == 0, every.stderr
    assert every.stdout.splitlines() == ["data", "train/lr1", "train/lr2", "report"]
    assert marinbuild_in_process("list", "train/*", cwd=project).stdout.splitlines() == ["train/lr1", "train/lr2"]
    for command in ("run", "plan"):
        listed = marinbuild(command, "--list", "train/*", cwd=project)
        assert listed.returncode == 0 and listed.stdout.splitlines() == ["train/lr1", "train/lr2"], listed
    assert not (project / "marinbuild-out").exists()  # run --list ran nothing
    missing = marinbuild_in_process("list", "nope", cwd=project)
    assert missing.returncode == 2 and "no step named 'nope'" in missing.stderr


def _completions(project, *words: str) -> list[str]:
    line = " ".join(["marinbuild", *words])
    found = marinbuild_in_process(cwd=project, env={"_MARINBUILD_COMPLETE": "complete_bash", "COMP_WORDS": line,
                                                    "COMP_CWORD": str(len(words))})
    assert found.returncode == 0, found.stderr
    return found.stdout.split()


def test_shell_completion_completes_step_names_for_every_command_that_takes_targets(project):
    write_marinfile(project, MARINFILE)
    for command in ("run", "plan", "status", "why", "clean", "show", "report", "list", "logs"):
        assert _completions(project, command, "train/") == ["train/lr1", "train/lr2"], command
        assert _completions(project, command, "") == ["data", "train/lr1", "train/lr2", "report"], command
    assert _completions(project, "run", "--force", "d") == ["data"]
    write_marinfile(project, "raise SystemExit(3)\n", name="Broken.py")
    assert _completions(project, "run", "-f", "Broken.py", "") == []


def test_a_bare_marinbuild_with_run_options_runs(project):
    write_marinfile(project, MARINFILE)
    dry = marinbuild("-n", cwd=project)
    assert dry.returncode == 0, dry.stderr
    assert "4 to run" in dry.stdout and not (project / "marinbuild-out").exists()
    ran = marinbuild("-j", "4", "-q", cwd=project)
    assert ran.returncode == 0 and ran.stdout.startswith("4 done"), ran.stdout + ran.stderr
    assert marinbuild("-j", "-q", "data", cwd=project).returncode == 0
    helped = marinbuild("--help", cwd=project)
    assert helped.returncode == 0 and "Commands" in helped.stdout
    # A bare `marinbuild` prints the help, as help: not as an error line framing it.
    bare = marinbuild(cwd=project)
    assert "Commands" in bare.stdout and "run" in bare.stdout, bare
    assert "error" not in bare.stdout + bare.stderr and "(see --help)" not in bare.stdout + bare.stderr, bare


def test_the_live_view_shows_a_percentage_and_the_time_left(project):
    write_marinfile(project, """
        from marinbuild import step, versioned
        for i in range(2):
            step(f"s{i}", cmd="sleep 1", config={"i": versioned(i)})
    """)
    assert marinbuild("run", "-q", cwd=project).returncode == 0  # the history the estimates come from
    shown = on_terminal(project, "run", "-B", "-j", "1", columns=100)
    assert "2 done, 0 failed" in shown, shown
    assert "done 0/2 (0%)" in shown or "done 1/2 (50%)" in shown, shown
    assert " left" in shown and "about " in shown, shown


def test_the_retries_line_names_only_the_causes_used(project):
    write_marinfile(project, """
        from marinbuild import step
        step("a", cmd="exit 3")
        step("b", cmd="test -e tried || (touch tried; exit 1)", max_retries_failure=2)
    """)
    result = marinbuild("run", "-k", cwd=project)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert not any(line.startswith("retries a:") for line in lines), result.stdout
    assert "retries b: failures 1/2" in lines, result.stdout
