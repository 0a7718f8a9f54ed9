"""The TPU backend: classification rules, retries and attempts.json, and a real multi-host JAX run."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
from pathlib import Path

import pytest

from marinbuild.backends.retrying import RetryBudgets
from marinbuild.backends.tpu.attempts import backoff_delay, host_env
from marinbuild.backends.tpu.preemption import (
    AttemptClass,
    HostObservation,
    classify_attempt,
    parse_metadata_answer,
)
from tests.fixtures_ssh import FakeFleet, live_processes_matching, pids_with_env, run_job, wait_for

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tpu"


# -- pure rules -----------------------------------------------------------------------------


def obs(exit_code: int | None = 0, **kw: object) -> HostObservation:
    return HostObservation("h", exit_code, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("hosts", "cancelled", "expected"),
    [
        ([obs(0), obs(0)], False, AttemptClass.SUCCESS),
        ([obs(0), obs(1)], False, AttemptClass.FAILED),
        ([obs(137), obs(1, metadata_preempted=True)], False, AttemptClass.PREEMPTED),
        # a sibling that died in the cascade does not make it a user failure
        ([obs(1), obs(None, connection_lost=True, reachable=False)], False, AttemptClass.PREEMPTED),
        ([obs(None, reachable=False)], False, AttemptClass.PREEMPTED),
        # never answered SSH (a wrong port, a down host): infrastructure, not a preemption...
        ([obs(None, reachable=False, unreached=True)], False, AttemptClass.INFRA),
        # ...unless GCE says it was preempted, or it answered in an earlier attempt
        ([obs(None, reachable=False, unreached=True, metadata_preempted=True)], False, AttemptClass.PREEMPTED),
        ([obs(None, reachable=False, unreached=True, answered_before=True)], False, AttemptClass.PREEMPTED),
        ([obs(None, infra_error="h: unknown host key")], False, AttemptClass.INFRA),
        ([obs(0), obs(None, connection_lost=True, reachable=True)], False, AttemptClass.INFRA),
        ([obs(0), obs(1, metadata_preempted=False)], False, AttemptClass.FAILED),
        ([obs(1, metadata_preempted=True)], True, AttemptClass.CANCELLED),
        ([], False, AttemptClass.INFRA),
    ],
)
def test_classification(hosts: list[HostObservation], cancelled: bool, expected: AttemptClass) -> None:
    assert classify_attempt(hosts, cancelled=cancelled) is expected


def test_metadata_answers_and_env_layout() -> None:
    assert parse_metadata_answer("TRUE") is True
    assert parse_metadata_answer("FALSE\n") is False
    assert parse_metadata_answer("<html>404</html>") is None
    env = host_env(slice_index=2, worker_index=3, num_slices=3, workers_per_slice=4,
                   coordinator_host="10.0.0.2", coordinator_port=8476, megascale_port=8081,
                   output_path="gs://b/o", attempt=5)
    assert env["MARINBUILD_PROCESS_ID"] == "11" and env["MARINBUILD_NUM_PROCESSES"] == "12"
    assert env["MEGASCALE_SLICE_ID"] == "2" and env["MEGASCALE_NUM_SLICES"] == "3"
    assert env["MARINBUILD_COORDINATOR_ADDRESS"] == "10.0.0.2:8476"
    single = host_env(slice_index=0, worker_index=0, num_slices=1, workers_per_slice=1,
                      coordinator_host="h", coordinator_port=1, megascale_port=2, output_path="/o", attempt=1)
    assert not any(k.startswith("MEGASCALE") for k in single)


def test_backoff_doubles_with_jitter_and_a_cap() -> None:
    for retry in range(1, 6):
        d = backoff_delay(retry, base=1.0)
        assert 0.5 * 2 ** (retry - 1) <= d <= 2 ** (retry - 1)
    assert backoff_delay(50, base=1.0) <= 120.0


# -- against fake hosts ---------------------------------------------------------------------


def test_jax_example_rendezvous_across_four_hosts(fleet: FakeFleet, tmp_path: Path) -> None:
    result = run_job(
        fleet, tmp_path, [("pod", "v4-32", [0, 1, 2, 3])],
        f"{sys.executable} train.py",
        env={"JAX_PLATFORMS": "cpu", "TRAIN_INIT_TIMEOUT": "60"},
        workdir=str(EXAMPLE),
    )
    assert result.status == "SUCCESS", result.error
    gathered = json.loads((tmp_path / "out" / "result.json").read_text())
    assert gathered["process_count"] == 4
    assert gathered["process_ids"] == [0, 1, 2, 3]
    assert gathered["backend"] == "cpu"
    log = (tmp_path / "out" / "logs" / "slice_00_worker_03.log").read_text()
    assert "process 3/4: gathered [0, 1, 2, 3]" in log


def test_preemption_is_retried_and_both_attempts_recorded(fleet: FakeFleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    victim = fleet.hosts[1]

    def preempt() -> None:
        wait_for(lambda: len(list(out.glob("started_*"))) == 2)
        victim.set_preempted(True)
        for pid in pids_with_env(f"FAKE_HOST_ID={victim.index}", f"HOME={victim.home}", "MARINBUILD_ATTEMPT=1"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    t = threading.Thread(target=preempt)
    t.start()
    command = (
        'echo "$MARINBUILD_ATTEMPT $MARINBUILD_OUTPUT" >> "$MARINBUILD_OUTPUT/seen_$FAKE_HOST_ID"; '
        'if [ "$MARINBUILD_ATTEMPT" = 1 ]; then touch "$MARINBUILD_OUTPUT/started_$FAKE_HOST_ID"; exec sleep 3031; fi'
    )
    result = run_job(fleet, tmp_path, [("pair", "v4-16", [0, 1])], command,
                     ssh={"hygiene_command": 'echo ran >> "$HOME/hygiene.count"'})
    t.join()
    assert result.status == "SUCCESS", result.error
    assert [a.classification for a in result.attempts] == ["PREEMPTED", "SUCCESS"]
    assert result.attempts[0].preempted_hosts == (victim.entry,)
    assert live_processes_matching("sleep 3031") == []
    assert all(not h.survivors for a in result.attempts for h in a.hosts)
    record = json.loads((out / "attempts.json").read_text())
    assert [(a["attempt"], a["class"]) for a in record["attempts"]] == [(1, "PREEMPTED"), (2, "SUCCESS")]
    first = record["attempts"][0]
    assert first["preempted_hosts"] == [victim.entry]
    assert set(first["exit_codes"]) == {fleet.hosts[0].entry, victim.entry}
    assert first["started_at"] <= first["ended_at"] <= record["attempts"][1]["started_at"]
    # The same output path in both attempts; hygiene before each attempt on each host.
    assert (out / "seen_0").read_text() == f"1 {out}\n2 {out}\n"
    for h in fleet.hosts[:2]:
        assert (h.home / "hygiene.count").read_text() == "ran\nran\n"
    log = (out / "logs" / "slice_00_worker_01.log").read_text()
    assert "attempt 1" in log and "attempt 2" in log


def test_failure_budget_and_numbering_across_runs(fleet: FakeFleet, tmp_path: Path) -> None:
    flaky = 'echo "$MARINBUILD_ATTEMPT" >> "$MARINBUILD_OUTPUT/tries"; [ "$MARINBUILD_ATTEMPT" -ge 2 ]'
    ok = run_job(fleet, tmp_path, [("one", "v4-8", [0])], flaky, budgets=RetryBudgets(failure=1))
    assert ok.status == "SUCCESS", ok.error
    assert [a.classification for a in ok.attempts] == ["FAILED", "SUCCESS"]
    failing = run_job(fleet, tmp_path, [("one", "v4-8", [0])], "exit 3", budgets=RetryBudgets(failure=1))
    assert failing.status == "FAILED"
    assert [a.number for a in failing.attempts] == [3, 4]  # continues the step's record
    assert "exited 3" in (failing.error or "")
    record = json.loads((tmp_path / "out" / "attempts.json").read_text())
    assert [a["class"] for a in record["attempts"]] == ["FAILED", "SUCCESS", "FAILED", "FAILED"]


def test_preemption_budget_is_separate(fleet: FakeFleet, tmp_path: Path) -> None:
    fleet.hosts[0].set_preempted(True)
    result = run_job(fleet, tmp_path, [("one", "v4-8", [0])], "exit 1",
                     budgets=RetryBudgets(preemption=2, failure=0))
    assert result.status == "PREEMPTED"
    assert [a.classification for a in result.attempts] == ["PREEMPTED"] * 3
    assert "preemption budget" in (result.error or "")
