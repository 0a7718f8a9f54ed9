"""Unit tests of marinbuild.backends.slurm.node: a node's process, run for real without Slurm."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from marinbuild.backends.slurm.node import NodeSpec, _task, coordinator_port, failures_first, process_env
from marinbuild.store.lease import LeaseRecord, Owner


def _spec(tmp_path: Path, command: str, **more) -> NodeSpec:  # type: ignore[no-untyped-def]
    folder = tmp_path / "job"
    folder.mkdir(exist_ok=True)
    spec = NodeSpec(name="s", output_path=str(tmp_path / "out"), prefix=str(tmp_path), workdir=str(tmp_path),
                    folder=str(folder), env={"MARINBUILD_OUTPUT": str(tmp_path / "out"), "MARINBUILD_ATTEMPT": "3"},
                    command=command, header="=== marinbuild attempt 3 t host ? backend slurm ===\n", **more)
    (folder / "spec.json").write_text(spec.to_json())
    return spec


def test_the_spec_travels_as_json(tmp_path: Path) -> None:
    spec = _spec(tmp_path, "true", nodes=2)
    assert NodeSpec.read(str(Path(spec.folder) / "spec.json")) == spec
    assert coordinator_port(14000) == coordinator_port(34000) == 34000


def test_stale_variables_never_reach_the_step(tmp_path: Path) -> None:
    env = process_env({"MARINBUILD_STEP": "old", "MEGASCALE_NUM_SLICES": "4", "HOME": "/h"}, _spec(tmp_path, "true"), 0, 1, "a:1")
    assert env["HOME"] == "/h" and "MARINBUILD_STEP" not in env and "MEGASCALE_NUM_SLICES" not in env
    assert env["MARINBUILD_ATTEMPT"] == "3" and env["MARINBUILD_PROCESS_ID"] == "0"


def test_a_node_runs_its_step_and_writes_its_log_and_exit_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capfd: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path, 'echo "rank $MARINBUILD_PROCESS_ID of $MARINBUILD_NUM_PROCESSES"; exit 3')
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURM_NTASKS", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    assert _task(str(Path(spec.folder) / "spec.json")) == 3
    assert "rank 1 of 2" in capfd.readouterr().out
    log = Path(spec.folder, "node_01.log").read_text()
    assert log.startswith("=== marinbuild attempt 3 t host n2 backend slurm ===\n") and "rank 1 of 2" in log
    now = time.time()
    record = json.loads(Path(spec.folder, "exit-1.json").read_text())
    assert now - 60 < record.pop("ended") <= now
    assert record == {"code": 3, "error": "exit status 3", "node": "n2", "rank": 1, "stopped": False}


def test_the_fence_stops_the_step_once_another_runner_holds_its_lease(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lease = tmp_path / "out" / ".marinbuild" / "lease"
    lease.parent.mkdir(parents=True)
    mine, theirs = Owner.current(nonce="mine"), Owner.current(nonce="theirs")
    lease.write_text(LeaseRecord(mine, 1.0, 1.0).to_json())
    spec = _spec(tmp_path, "sleep 60", lease_path=str(lease), owner=dict(vars(mine)), heartbeat=0.2, expiry=10.0)
    monkeypatch.setenv("SLURM_PROCID", "0")
    threading.Timer(0.5, lambda: lease.write_text(LeaseRecord(theirs, 2.0, 2.0).to_json())).start()
    began = time.monotonic()
    assert _task(str(Path(spec.folder) / "spec.json")) == 1
    assert time.monotonic() - began < 30
    assert json.loads(Path(spec.folder, "exit-0.json").read_text())["error"] == "lease lost: another runner holds the step"
    os.remove(lease)
    again = _spec(tmp_path, "true", lease_path=str(lease), owner=dict(vars(mine)))
    assert _task(str(Path(again.folder) / "spec.json")) == 1  # no lease at all: the step never starts
    assert json.loads(Path(again.folder, "exit-0.json").read_text())["error"] == "lease lost before the step started"


def test_a_node_stopped_while_its_step_runs_says_so_in_its_exit_file(tmp_path: Path) -> None:
    """srun stops the other ranks when one fails: their exits (SIGTERM, or 143 from a shell) are
    marked as stopped, so the failure named is the rank that failed first."""
    import signal
    import subprocess
    import sys

    spec = _spec(tmp_path, "echo started; sleep 60; echo never")
    env = {**os.environ, "SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURMD_NODENAME": "n1"}
    proc = subprocess.Popen([sys.executable, "-m", "marinbuild.backends.slurm.node", "task", str(Path(spec.folder) / "spec.json")],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    record = json.loads(Path(spec.folder, "exit-0.json").read_text())
    assert record["stopped"] is True and record["code"] != 0, record


def test_the_failure_named_is_the_rank_that_failed_first() -> None:
    """Slurm may signal a step's processes before its task, which then never hears a stop: rank
    0's 143 is unmarked, yet it ended after rank 1's exit 7, whose task's end made srun stop it."""
    exits: list[dict[str, Any]] = [{"rank": 0, "code": 143, "stopped": False, "ended": 20.5},
             {"rank": 1, "code": 7, "stopped": False, "ended": 20.1},
             {"rank": 2, "code": 0, "stopped": False, "ended": 19.0}]
    assert [e["rank"] for e in failures_first(exits)] == [1, 0]
    # A mark of a stop outweighs the times; records without a time (an earlier version's)
    # come after timed ones, a real exit status before a signal's.
    assert [e["rank"] for e in failures_first([{**exits[1], "stopped": True}, exits[0]])] == [0, 1]
    untimed: list[dict[str, Any]] = [{"rank": 0, "code": -15}, {"rank": 1, "code": 7}, {"rank": 3, "code": 1, "ended": 99.0}]
    assert [e["rank"] for e in failures_first(untimed)] == [3, 1, 0]
