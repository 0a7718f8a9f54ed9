"""The printers ``run`` and ``plan`` share: control characters defused, commands one line each."""

from __future__ import annotations

from marinbuild.cli.printing import step_line_printer, terminal_safe


def test_terminal_safe_escapes_each_control_character_and_keeps_the_rest() -> None:
    assert terminal_safe("plain é ü 0.5") == "plain é ü 0.5"
    assert terminal_safe("\x1b]0;title\x07x\ny\rz\tw") == "\\x1b]0;title\\x07x\\ny\\rz\\tw"
    assert terminal_safe("\u2028") == "\\u2028"  # a line separator breaks a line too


def test_a_command_is_printed_on_one_line_what_a_step_prints_as_it_is(capsys) -> None:
    step_line_printer(False, "command", "[{step}] $ {text}")("a", "echo 'x\ny'\x1b[2J")
    step_line_printer(False, "output", "[{step}] {text}")("a", "\x1b[32mgreen\x1b[0m")
    assert capsys.readouterr().out == "[a] $ echo 'x\\ny'\\x1b[2J\n[a] \x1b[32mgreen\x1b[0m\n"
