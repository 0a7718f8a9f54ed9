"""On ``gs://`` steps claim, start and commit side by side: their round trips overlap.

Each request to a remote store is a round trip, and a step makes about a dozen of them on
its way in and out. Made one after another on the run loop they would bound a run of many
short steps by their sum, whatever ``-j`` says. Here every request passes through a proxy
that adds 0.2 s and writes down when each one was in flight; the test reads from that
record that requests of different steps were in flight at the same time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from bench.latency_proxy import start_proxy

from .helpers import write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

SIX = """
from marinbuild import step

STEPS = [step(f"s{i}", cmd="true") for i in range(6)]
"""

_STATUS_READ = re.compile(r"/o/(?P<object>[^?]*?)%2F\.marinbuild%2Fstatus\?alt=media")


def spans(log: Path) -> list[tuple[float, float, str]]:
    """(start, end, step folder) of every status marker read the proxy saw."""
    out = []
    for line in log.read_text().splitlines():
        start, end, method, path = line.split(" ", 3)
        found = _STATUS_READ.search(path)
        if method == "GET" and found:
            out.append((float(start), float(end), found["object"].rsplit("%2F", 1)[-1]))
    return out


def test_steps_on_gs_claim_side_by_side(gcs_emulator: Emulator, gcs_prefix: str, project: Path, tmp_path: Path) -> None:
    log = tmp_path / "requests.log"
    proxy = start_proxy(gcs_emulator.endpoint, 0.2, log=str(log))
    try:
        file = write_marinfile(project, SIX)
        env = {**os.environ, **gcs_emulator.env, "STORAGE_EMULATOR_HOST": proxy.endpoint}
        done = subprocess.run(
            [sys.executable, "-m", "marinbuild", "run", "-q", "-j", "6", "-f", str(file), "--prefix", gcs_prefix],
            cwd=project, env=env, capture_output=True, text=True, timeout=300,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    finally:
        proxy.stop()
    reads = spans(log)
    # Each step reads its status once it holds its lease (and before, to skip one finished elsewhere).
    assert {folder.split("-")[0] for _, _, folder in reads} == {f"s{i}" for i in range(6)}
    together = [
        (a, b) for i, a in enumerate(reads) for b in reads[i + 1 :] if a[2] != b[2] and a[0] < b[1] and b[0] < a[1]
    ]
    assert together, f"no two steps' status reads were in flight at once: {sorted(reads)}"
