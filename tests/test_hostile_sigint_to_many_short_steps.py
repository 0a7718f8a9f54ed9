"""Ctrl-C reaching a real runner of many short steps, which start on the run loop's thread.

Real runners, real steps, real signals. A single SIGINT must stop the run as the docs say
(running steps marked FAILED, exit 130): no step may be left with a RUNNING marker whose
runner is gone, and no step that ran may be counted as "not started". A storm of SIGINTs
must never print a traceback or "Exception ignored".
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from .helpers import cli_env, write_marinfile

STEPS = 160

MARINFILE = f"""
import os, time
from marinbuild import step

LOG = os.environ["HOSTILE_LOG"]

def beat(config):
    fd = os.open(LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.write(fd, (config["name"] + "\\n").encode())
    os.close(fd)
    time.sleep(0.01)

for i in range({STEPS}):
    if i % 2:
        step(f"f{{i}}", fn=beat, config={{"name": f"f{{i}}"}})
    else:
        step(f"c{{i}}", cmd=f"echo c{{i}} >> $HOSTILE_LOG; sleep 0.01; echo ok > {{{{output}}}}/o")
"""


def _start(folder: Path, prefix: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "marinbuild", "run", "-f", "Marinfile.py", "--prefix", str(prefix), "-j", "4"],
        cwd=folder, env=cli_env({"HOSTILE_LOG": str(prefix) + ".log"}),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )


def _wait_started(prefix: Path, count: int) -> None:
    log = Path(str(prefix) + ".log")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if log.exists() and len(log.read_text().splitlines()) >= count:
            return
        time.sleep(0.02)


def _running_markers(prefix: Path) -> list[str]:
    left = []
    for status in prefix.glob("*/.marinbuild/status"):
        if json.loads(status.read_text())["status"] == "RUNNING":
            left.append(status.parent.parent.name)
    return left


def test_one_sigint_leaves_no_step_running_or_miscounted(tmp_path: Path) -> None:
    write_marinfile(tmp_path, MARINFILE)
    rnd = random.Random(7)
    for trial in range(8):
        prefix = tmp_path / f"out{trial}"
        runner = _start(tmp_path, prefix)
        _wait_started(prefix, rnd.randint(10, 60))
        os.kill(runner.pid, signal.SIGINT)
        out, _ = runner.communicate(timeout=60)
        assert runner.returncode == 130, out[-2000:]
        left = _running_markers(prefix)
        ran = set(Path(str(prefix) + ".log").read_text().split())
        assert not left, (
            f"trial {trial}: after one Ctrl-C (exit 130) these steps still say RUNNING with their runner "
            f"gone: {left}; of them, these ran their command: {[n for n in left if n.split('-')[0] in ran]}\n"
            + out[-1500:]
        )


def test_sigint_storm_prints_no_traceback(tmp_path: Path) -> None:
    write_marinfile(tmp_path, MARINFILE)
    for trial in range(3):
        prefix = tmp_path / f"storm{trial}"
        runner = _start(tmp_path, prefix)
        _wait_started(prefix, 20 + 10 * trial)
        deadline = time.monotonic() + 60
        while runner.poll() is None and time.monotonic() < deadline:
            try:
                os.kill(runner.pid, signal.SIGINT)
            except ProcessLookupError:
                break
            time.sleep(0.001)
        out, _ = runner.communicate(timeout=60)
        assert "Exception ignored" not in out and "Traceback" not in out, out[-2500:]


# A Marinfile that is interrupted while it loads, and a report of the interruption that is
# itself interrupted: a storm's second SIGINT landing at the worst moment, made certain.
_INTERRUPTED_REPORT = """
import os, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # this test's SIGINTs, even from a job that ignores it
from marinbuild.__main__ import entry_point
from marinbuild.cli.printing import err

plain_print = err.print

def print_under_fire(*objects, **options):
    os.kill(os.getpid(), signal.SIGINT)
    plain_print(*objects, **options)
    os.kill(os.getpid(), signal.SIGINT)

err.print = print_under_fire
sys.argv = ["marinbuild", "plan", "-f", "Marinfile.py"]
entry_point()
"""


def test_a_sigint_while_the_interruption_is_reported_ends_quietly_with_130(tmp_path: Path) -> None:
    write_marinfile(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\n")
    done = subprocess.run(
        [sys.executable, "-c", _INTERRUPTED_REPORT], cwd=tmp_path, env=cli_env(),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60,
    )
    assert done.returncode == 130, done.stdout
    assert "marinbuild: interrupted" in done.stdout, done.stdout
    assert "Traceback" not in done.stdout and "Exception ignored" not in done.stdout, done.stdout
