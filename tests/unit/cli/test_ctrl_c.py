"""The Ctrl-C handler of the command line: raised at once, raised again once if swallowed, forgotten once handled."""

from __future__ import annotations

import ast
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
