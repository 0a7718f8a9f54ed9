"""Unit tests of marinbuild.cli.exits: what each kind of failure of a command prints, and its exit status."""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Iterator
from typing import Any

import pytest
import typer

from marinbuild.cli.exits import handles_errors, interrupted, interrupted_unsaid, interruption_said
from marinbuild.errors import MarinbuildError


@pytest.fixture
def sigint_restored() -> Iterator[None]:
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def _exit_of(fn: Any, **kwargs: Any) -> int:
    with pytest.raises(typer.Exit) as ended:
        handles_errors(fn)(**kwargs)
    return ended.value.exit_code


def test_a_marinbuild_error_is_one_line_with_its_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    def command(verbose: bool = False) -> None:
        raise MarinbuildError("step 'b' needs 'zz', which no step declares")

    assert _exit_of(command) == MarinbuildError("x").exit_code
    assert capsys.readouterr().err.strip() == "marinbuild: error: step 'b' needs 'zz', which no step declares"


def test_a_full_store_names_the_path_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    def command(verbose: bool = False) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/out/a/.marinbuild/status")

    assert _exit_of(command) == 2
    text = capsys.readouterr().err
    assert text.count("\n") == 1 and "/out/a/.marinbuild/status: No space left on device (the store is full)" in text


def test_an_unexpected_error_is_an_internal_error_without_traceback_unless_verbose(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def command(verbose: bool = False) -> None:
        raise ZeroDivisionError("division by zero")

    assert _exit_of(command) == 1
    quiet = capsys.readouterr().err
    assert "internal error: ZeroDivisionError: division by zero" in quiet and "Traceback" not in quiet
    assert _exit_of(command, verbose=True) == 1
    assert "Traceback" in capsys.readouterr().err


def test_exit_and_abort_pass_through_untouched() -> None:
    def exits(verbose: bool = False) -> None:
        raise typer.Exit(7)

    assert _exit_of(exits) == 7


def test_ctrl_c_in_a_command_is_interrupted_130_and_later_ctrl_cs_are_ignored(
    sigint_restored: None, capsys: pytest.CaptureFixture[str]
) -> None:
    def command(verbose: bool = False) -> None:
        raise KeyboardInterrupt

    assert _exit_of(command) == 130
    assert capsys.readouterr().err.strip() == "marinbuild: interrupted"
    assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    os.kill(os.getpid(), signal.SIGINT)  # would raise KeyboardInterrupt at the next bytecode
    assert interrupted() == 130


def test_a_130_is_unsaid_until_the_command_or_the_run_says_it(sigint_restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    def ends(verbose: bool = False) -> None:
        pass

    handles_errors(ends)()  # a command begins: nothing said yet
    assert interrupted_unsaid(130)  # typer's 130 for a Ctrl-C that escaped: the caller says it
    assert not interrupted_unsaid(0)
    interruption_said()  # run's summary said "interrupted: …"
    assert not interrupted_unsaid(130)
    handles_errors(ends)()  # the next command in this process starts afresh
    assert interrupted_unsaid(130)
    assert interrupted() == 130
    assert not interrupted_unsaid(130)
    assert capsys.readouterr().err == "marinbuild: interrupted\n"


def test_an_error_raised_while_a_ctrl_c_unwound_is_the_interruption(sigint_restored: None, capsys: pytest.CaptureFixture[str]) -> None:
    def command(verbose: bool = False) -> None:
        try:
            raise KeyboardInterrupt
        finally:
            raise OSError(errno.EBADF, "Bad file descriptor")  # what shutil.rmtree's second close raises

    assert _exit_of(command) == 130
    assert capsys.readouterr().err == "marinbuild: interrupted\n"
