"""Ctrl-C at start-up, a killed forced rerun, steps merged by name, and metric columns: defects found by hand.

Each test sends a real signal to a real marinbuild process (the process sends it to itself at
the moment named, as tests/unit/test_main.py does) or runs the real command line.
"""

from __future__ import annotations

import json
import textwrap
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


def test_keep_output_resumes_in_place_after_a_forced_rerun_killed_before_its_move(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        from marinbuild import step, versioned
        step("a", cmd="echo attempt $MARINBUILD_ATTEMPT >> {output}/done", config={"n": versioned(1)})
    """)
    prefix = str(tmp_path / "out")
    first = marinbuild("run", "--prefix", prefix, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    out = next((tmp_path / "out").glob("a-*"))
    # `run -R a` killed (SIGKILL) right after its RUNNING status, before its output is set aside.
    killed = python_code(f"""
        import os, signal, sys
        import marinbuild.execution.step_records as records
        def killed(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGKILL)
        records.set_aside = killed
        os.chdir({str(tmp_path)!r})
        sys.argv = ["marinbuild", "run", "-R", "a", "--prefix", {prefix!r}]
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    assert killed.returncode == -9, killed.stdout + killed.stderr
    status = json.loads((out / ".marinbuild" / "status").read_text())
    assert status["status"] == "RUNNING" and status["starting_over"] is True
    # The next run asks to keep the output: as `run -R a --keep-output` would, it resumes in place.
    again = marinbuild("run", "--keep-output", "--prefix", prefix, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    # Resumed in place: the first run's line is still there. The killed run's attempt keeps its
    # number (2) although it never began, so this one is 3.
    assert (out / "done").read_text() == "attempt 1\nattempt 3\n", again.stdout
    assert not list((out / ".marinbuild").glob("aside-*"))


def test_two_partials_of_one_function_with_different_arguments_under_one_name_are_an_error(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        import functools
        from marinbuild import step, versioned, this_output_path

        def write(cfg, word):
            open(cfg["output"] + "/" + word, "w").write(word)

        step("a", functools.partial(write, word="first"), {"n": versioned(1), "output": this_output_path()})
        step("a", functools.partial(write, word="second"), {"n": versioned(1), "output": this_output_path()})
    """)
    done = marinbuild("run", "--prefix", str(tmp_path / "out"), cwd=tmp_path)
    # One of them silently never ran: only "first" was written.
    assert done.returncode == 2, done.stdout + done.stderr + textwrap.shorten(str(list((tmp_path / "out").rglob("*"))), 300)
    assert done.stderr.startswith("marinbuild: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "'a'" in done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("first"))


def test_a_metric_named_step_beside_one_named_metrics_step_keeps_both_values(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        from marinbuild import step, versioned
        step("s", cmd="printf '%s' {m} > {output}/metrics.json",
             config={"i": versioned(0), "m": '{"step": 7, "metrics.step": 100}'})
    """)
    prefix = str(tmp_path / "out")
    built = marinbuild("run", "--prefix", prefix, cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    shown = marinbuild("show", "--metrics", "metrics.json", "--json", "--prefix", prefix, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[0]["metrics"] == {"step": 7, "metrics.step": 100}
    table = marinbuild("show", "--metrics", "metrics.json", "--prefix", prefix, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()[:2]
    assert len(header.split()) == len(set(header.split())), header  # no two columns of one name
    assert "7" in row.split(), table.stdout  # the metric `step` is shown, not lost
