"""The Ctrl-C handler of the command line: raised at once, raised again once if swallowed, forgotten once handled."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest

import marinbuild
from marinbuild.cli import ctrl_c


def test_a_swallowed_ctrl_c_is_raised_again_once_and_a_handled_one_not_at_all() -> None:
    try:
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(2, None)  # what Python then drops inside a finalizer
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.raise_if_swallowed()
        ctrl_c.raise_if_swallowed()  # raised once: a later command in this process starts afresh
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.on_ctrl_c(2, None)
        ctrl_c.handled()  # the command reported it
        ctrl_c.raise_if_swallowed()
    finally:
        ctrl_c.handled()


def test_only_the_ctrl_c_module_clears_the_interrupt_flag() -> None:
    """CPython's interrupt flag is cleared by an ``exec`` of a string in one function, nowhere else."""
    package = Path(marinbuild.__file__).parent
    calls = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "exec":
                calls.append(path.relative_to(package).as_posix())
    assert calls == ["cli/ctrl_c.py"]


def test_an_ignored_sigint_stays_without_effect_and_is_raised_only_for_a_run_taking_it() -> None:
    before = signal.getsignal(signal.SIGINT)
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a script's background job
        ctrl_c.install()
        noting = signal.getsignal(signal.SIGINT)
        assert callable(noting) and noting is not ctrl_c.on_ctrl_c
        noting(signal.SIGINT, None)  # raises nothing: the command goes on as with SIGINT ignored
        ctrl_c.raise_if_swallowed()  # a command that does not take SIGINT: nothing
        with pytest.raises(KeyboardInterrupt):
            ctrl_c.raise_if_swallowed(ignored_too=True)  # a run, about to start steps, takes it
        ctrl_c.raise_if_swallowed(ignored_too=True)  # once
    finally:
        signal.signal(signal.SIGINT, before)
        ctrl_c.handled()
