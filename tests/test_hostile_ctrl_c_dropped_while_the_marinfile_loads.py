"""A Ctrl-C that Python drops while the Marinfile loads, one lost by a script's background run,
and one that escapes a command's report of it or lands as the command ends.

Python prints "Exception ignored" and drops a ``KeyboardInterrupt`` raised inside a finalizer
(a ``__del__``, importlib's module-lock callbacks); a script's ``marinbuild run &`` starts with
SIGINT ignored; one raised a moment later than the one being reported escapes the command's own
handling, and typer turns it into status 130 without a word. Each test sends a real signal to a
real marinbuild process, from inside it at the moment named (a Marinfile's finalizer, an import,
the report) or from the test once the Marinfile says it is loading, through
``python -m marinbuild`` and through what the ``marinbuild`` console script runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import cli_env, ctrl_c_swallowed_while_loading, marinbuild, python_code, write_marinfile

DROPPING_MARINFILE = """
import os, signal
from marinbuild import step

class Finalized:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # raised in here, printed as "Exception ignored", dropped
        for _ in range(1000):
            pass

if os.environ.get("DROP_A_CTRL_C"):
    Finalized()
step("a", cmd="touch {output}/ran")
step("b", cmd="touch {output}/ran")
"""

CONSOLE_SCRIPT = "import sys; from marinbuild.__main__ import entry_point; sys.argv[0] = 'marinbuild'; sys.exit(entry_point())"
"""What pip's ``marinbuild`` console script runs."""


def _launch(via: str, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    if via == "-m":
        return marinbuild(*args, cwd=cwd, env=env)
    return subprocess.run([sys.executable, "-c", CONSOLE_SCRIPT, *args], cwd=cwd, env=cli_env(env),
                          capture_output=True, text=True, timeout=120)


def _outputs_ran(prefix: Path) -> list[Path]:
    return sorted(prefix.rglob("ran"))


@pytest.fixture()
def built(tmp_path: Path) -> Path:
    write_marinfile(tmp_path, DROPPING_MARINFILE)
    done = marinbuild("run", "--prefix", "out", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert len(_outputs_ran(tmp_path / "out")) == 2
    return tmp_path


@pytest.mark.parametrize("via", ["-m", "console script"])
@pytest.mark.parametrize("args", [
    ["run", "-n", "-F"],  # planned, shown, and ended 0: the plan command ends 130 there
    ["run"],  # nothing to do: "nothing to do", and 0
    ["run", "-F"],
    ["plan"],
    ["status"],
    ["clean", "--yes"],
], ids=" ".join)
def test_a_ctrl_c_dropped_while_the_marinfile_loads_ends_the_command_with_130(built: Path, via: str, args: list[str]) -> None:
    before = {p: p.stat().st_mtime_ns for p in _outputs_ran(built / "out")}
    done = _launch(via, *args, "--prefix", "out", cwd=built, env={"DROP_A_CTRL_C": "1"})
    assert "Exception ignored" in done.stderr  # the Ctrl-C was dropped, as intended
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "marinbuild: interrupted", done.stderr
    assert done.stderr.count("marinbuild: interrupted") == 1, done.stderr
    # Nothing was run again and nothing deleted.
    assert {p: p.stat().st_mtime_ns for p in _outputs_ran(built / "out")} == before
    assert "start " not in done.stdout, done.stdout


@pytest.mark.parametrize("via", ["-m", "console script"])
def test_a_ctrl_c_that_lands_while_another_is_reported_still_gets_its_line(built: Path, via: str) -> None:
    # The Marinfile is interrupted as it loads, and one more Ctrl-C of the storm lands inside
    # the report, just before it silences the rest: typer turned the escaped KeyboardInterrupt
    # into 130, and the command ended with 130 and not a word.
    (built / "Marinfile.py").write_text(textwrap.dedent("""
        import os, signal
        from marinbuild.cli import exits

        silence = exits.ignore_ctrl_c
        def one_more_of_the_storm():
            exits.ignore_ctrl_c = silence
            os.kill(os.getpid(), signal.SIGINT)
            silence()
        exits.ignore_ctrl_c = one_more_of_the_storm
        os.kill(os.getpid(), signal.SIGINT)
    """))
    done = _launch(via, "status", "--prefix", "out", cwd=built)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "marinbuild: interrupted\n"



def test_a_ctrl_c_dropped_while_clean_chooses_stops_it_before_it_deletes(built: Path) -> None:
    # Choosing what to remove (after the Marinfile loaded) imports the lease modules; a Ctrl-C
    # dropped inside that import's callbacks was followed by deleting every output, status 0.
    done = ctrl_c_swallowed_while_loading(
        "clean", "--yes", "-f", str(built / "Marinfile.py"), "--prefix", str(built / "out"),
        module="marinbuild.store.lease", loaded_before="marinbuild.project",  # the Marinfile is loaded by now
    )
    assert "Exception ignored" in done.stderr  # the Ctrl-C was dropped, as intended
    assert len(_outputs_ran(built / "out")) == 2, "clean deleted the outputs after a Ctrl-C"
    assert "remove " not in done.stdout, done.stdout
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "marinbuild: interrupted", done.stderr


WAITING_MARINFILE = """
import os, time
from marinbuild import step

open("loading", "w").close()
while not os.path.exists("go"):  # the test's signal is sent by now
    time.sleep(0.005)
step("a", cmd="touch {output}/ran")
"""


@pytest.mark.parametrize("via", ["-m", "console script"])
def test_a_sigint_to_a_scripts_background_run_while_it_loads_stops_it_before_any_step(tmp_path: Path, via: str) -> None:
    # A script's `marinbuild run &` starts with SIGINT ignored. The run takes SIGINT once its
    # steps are about to start; a `kill -INT` sent while it loaded was lost, and the run ran
    # every step and ended 0.
    write_marinfile(tmp_path, WAITING_MARINFILE)
    launch = f"{sys.executable} -m marinbuild" if via == "-m" else f'{sys.executable} -c "{CONSOLE_SCRIPT}"'
    script = subprocess.Popen(
        ["bash", "-c", f"{launch} run --prefix out & echo $!; wait $!; echo rc=$?"],
        cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert script.stdout is not None
        pid = int(script.stdout.readline())
        deadline = time.monotonic() + 60
        while not (tmp_path / "loading").exists():
            assert script.poll() is None and time.monotonic() < deadline, script.communicate()
            time.sleep(0.005)
        os.kill(pid, signal.SIGINT)
        (tmp_path / "go").touch()
        out, err = script.communicate(timeout=120)
    finally:
        if script.poll() is None:
            script.kill()
    assert out.splitlines()[-1] == "rc=130", out + err
    assert not list((tmp_path / "out").rglob("ran")), "a step ran after the SIGINT"
    assert err.splitlines()[-1] == "marinbuild: interrupted", err
    assert "Traceback" not in err, err


def test_a_ctrl_c_that_lands_as_the_command_ends_gets_its_line(built: Path) -> None:
    # `status` has printed its table; the Ctrl-C lands as the command line looks at the exit
    # code typer gave, past the command's own handling: 130, and not a word said.
    done = python_code(f"""
        import os, signal, sys
        sys.argv = ["marinbuild", "status", "-f", {str(built / "Marinfile.py")!r}, "--prefix", {str(built / "out")!r}]
        from marinbuild.cli import app

        unsaid = app.interrupted_unsaid
        def interrupted_as_it_ends(code):
            app.interrupted_unsaid = unsaid
            os.kill(os.getpid(), signal.SIGINT)
            return unsaid(code)
        app.interrupted_unsaid = interrupted_as_it_ends
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    assert "SUCCESS" in done.stdout, done.stdout  # the command had done its work
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "marinbuild: interrupted\n"



@pytest.mark.parametrize("via", ["-m", "console script"])
def test_a_ctrl_c_dropped_while_status_prints_ends_it_with_130(built: Path, via: str) -> None:
    # The Marinfile has loaded; the table's printing imports its columns, and a Ctrl-C dropped inside
    # that import's callbacks left the command to end 0.
    (built / "Marinfile.py").write_text(DROPPING_MARINFILE + textwrap.dedent("""
        import builtins, sys
        assert "marinbuild.cli.plan_view" not in sys.modules  # imported as the table is printed
        load = builtins.__import__
        def interrupting(name, *args, **kwargs):
            if name == "marinbuild.cli.plan_view":
                builtins.__import__ = load
                Finalized()
            return load(name, *args, **kwargs)
        builtins.__import__ = interrupting
    """))
    done = _launch(via, "status", "--prefix", "out", cwd=built)
    assert "Exception ignored" in done.stderr  # the Ctrl-C was dropped, as intended
    assert "SUCCESS" in done.stdout, done.stdout
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr.splitlines()[-1] == "marinbuild: interrupted", done.stderr


@pytest.mark.parametrize("via", ["-m", "console script"])
def test_a_ctrl_c_in_the_command_lines_last_clean_up_is_one_line_and_130(built: Path, via: str) -> None:
    # `status` is over; the Ctrl-C lands as console_script's own clean-up begins, before it
    # ignores the rest: a traceback of signal.signal, and `python -m` ended by SIGINT (-2).
    code = f"""
import os, signal, sys
sys.argv = ["marinbuild", "status", "-f", {str(built / "Marinfile.py")!r}, "--prefix", {str(built / "out")!r}]
from marinbuild.cli import app
silence = app.ignore_ctrl_c
def interrupted_as_it_cleans_up():
    app.ignore_ctrl_c = silence
    os.kill(os.getpid(), signal.SIGINT)
    silence()
app.ignore_ctrl_c = interrupted_as_it_cleans_up
"""
    start = "import runpy; runpy.run_module('marinbuild', run_name='__main__')" if via == "-m" else CONSOLE_SCRIPT
    done = subprocess.run([sys.executable, "-c", code + start + "\n"], env=cli_env(), capture_output=True, text=True, timeout=120)
    assert "SUCCESS" in done.stdout, done.stdout + done.stderr  # the command had done its work
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "marinbuild: interrupted\n"


def test_a_ctrl_c_that_an_error_of_the_clean_up_replaced_is_still_an_interruption(built: Path) -> None:
    # `clean --yes` stopped inside shutil.rmtree, between closing a folder and noting it closed:
    # rmtree closes it again, and the EBADF replaced the Ctrl-C: "marinbuild: internal error:
    # OSError: [Errno 9] Bad file descriptor", status 1 (seen once in 60 storms).
    done = python_code(f"""
        import os, signal, sys
        sys.argv = ["marinbuild", "clean", "--yes", "-f", {str(built / "Marinfile.py")!r},
                    "--prefix", {str(built / "out")!r}]
        close = os.close
        def closed_then_interrupted(fd):
            close(fd)
            caller = sys._getframe(1).f_code
            if caller.co_name == "rmtree" and caller.co_filename.endswith("shutil.py"):
                os.close = close
                os.kill(os.getpid(), signal.SIGINT)  # lands before rmtree notes the folder closed
        os.close = closed_then_interrupted
        from marinbuild.__main__ import entry_point
        entry_point()
    """)
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stderr == "marinbuild: interrupted\n"
    assert "removed" not in done.stdout, done.stdout
