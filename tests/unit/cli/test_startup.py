"""The start-up boundary: a Ctrl-C Python swallowed is raised where start-up ends, and a run's handlers come and go."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from marinbuild.cli import ctrl_c, startup


@pytest.fixture()
def swallowed():
    """A Ctrl-C that the handler saw but that Python dropped (inside a finalizer)."""
    try:
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(signal.SIGINT, None)
        yield
    finally:
        ctrl_c.handled()


def _marinfile(tmp_path: Path) -> str:
    path = tmp_path / "Marinfile.py"
    path.write_text("from marinbuild import step\nstep('a', cmd='true')\n")
    return str(path)


def test_a_project_opens_when_no_ctrl_c_came(tmp_path: Path) -> None:
    project = startup.opened_project(_marinfile(tmp_path), str(tmp_path / "out"))
    assert [s.name for s in project.marinfile.steps] == ["a"]


def test_a_ctrl_c_swallowed_before_the_marinfile_loaded_is_raised_once_it_has(tmp_path: Path, swallowed: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        startup.opened_project(_marinfile(tmp_path), str(tmp_path / "out"))
    startup.opened_project(_marinfile(tmp_path), str(tmp_path / "out"))  # raised once only


def test_a_command_begins_only_after_a_swallowed_ctrl_c_is_raised(swallowed: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        startup.command_begins()
    startup.command_begins()


def test_a_runs_handlers_take_sigterm_and_sigint_and_give_them_back(swallowed: None) -> None:
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with startup.signals_of_a_run() as starting:
        assert signal.getsignal(signal.SIGTERM) == before[0]  # nothing is taken until steps are about to start
        with pytest.raises(KeyboardInterrupt):
            starting()  # the swallowed Ctrl-C comes out before any step starts
        assert signal.getsignal(signal.SIGINT) is ctrl_c.on_ctrl_c
        term = signal.getsignal(signal.SIGTERM)
        assert callable(term)
        with pytest.raises(KeyboardInterrupt):
            term(signal.SIGTERM, None)  # the first SIGTERM stops the run as Ctrl-C does
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # a second one ends the process
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_run_that_starts_no_step_raises_a_swallowed_ctrl_c_as_it_ends(swallowed: None) -> None:
    with pytest.raises(KeyboardInterrupt), startup.signals_of_a_run():
        pass  # -n, or nothing to do: the hook is never called
    with startup.signals_of_a_run():
        pass  # raised once only


def test_a_run_that_took_the_ctrl_c_at_its_start_does_not_raise_it_again(swallowed: None) -> None:
    with startup.signals_of_a_run() as starting:
        with pytest.raises(KeyboardInterrupt):
            starting()
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(signal.SIGINT, None)  # the run's loop stops on one, and its summary says so
    ctrl_c.handled()


def test_a_deletion_waits_for_a_swallowed_ctrl_c_to_be_raised(swallowed: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        startup.about_to_delete()
    startup.about_to_delete()


def test_a_command_that_returned_raises_a_ctrl_c_swallowed_meanwhile(swallowed: None) -> None:
    with pytest.raises(KeyboardInterrupt):
        startup.command_ends()
    startup.command_ends()
