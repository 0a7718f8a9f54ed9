"""The console script's first moments: an empty package import, and a Ctrl-C while loading."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import marinbuild


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_importing_the_package_loads_none_of_its_modules() -> None:
    done = _python("""
        import sys
        import marinbuild
        print(sorted(m for m in sys.modules if m.startswith("marinbuild.")))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_public_name_is_the_one_its_module_defines() -> None:
    import importlib

    for name in marinbuild.__all__:
        value = getattr(marinbuild, name)
        assert value is getattr(importlib.import_module(marinbuild._HOMES[name]), name)
        assert name in dir(marinbuild)
    with pytest.raises(AttributeError, match="no attribute 'stepz'"):
        marinbuild.stepz  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'stepz'"):
        exec("from marinbuild import stepz")


@pytest.mark.parametrize("start", ["console script", "python -m"])
def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130(start: str) -> None:
    # A real SIGINT, sent by the process to itself the moment typer starts to load.
    run = (
        "from marinbuild.__main__ import entry_point; entry_point()"
        if start == "console script"
        else "import runpy; runpy.run_module('marinbuild', run_name='__main__', alter_sys=True)"
    )
    done = _python(f"""
        import builtins, os, signal, sys
        sys.argv = ["marinbuild", "--version"]
        load = builtins.__import__
        def interrupting(name, *args, **kwargs):
            if name == "typer":
                os.kill(os.getpid(), signal.SIGINT)
            return load(name, *args, **kwargs)
        builtins.__import__ = interrupting
        {run}
    """)
    assert (done.returncode, done.stderr, done.stdout) == (130, "marinbuild: interrupted\n", "")
