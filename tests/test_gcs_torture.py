"""Runners on ``gs://`` under random signals never run a step twice at once, and finish the work.

On a remote store each runner claims, starts and records its steps on a pool of store
threads (``execution/scheduler.py``). Three runners of one Marinfile share a prefix on the
GCS emulator, behind a proxy that adds 50 ms to every request; for a while one of them at a
time is sent SIGKILL, SIGTERM or SIGINT and started again. Each step's command writes
``start PID TIME`` and ``end PID TIME`` to a file outside the prefix. Afterwards one runner
finishes the work, and:

* no execution of a step began while another execution of it that went on to its end was
  running;
* every step is SUCCESS, and the last execution of each one ended;
* no step process is left.
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
from typing import TYPE_CHECKING

from bench.latency_proxy import start_proxy

from .helpers import write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

CHAOS_SECONDS = 25.0

MARINFILE = """
from marinbuild import output_path_of, step

RECORDS = "@RECORDS@"


def cmd(name, seconds):
    return (f"echo start $$ $(date +%s.%N) >> {RECORDS}/{name}; sleep {seconds}; "
            f"echo end $$ $(date +%s.%N) >> {RECORDS}/{name}")


A = [step(f"a{i:02d}", cmd=cmd(f"a{i:02d}", 0.5 + (i % 5) * 0.3)) for i in range(16)]
B = [step(f"b{i:02d}", cmd=cmd(f"b{i:02d}", 0.4), config={"up": output_path_of(A[i])}) for i in range(16)]
C = step("c", cmd=cmd("c", 0.2), config={"ups": [output_path_of(b) for b in B]})
"""


def overlaps(records: Path) -> list[str]:
    """Executions of one step that ran at once, where at least one of them ended."""
    found = []
    for path in sorted(records.iterdir()):
        events = [line.split() for line in path.read_text().splitlines() if line.strip()]
        starts = {pid: float(t) for kind, pid, t in events if kind == "start"}
        ends = {pid: float(t) for kind, pid, t in events if kind == "end"}
        spans = sorted((starts[pid], ends.get(pid), pid) for pid in starts)
        for i, (began, ended, pid) in enumerate(spans):
            for later, _, other in spans[i + 1 :]:
                if ended is not None and later < ended:
                    found.append(f"{path.name}: {other} started at {later} while {pid} ran ({began} to {ended})")
    return found


def test_runners_on_gs_under_random_signals_never_overlap_a_step(
    gcs_emulator: Emulator, gcs_prefix: str, project: Path, tmp_path: Path
) -> None:
    rng = random.Random(int(os.environ.get("MARINBUILD_TORTURE_SEED", "16")))
    records = tmp_path / "records"
    records.mkdir()
    write_marinfile(project, MARINFILE.replace("@RECORDS@", str(records)))
    proxy = start_proxy(gcs_emulator.endpoint, 0.05)
    env = {**os.environ, **gcs_emulator.env, "STORAGE_EMULATOR_HOST": proxy.endpoint,
           "MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}
    run = [sys.executable, "-m", "marinbuild", "run", "-q", "-j", "4", "--prefix", gcs_prefix]

    def runner() -> subprocess.Popen[bytes]:
        return subprocess.Popen(run, cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)

    runners = [runner() for _ in range(3)]
    sent = 0
    try:
        deadline = time.monotonic() + CHAOS_SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.3, 2.0))
            i = rng.randrange(len(runners))
            victim = runners[i]
            if victim.poll() is None:
                sig = rng.choice([signal.SIGKILL, signal.SIGKILL, signal.SIGTERM, signal.SIGINT])
                # SIGKILL to the runner alone (its steps live on until the guardian's deadline);
                # the others to its group, as a terminal sends them.
                (os.kill if sig == signal.SIGKILL else os.killpg)(victim.pid, sig)
                sent += 1
            victim.wait()
            runners[i] = runner()
    finally:
        for r in runners:
            if r.poll() is None:
                os.killpg(r.pid, signal.SIGTERM)
        for r in runners:
            r.wait()
    time.sleep(4)  # past the lease expiry: what a killed runner held can be taken over
    try:
        final = subprocess.run(run, cwd=project, env=env, capture_output=True, text=True, timeout=300)
    finally:
        proxy.stop()
    assert final.returncode == 0, final.stdout + final.stderr
    assert sent >= 5

    assert overlaps(records) == []
    status = subprocess.run(
        [sys.executable, "-m", "marinbuild", "status", "--json", "--prefix", gcs_prefix],
        cwd=project, env={**os.environ, **gcs_emulator.env}, capture_output=True, text=True, timeout=120,
    )
    rows = json.loads(status.stdout)
    assert len(rows) == 33 and {r["status"] for r in rows} == {"SUCCESS"}, status.stdout
    for path in records.iterdir():
        last = [line.split()[0] for line in path.read_text().splitlines() if line.strip()][-1]
        assert last == "end", f"{path.name}: its last execution never ended"
    leftover = subprocess.run(["pgrep", "-f", str(records)], capture_output=True, text=True).stdout.split()
    assert leftover == []
