"""Slices created on demand, stopped while the API is slow: what a stopping runner still
does with its queued resources, and what the step's record says afterwards. Real `marinbuild`
runners, the TPU API emulator on loopback whose nodes are real sshd hosts, real signals."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures_created_slices import FAST, train_out, train_step
from tests.fixtures_ssh import FakeFleet, wait_for
from tests.tpu_api_emulator import TpuApiEmulator, _ApiError

from .helpers import start_marinbuild, status_row

pytest_plugins = ["tests.fixtures_created_slices"]

def _deletes_unavailable(emulator: TpuApiEmulator) -> list[str]:
    """Every delete of a queued resource is answered 503 ("try again"), as during an outage of
    the API; returns the names asked for, one per request."""
    asked: list[str] = []

    def unavailable(name: str, query: dict[str, str]) -> dict[str, Any]:
        asked.append(name.split("/")[-1])
        raise _ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")

    emulator._delete_qr = unavailable  # type: ignore[method-assign]
    return asked


def _step_log(out: Path) -> str:
    log = out / "logs" / "step.log"
    return log.read_text() if log.exists() else ""


# ---------------------------------------------------------------------------------------
# A runner stopped while its step waits for capacity: its deletes are tried twice, half a
# second apart, so that the step reports within the stop's ten seconds (docs/tpu.md).


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stop_while_waiting_for_capacity_still_records_the_step_when_deletes_are_refused(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, sig: signal.Signals) -> None:
    emulator.waiting_s = 300  # the queued resource waits for capacity
    asked = _deletes_unavailable(emulator)
    cluster = train_step(project, emulator, hosts, "touch {output}/started")
    out = train_out(project, cluster)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        wait_for(lambda: "waiting for capacity" in _step_log(out), timeout=60)
        runner.send_signal(sig)
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    shown = stdout + stderr
    assert runner.returncode == 130, shown
    log = _step_log(out)
    # The step reported within the stop: its attempt is recorded, and it is not left RUNNING.
    assert (out / "attempts.json").exists(), (shown, log, asked)
    record = json.loads((out / "attempts.json").read_text())
    assert [a["class"] for a in record["attempts"]] == ["CANCELLED"], record
    assert status_row(project, "train")["status"] != "RUNNING", (shown, log)
    # Each delete of the stopping runner is tried twice, not five times over eight seconds.
    assert "failed (5 tries)" not in log, log
