"""What is not a file where a file belongs, and names no folder can hold: every command ends, in one line.

Each test is a reproduction: a FIFO where a marker, ``info.json``, ``attempts.json``, a lease
or ``logs/step.log`` belongs (a read of it used to block forever), a status linked to
``/dev/zero`` (read until memory ran out), a ``.marinbuild`` that is a file and a path too
long for the file system (each lease then waited forever), a 300-byte name, a backslash
in a name, and an integer past what JSON can write.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import cli_env, marinbuild, plan_json, write_marinfile

TWO = """
from marinbuild import step
step("a", cmd="echo a > {output}/data")
step("b", cmd="echo b > {output}/data")
"""

# Each command given a bound: one that blocks is killed, and the test says which.
COMMANDS = [("status",), ("plan",), ("show", "a"), ("report", "--output", "report.html"), ("logs", "a"), ("run", "-F")]


def _finished(project: Path) -> Path:
    write_marinfile(project, TWO)
    assert marinbuild("run", cwd=project).returncode == 0
    return Path(plan_json(project)["a"]["output_path"])


def _ended_in_one_line(project: Path, args: tuple[str, ...], fifo: Path) -> str:
    try:
        result = marinbuild(*args, cwd=project, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail(f"`marinbuild {' '.join(args)}` blocked on the FIFO at {fifo}")
    text = result.stdout + result.stderr
    assert "Traceback" not in text and "internal error" not in text, text
    return text


@pytest.mark.parametrize("where", [".marinbuild/status", ".marinbuild/info.json", ".marinbuild/lease", "attempts.json",
                                   "logs/step.log"])
def test_a_fifo_where_a_file_belongs_never_blocks_a_command(project: Path, where: str) -> None:
    out = _finished(project)
    fifo = out / where
    fifo.unlink(missing_ok=True)
    os.mkfifo(fifo)
    for args in COMMANDS:
        text = _ended_in_one_line(project, args, fifo)
        if args[0] == "run":
            # Nothing is written under it: the step is refused, the other one runs.
            assert "is not a regular file (a FIFO)" in text, text
            assert "FAIL  a" in text or f"{fifo} is not a regular file" in text, text
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # left where it was, for its owner


def test_a_status_linked_to_dev_zero_is_refused_not_read_until_memory_runs_out(project: Path) -> None:
    out = _finished(project)
    status = out / ".marinbuild" / "status"
    status.unlink()
    status.symlink_to("/dev/zero")
    for args in (("status",), ("plan",), ("show", "a")):
        result = marinbuild(*args, cwd=project, timeout=60)
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{status} is not a regular file (a character device)" in result.stderr, result.stderr
        assert "MemoryError" not in result.stderr


def test_a_run_blocked_in_a_system_call_still_ends_on_sigterm(project: Path) -> None:
    """A hold on SIGTERM (the run takes it between two pieces of bookkeeping) must not outlast a stuck call."""
    fifo = project / "stuck"
    os.mkfifo(fifo)
    # The run's loop holds SIGTERM around its bookkeeping; here the main thread blocks in
    # open() of a FIFO nobody writes while it holds, as the run's did on a FIFO'd log.
    code = (
        "import os, signal, sys, threading\n"
        "from marinbuild.backends import held_signals\n"
        "from marinbuild.backends.held_signals import HeldSignals\n"
        "held_signals.STUCK_AFTER = 2.0\n"  # the grace period's length is not what is tested
        "held = HeldSignals()\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))\n"
        "with held.installed():\n"
        "    with held.holding():\n"
        "        print('holding', flush=True)\n"
        f"        open({str(fifo)!r}).read()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=project, env=cli_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "holding\n"
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "still blocked" in stderr and "after SIGTERM" in stderr, stderr


def test_a_marker_folder_that_is_a_file_fails_its_step_at_once(project: Path) -> None:
    write_marinfile(project, TWO)
    out = Path(plan_json(project)["a"]["output_path"])
    out.mkdir(parents=True)
    (out / ".marinbuild").write_text("not a folder")
    result = marinbuild("run", cwd=project, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot be created: Not a directory (a file is where a folder belongs)" in result.stdout, result.stdout
    assert "done  b" in result.stdout


def test_a_path_too_long_for_the_file_system_fails_its_step_at_once(project: Path) -> None:
    # Every part fits a folder name, and the step's folder's parent fits PATH_MAX (4,096 bytes);
    # the step's folder does not.
    room = 4040 - len(str(project / "marinbuild-out"))
    parts = ["x" * 200] * (room // 201) + ["z" * (room % 201 or 1)]
    deep = "/".join([*parts, "y" * 200])
    write_marinfile(project, f'from marinbuild import step\nstep("{deep}", cmd="true")\nstep("b", cmd="true")\n')
    result = marinbuild("run", cwd=project, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "cannot be created: File name too long (the path is too long for the file system)" in result.stdout
    assert "done  b" in result.stdout


@pytest.mark.parametrize(("name", "why"), [
    ("a" * 300, "is too long: its part"),
    ("a\\\\b", "must not contain a backslash"),
])
def test_names_no_folder_can_hold_are_refused_at_plan_time(project: Path, name: str, why: str) -> None:
    write_marinfile(project, f'from marinbuild import step\nstep("{name}", cmd="true")\n')
    for command in ("plan", "run"):
        result = marinbuild(command, cwd=project)
        assert result.returncode == 2, result.stdout + result.stderr
        (line,) = result.stderr.splitlines()
        assert why in line, line
    assert not (project / "marinbuild-out").exists()


def test_an_integer_past_what_json_can_write_is_one_line_exit_2(project: Path) -> None:
    write_marinfile(project, 'from marinbuild import step, versioned\nstep("a", cmd="true", config={"n": versioned(10**5000)})\n')
    result = marinbuild("plan", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert "versioned field 'n' holds an integer over 4,000 digits" in line, line
    # As a plain field it is no number of the identity: the step runs and records it.
    write_marinfile(project, 'from marinbuild import step\nstep("a", cmd="true", config={"n": 10**5000})\n')
    result = marinbuild("run", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    info = json.loads(Path(plan_json(project)["a"]["output_path"], ".marinbuild", "info.json").read_text())
    assert info["config"]["n"] == "(an integer of 16610 bits)"
