"""TPU attempts under the one retry loop: the per-attempt hook, provisioning by time, bad input up front."""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import pytest

from marinbuild.backends.base import Cause, Job, Outcome
from marinbuild.backends.retrying import RetryBudgets, Retrying
from marinbuild.backends.tpu.attempts import (
    AttemptCancel,
    ProvisioningFailed,
    TpuAttempt,
    TpuAttempts,
    TpuJob,
    TpuStep,
    cut_short,
    run_tpu_step,
)
from marinbuild.backends.tpu.cluster import parse_cluster
from marinbuild.backends.tpu.gang_outcome import HostOutcome
from marinbuild.errors import ClusterConfigError, StepDefinitionError

CLUSTER = parse_cluster({
    "slices": [
        {"name": "a", "tpu_type": "v4-16", "hosts": ["127.0.0.1:1", "127.0.0.1:2"]},
        {"name": "b", "tpu_type": "v4-8", "hosts": ["127.0.0.1:3"]},
    ]
})


def test_bad_input_is_refused_before_any_host_is_touched(tmp_path: Path) -> None:
    def make(**kw: object) -> TpuStep:
        job = TpuJob(name="s", output_path=str(tmp_path), command="true", **kw)  # type: ignore[arg-type]
        return TpuStep(job, CLUSTER, packed=None, staging_dir=str(tmp_path), console=lambda line: None)

    with pytest.raises(ClusterConfigError, match="no slice named 'nope'"):
        make(slices=("nope",))
    with pytest.raises(ClusterConfigError, match="equal host counts"):
        make(slices=("a", "b"))
    with pytest.raises(StepDefinitionError, match="step 's'"):
        make(slices=("b",), env={"BAD NAME": "x"})


def test_an_attempt_becomes_an_outcome_with_its_cause_and_its_hosts(tmp_path: Path) -> None:
    job = TpuJob(name="s", output_path=str(tmp_path), command="true", slices=("b",), env={"TOKEN": "sekrit"})
    step = TpuStep(job, CLUSTER, packed=None, staging_dir=str(tmp_path), console=lambda line: None)
    hosts = (HostOutcome("127.0.0.1:3", 0, 0, exit_code=None, torn_down=True),)
    attempt = TpuAttempt(4, Cause.HANG, 10.0, 12.0, None, "hang: no progress", hosts, last_progress_at=10.5)
    outcome = step.outcome_of(attempt)
    assert (outcome.ok, outcome.kind, outcome.fatal) == (False, Cause.HANG, False)
    assert outcome.error == "attempt 4 HANG: hang: no progress"
    assert outcome.details["held"]["tpu_chips"] == 4 and outcome.details["hosts"][0]["torn_down"] is True
    assert outcome.details["last_progress_at"].startswith("1970-01-01T00:00:10.500")
    assert step.ledger_head()["env"] == {"TOKEN": "***"}


class _CapacityFirst(TpuAttempts):
    """An attempt hook whose hosts cannot be had the first ``shortages`` times (as a queued resource FAILED)."""

    def __init__(self, step: TpuStep, shortages: int) -> None:
        super().__init__(lambda job: step)
        self.shortages = shortages
        self.seen: list[int] = []

    def run_attempt(self, step: TpuStep, job: Job, cancel: threading.Event) -> Outcome:
        self.seen.append(job.attempt)
        started = time.time()
        if len(self.seen) <= self.shortages:
            raise ProvisioningFailed(f"queued resource FAILED: no capacity (try {len(self.seen)})")
        return Outcome(ok=True, started=started, ended=time.time(), cause=Cause.SUCCESS)


def test_the_hook_reports_capacity_shortages_as_provisioning_retried_apart_from_failures(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    job = TpuJob(name="s", output_path=str(tmp_path / "out"), command="true", slices=("b",))
    step = TpuStep(job, CLUSTER, packed=None, staging_dir=str(tmp_path), console=lambda line: None)

    hook = _CapacityFirst(step, shortages=3)
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    plain = Job(name="s", output_path=job.output_path, log_file=str(tmp_path / "step.log"), workdir=".", env={})
    Retrying(hook, lambda name: RetryBudgets(failure=0, provision_timeout=60)).start(plain, done.put)
    outcome = done.get(timeout=20)
    assert outcome.ok and hook.seen == [1, 2, 3, 4]
    ledger = json.loads(outcome.records[str(tmp_path / "out" / "attempts.json")])
    assert [a["class"] for a in ledger["attempts"]] == ["PROVISIONING"] * 3 + ["SUCCESS"]
    assert ledger["retries"]["provisioning"]["used"] == 3 and ledger["retries"]["failure"]["used"] == 0


class _Misconfigured(_CapacityFirst):
    def run_attempt(self, step: TpuStep, job: Job, cancel: threading.Event) -> Outcome:
        self.seen.append(job.attempt)
        raise ClusterConfigError("cluster.toml: [gcp]: no such zone 'mars-1'")


def test_a_hook_that_raises_ends_the_step_with_one_line_and_no_retry(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    (tmp_path / "out").mkdir()
    job = TpuJob(name="s", output_path=str(tmp_path / "out"), command="true", slices=("b",), budgets=RetryBudgets(failure=5))
    step = TpuStep(job, CLUSTER, packed=None, staging_dir=str(tmp_path), console=lambda line: None)
    hook = _Misconfigured(step, shortages=0)
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    plain = Job(name="s", output_path=job.output_path, log_file=str(tmp_path / "step.log"), workdir=".", env={})
    Retrying(hook, lambda name: job.budgets).start(plain, done.put)
    outcome = done.get(timeout=20)
    assert not outcome.ok and hook.seen == [1]
    assert outcome.error == "cluster.toml: [gcp]: no such zone 'mars-1'"


def test_run_tpu_step_refuses_an_unknown_slice_before_any_host_is_touched(tmp_path: Path) -> None:
    job = TpuJob(name="s", output_path=str(tmp_path), command="true", slices=("nope",))
    with pytest.raises(ClusterConfigError):
        run_tpu_step(job, CLUSTER, workdir=None, cancel=threading.Event(), console=lambda line: None)


def test_only_a_cancel_other_than_the_wall_time_cuts_an_attempt_short() -> None:
    plain = threading.Event()
    assert not cut_short(plain)
    plain.set()
    assert cut_short(plain)  # a runner stopping waits only so long
    timed = AttemptCancel()
    timed.timed_out = True
    timed.set()
    assert not cut_short(timed)  # the run goes on: the usual patience
