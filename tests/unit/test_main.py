"""The console script's first moments: a Ctrl-C while the command line loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import ctrl_c_swallowed_while_loading, python_code


@pytest.mark.parametrize("start", ["console script", "python -m"])
def test_ctrl_c_while_the_command_line_loads_is_one_line_and_130(start: str) -> None:
    # A real SIGINT, sent by the process to itself the moment typer starts to load.
    run = (
        "from marinbuild.__main__ import entry_point; entry_point()"
        if start == "console script"
        else "import runpy; runpy.run_module('marinbuild', run_name='__main__', alter_sys=True)"
    )
    done = python_code(f"""
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


def test_a_ctrl_c_a_finalizer_swallowed_while_loading_still_stops_the_run_before_any_step(tmp_path: Path) -> None:
    # The Ctrl-C lands inside a finalizer (as inside importlib's module-lock callbacks), where
    # Python prints "Exception ignored" and drops the KeyboardInterrupt.
    (tmp_path / "Marinfile.py").write_text(
        "from marinbuild import step\nstep('a', cmd='touch {output}/ran')\n"
    )
    done = ctrl_c_swallowed_while_loading("run", "-f", str(tmp_path / "Marinfile.py"), "--prefix", str(tmp_path / "out"))
    assert "Exception ignored" in done.stderr  # the fault happened as intended
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.endswith("marinbuild: interrupted\n")
    assert not list((tmp_path / "out").rglob("ran"))
