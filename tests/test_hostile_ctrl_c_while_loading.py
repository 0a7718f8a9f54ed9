"""Ctrl-C while marinbuild starts: while it imports, parses its command line and loads the Marinfile.

Each test sends a real signal to a real marinbuild process (the process sends it to itself at
the moment named, as tests/unit/test_main.py does).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import ctrl_c_swallowed_while_loading, marinbuild, python_code, write_marinfile


def _no_traceback(stderr: str) -> None:
    assert "Traceback" not in stderr, stderr


def test_ctrl_c_while_main_imports_its_ctrl_c_module_is_one_line_and_130() -> None:
    # `python -m marinbuild`: the Ctrl-C lands while __main__ imports marinbuild.cli.ctrl_c,
    # before ctrl_c.install() and the try around loading.
    done = python_code("""
        import builtins, os, signal, sys
        sys.argv = ["marinbuild", "--version"]
        load = builtins.__import__
        def interrupting(name, *args, **kwargs):
            if name == "marinbuild.cli":
                builtins.__import__ = load
                os.kill(os.getpid(), signal.SIGINT)
            return load(name, *args, **kwargs)
        builtins.__import__ = interrupting
        import runpy
        runpy.run_module("marinbuild", run_name="__main__", alter_sys=True)
    """)
    _no_traceback(done.stderr)
    assert (done.returncode, done.stderr) == (130, "marinbuild: interrupted\n")


def test_ctrl_c_while_the_command_line_is_parsed_says_interrupted(tmp_path: Path) -> None:
    # The Ctrl-C lands while typer builds the command's context (parsing its options): typer
    # turns it into Exit(130) and the command ended with status 130 and not a word.
    write_marinfile(tmp_path, "from marinbuild import step\nstep('a', cmd='touch {output}/ran')\n")
    done = python_code(f"""
        import os, signal, sys
        sys.argv = ["marinbuild", "status", "-f", {str(tmp_path / "Marinfile.py")!r},
                    "--prefix", {str(tmp_path / "out")!r}]
        import typer
        context = typer.Context.__mro__[1]  # the click Context typer builds while parsing
        build = context.__init__
        def interrupted_while_parsing(self, *args, **kwargs):
            context.__init__ = build
            os.kill(os.getpid(), signal.SIGINT)
            build(self, *args, **kwargs)
        context.__init__ = interrupted_while_parsing
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "marinbuild: interrupted\n"


def test_ctrl_c_inside_a_class_body_descriptor_while_loading_is_one_line_and_130() -> None:
    # On Python 3.11 a KeyboardInterrupt raised inside __set_name__ (a cached_property of a class
    # created while typer loads: platform.uname_result) reaches __main__ as a RuntimeError.
    done = python_code("""
        import functools, os, signal, sys
        sys.argv = ["marinbuild", "--version"]
        set_name = functools.cached_property.__set_name__
        def interrupted_set_name(self, owner, name):
            functools.cached_property.__set_name__ = set_name
            os.kill(os.getpid(), signal.SIGINT)
            return set_name(self, owner, name)
        functools.cached_property.__set_name__ = interrupted_set_name
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    _no_traceback(done.stderr)
    assert (done.returncode, done.stderr) == (130, "marinbuild: interrupted\n")


def test_a_ctrl_c_swallowed_while_loading_stops_clean_before_it_deletes_anything(tmp_path: Path) -> None:
    write_marinfile(tmp_path, "from marinbuild import step\nstep('a', cmd='touch {output}/ran')\n")
    built = marinbuild("run", "--prefix", str(tmp_path / "out"), cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    assert list((tmp_path / "out").rglob("ran"))
    # The Ctrl-C lands inside a finalizer while typer loads: Python drops the KeyboardInterrupt
    # ("Exception ignored"), and `clean --yes` went on to delete every output, exit status 0.
    done = ctrl_c_swallowed_while_loading("clean", "--yes", "-f", str(tmp_path / "Marinfile.py"),
                                          "--prefix", str(tmp_path / "out"))
    assert "Exception ignored" in done.stderr  # the Ctrl-C was swallowed as intended
    assert list((tmp_path / "out").rglob("ran")), "clean deleted the outputs after a Ctrl-C"
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.endswith("marinbuild: interrupted\n")
