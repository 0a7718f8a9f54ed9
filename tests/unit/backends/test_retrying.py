"""The one retry loop: cause -> budget -> back-off decisions, the ledger it keeps, and its wiring."""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import threading
import time
from pathlib import Path

import pytest

from marinbuild.backends.base import BackendHooks, Cause, Job, Outcome
from marinbuild.backends.retrying import (
    ATTEMPT_VAR,
    RetryBudgets,
    RetryCounter,
    Retrying,
    attempt_entry,
    backoff_delay,
    step_retry_policy,
    with_retries,
)
from marinbuild.store.markers import RUNNING, write_status
from marinbuild.store.storage import Storage


def counter(**budgets: object) -> RetryCounter:
    return RetryCounter(RetryBudgets(**budgets), rng=lambda: 1.0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("cause", "budget", "name"),
    [(Cause.FAILED, "failure", "failure"), (Cause.PREEMPTED, "preemption", "preemption"),
     (Cause.HANG, "hang", "hang"), (Cause.INFRA, "infra", "infra")],
)
def test_each_cause_draws_on_its_own_budget_and_stops_when_it_is_spent(cause: Cause, budget: str, name: str) -> None:
    c = counter(**{budget: 2})
    decisions = [c.decide(cause, started=t, now=t + 1) for t in range(3)]
    assert [d.retry for d in decisions] == [True, True, False]
    assert [d.used for d in decisions] == [1, 2, 2]
    assert decisions[-1].why == f"{name} budget spent (2/2)"
    # The other budgets are untouched.
    assert {k: v["used"] for k, v in c.summary().items() if k != name} == dict.fromkeys(
        {"failure", "preemption", "hang", "infra", "provisioning"} - {name}, 0)


def test_causes_do_not_share_budgets() -> None:
    c = counter(failure=1, preemption=3, hang=1)
    seq = [Cause.PREEMPTED, Cause.FAILED, Cause.PREEMPTED, Cause.HANG, Cause.PREEMPTED]
    assert all(c.decide(cause, started=0, now=0).retry for cause in seq)
    assert not c.decide(Cause.FAILED, started=0, now=0).retry
    assert c.summary() == {
        "failure": {"used": 1, "max": 1},
        "preemption": {"used": 3, "max": 3},
        "hang": {"used": 1, "max": 1},
        "infra": {"used": 0, "max": 2},
        "provisioning": {"used": 0, "max": None, "timeout_s": 3600.0},
    }


@pytest.mark.parametrize("cause", [Cause.SUCCESS, Cause.CANCELLED, Cause.TIMEOUT])
def test_final_causes_are_never_retried(cause: Cause) -> None:
    assert not counter(failure=9).decide(cause, started=0, now=0).retry


def test_a_fatal_attempt_is_not_retried_whatever_the_budget() -> None:
    d = counter(infra=9).decide(Cause.INFRA, started=0, now=0, fatal=True)
    assert (d.retry, d.why) == (False, "no retry can help")


def test_provisioning_is_bounded_by_time_from_the_first_attempt_of_a_streak() -> None:
    c = RetryCounter(RetryBudgets(provision_timeout=100), policy=step_retry_policy(1.0), rng=lambda: 1.0)
    assert c.decide(Cause.PROVISIONING, started=10, now=20).retry
    assert c.decide(Cause.PROVISIONING, started=25, now=107).retry  # 97 s since 10, with the 2 s wait: 99
    d = c.decide(Cause.PROVISIONING, started=110, now=111)
    assert not d.retry and d.why == "no hosts within provision_timeout (100 s)"
    # A preemption in between starts a new wait for hosts with its own clock.
    c2 = RetryCounter(RetryBudgets(provision_timeout=100), policy=step_retry_policy(1.0), rng=lambda: 1.0)
    c2.decide(Cause.PROVISIONING, started=0, now=90)
    c2.decide(Cause.PREEMPTED, started=91, now=95)
    assert c2.decide(Cause.PROVISIONING, started=96, now=150).retry
    assert c2.summary()["provisioning"]["used"] == 2


def test_the_back_off_doubles_capped_and_half_jittered() -> None:
    policy = step_retry_policy(base=1.0)
    assert [policy.delay(n, lambda: 1.0) for n in (1, 2, 3)] == [1.0, 2.0, 4.0]
    assert [policy.delay(n, lambda: 0.0) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert policy.delay(50, lambda: 1.0) == 120.0
    for n in range(1, 6):
        assert 0.5 * 2 ** (n - 1) <= backoff_delay(n, base=1.0) <= 2 ** (n - 1)


def test_the_back_off_grows_with_each_causes_own_count() -> None:
    c = RetryCounter(RetryBudgets(failure=5, preemption=5), policy=step_retry_policy(1.0), rng=lambda: 1.0)
    delays = [c.decide(cause, started=0, now=0).delay for cause in (Cause.PREEMPTED, Cause.PREEMPTED, Cause.FAILED)]
    assert delays == [1.0, 2.0, 1.0]


def test_a_ledger_entry_names_its_class_and_cause() -> None:
    hung = Outcome(ok=False, started=0.0, ended=2.5, error="hang: no progress", cause=Cause.HANG,
                   details={"last_progress_at": "x"})
    entry = attempt_entry(3, hung, host="box")
    assert (entry["attempt"], entry["class"], entry["cause"], entry["duration_s"]) == (3, "HANG", "hang", 2.5)
    assert entry["last_progress_at"] == "x" and entry["host"] == "box"
    assert attempt_entry(1, Outcome(ok=True, started=0, ended=0))["cause"] == "success"
    assert attempt_entry(1, Outcome(ok=False, started=0, ended=0, timed_out=True))["class"] == "TIMEOUT"


class _Scripted(BackendHooks):
    """Ends each attempt as scripted (a cause per attempt), at once, from another thread."""

    def __init__(self, causes: list[Cause]) -> None:
        self.causes = causes
        self.jobs: list[Job] = []
        self.ended: list[str] = []

    def start(self, job: Job, on_done):  # type: ignore[no-untyped-def]
        self.jobs.append(job)
        cause = self.causes[len(self.jobs) - 1]
        now = time.time()
        outcome = Outcome(ok=cause is Cause.SUCCESS, started=now, ended=now,
                          error=None if cause is Cause.SUCCESS else cause.value.lower(), cause=cause)
        threading.Thread(target=on_done, args=(outcome,)).start()
        return self

    def cancel(self, reason: str) -> None:
        pass

    def step_ended(self, job: Job) -> None:
        self.ended.append(job.name)


def _job(tmp_path: Path) -> Job:
    return Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "logs" / "step.log"),
               workdir=str(tmp_path), env={}, command="true")


def test_the_loop_retries_by_cause_and_writes_the_ledger_with_the_last_outcome(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Scripted([Cause.PREEMPTED, Cause.INFRA, Cause.PREEMPTED, Cause.SUCCESS])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    Retrying(inner, lambda name: RetryBudgets(preemption=2, infra=1)).start(_job(tmp_path), done.put)
    outcome = done.get(timeout=10)
    assert outcome.ok
    assert [j.env[ATTEMPT_VAR] for j in inner.jobs] == ["1", "2", "3", "4"]
    assert all(j.env["MARINBUILD_PROGRESS"] == str(tmp_path / "logs" / "progress") for j in inner.jobs)
    assert inner.ended == ["s"]  # told once, after the last attempt
    ledger = json.loads(outcome.records[str(tmp_path / "out" / "attempts.json")])
    assert [a["cause"] for a in ledger["attempts"]] == ["preemption", "infra", "preemption", "success"]
    assert ledger["retries"]["preemption"] == {"used": 2, "max": 2}
    assert ledger["retries"]["infra"] == {"used": 1, "max": 1}
    assert outcome.retries == ledger["retries"]  # for the step's final status marker


def test_a_spent_budget_names_the_cause_in_the_error(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Scripted([Cause.PREEMPTED, Cause.PREEMPTED])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    Retrying(inner, lambda name: RetryBudgets(preemption=1)).start(_job(tmp_path), done.put)
    outcome = done.get(timeout=10)
    assert not outcome.ok and outcome.error == "preempted (preemption budget spent (1/1))"


def test_each_attempt_gets_what_is_left_of_the_wall_time_and_keeps_the_declared_one(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Scripted([Cause.PREEMPTED, Cause.SUCCESS])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    job = _job(tmp_path)
    Retrying(inner, lambda name: RetryBudgets(preemption=1)).start(dataclasses.replace(job, timeout=600.0), done.put)
    assert done.get(timeout=10).ok
    assert [j.walltime for j in inner.jobs] == [600.0, 600.0]
    assert all(j.timeout is not None and j.timeout <= 600.0 for j in inner.jobs)
    assert inner.jobs[1].timeout < inner.jobs[0].timeout  # type: ignore[operator]


def test_an_int_budget_is_the_failure_budget_alone(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Scripted([Cause.FAILED, Cause.FAILED, Cause.SUCCESS])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    Retrying(inner, lambda name: 1).start(_job(tmp_path), done.put)
    assert not done.get(timeout=10).ok
    assert len(inner.jobs) == 2


def test_with_retries_wraps_every_backend_once() -> None:
    a, b = _Scripted([]), _Scripted([])
    runner, backend_for = with_retries(a, lambda node: b if node == "tpu" else a, lambda name: 0)
    assert isinstance(runner, Retrying) and runner.inner is a
    assert backend_for("x") is runner
    assert backend_for("tpu") is backend_for("tpu") and backend_for("tpu").inner is b  # type: ignore[attr-defined]


class _BreaksOnRetry(_Scripted):
    def start(self, job: Job, on_done):  # type: ignore[no-untyped-def]
        if self.jobs:
            raise OSError(24, "Too many open files")
        return super().start(job, on_done)


def test_a_retry_that_cannot_start_ends_the_step_instead_of_leaving_it_waiting(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _BreaksOnRetry([Cause.FAILED])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    Retrying(inner, lambda name: 3).start(_job(tmp_path), done.put)
    outcome = done.get(timeout=10)
    assert not outcome.ok and outcome.error == "retry could not start: OSError: [Errno 24] Too many open files"
    assert inner.ended == ["s"]
    ledger = json.loads(outcome.records[str(tmp_path / "out" / "attempts.json")])
    assert [a["class"] for a in ledger["attempts"]] == ["FAILED"] and ledger["retries"]["failure"]["used"] == 1


def test_a_finished_local_step_leaves_no_reference_cycle_behind(tmp_path: Path) -> None:
    # Each step used to leave some forty objects in cycles (the run, its attempt's handle and
    # the callbacks between them) for the collector: at 10,000 steps, megabytes of peak memory.
    import gc

    from marinbuild.backends.local.backend import LocalBackend

    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for i in range(5):
            job = dataclasses.replace(_job(tmp_path), name=f"s{i}", output_path=str(tmp_path / f"out{i}"))
            done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
            Retrying(LocalBackend(), lambda name: RetryBudgets()).start(job, done.put)
            assert done.get(timeout=30).ok
            del done
        time.sleep(0.2)  # the reaper thread lets go of its last reference after the callback
        gc.collect()
        kept = [type(o).__name__ for o in gc.garbage if type(o).__name__ in ("_StepRun", "_LocalRun", "Job")]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert kept == []


class _Queued(BackendHooks):
    """Waits silently (queued for a node), rewrites the step's RUNNING marker as it starts, then
    stays silent for a while (``runs_s``) and succeeds."""

    def __init__(self, announces_start: bool, queued_s: float, runs_s: float = 0.0) -> None:
        self.announces_start = announces_start
        self.queued_s = queued_s
        self.runs_s = runs_s
        self.jobs: list[Job] = []
        self.cancelled: list[str] = []
        self._stop = threading.Event()

    def start(self, job: Job, on_done):  # type: ignore[no-untyped-def]
        self.jobs.append(job)

        def work() -> None:
            began = time.time()
            if self._stop.wait(self.queued_s):
                on_done(Outcome(ok=False, started=began, ended=time.time(), error="cancelled"))
                return
            write_status(Storage.for_prefix(os.path.dirname(job.output_path)), job.output_path, RUNNING, owner="node")
            if self._stop.wait(self.runs_s):
                on_done(Outcome(ok=False, started=began, ended=time.time(), error="cancelled"))
                return
            on_done(Outcome(ok=True, started=began, ended=time.time()))

        threading.Thread(target=work).start()
        return self

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)
        self._stop.set()


@pytest.mark.parametrize("announces_start", [True, False])
def test_time_queued_before_an_announced_start_is_not_a_hang(tmp_path: Path, monkeypatch, announces_start: bool) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Queued(announces_start, queued_s=1.0)  # five times the progress timeout
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    job = dataclasses.replace(_job(tmp_path), progress_timeout=0.2)
    Retrying(inner, lambda name: RetryBudgets(hang=0)).start(job, done.put)  # type: ignore[arg-type]
    outcome = done.get(timeout=20)
    if announces_start:
        assert outcome.ok and inner.cancelled == [] and len(inner.jobs) == 1
    else:  # the loop cannot tell waiting from wedged: the clock ran from submission
        assert not outcome.ok and outcome.cause is Cause.HANG and len(inner.cancelled) == 1


def test_an_attempt_silent_after_its_announced_start_is_a_hang(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _Queued(True, queued_s=0.6, runs_s=30.0)  # starts, then never shows progress
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    job = dataclasses.replace(_job(tmp_path), progress_timeout=0.2)
    Retrying(inner, lambda name: RetryBudgets(hang=0)).start(job, done.put)  # type: ignore[arg-type]
    outcome = done.get(timeout=20)
    assert not outcome.ok and outcome.cause is Cause.HANG and len(inner.cancelled) == 1


def test_a_retry_the_wall_time_rules_out_is_not_counted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "60")  # the back-off would outlast the wall time
    inner = _Scripted([Cause.FAILED, Cause.SUCCESS])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    job = dataclasses.replace(_job(tmp_path), timeout=20.0)
    Retrying(inner, lambda name: RetryBudgets(failure=2)).start(job, done.put)
    outcome = done.get(timeout=10)
    assert not outcome.ok and len(inner.jobs) == 1
    assert outcome.retries is not None and outcome.retries["failure"] == {"used": 0, "max": 2}
    ledger = json.loads(outcome.records[str(tmp_path / "out" / "attempts.json")])
    assert ledger["retries"]["failure"] == {"used": 0, "max": 2}


def test_a_retry_cancelled_during_its_back_off_is_not_counted(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "60")
    inner = _Scripted([Cause.PREEMPTED, Cause.SUCCESS])
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    run = Retrying(inner, lambda name: RetryBudgets(preemption=5)).start(_job(tmp_path), done.put)
    ledger_file = tmp_path / "out" / "attempts.json"
    deadline = time.monotonic() + 10
    while not ledger_file.exists() and time.monotonic() < deadline:  # the retry is granted, then waits
        time.sleep(0.01)
    run.cancel("interrupted")
    outcome = done.get(timeout=10)
    assert not outcome.ok and outcome.cancelled and len(inner.jobs) == 1
    assert outcome.retries is not None and outcome.retries["preemption"] == {"used": 0, "max": 5}
    ledger = json.loads(outcome.records[str(ledger_file)])
    assert ledger["retries"]["preemption"] == {"used": 0, "max": 5}
    assert [a["class"] for a in ledger["attempts"]] == ["PREEMPTED"]


class _LostAndRequeued(_Queued):
    """Starts, loses its worker (silence, ``requeued`` says so), waits, starts again and succeeds."""

    def __init__(self) -> None:
        super().__init__(True, queued_s=0.0)
        self.lost = threading.Event()

    def requeued(self, job: Job) -> bool:
        return self.lost.is_set()

    def start(self, job: Job, on_done):  # type: ignore[no-untyped-def]
        self.jobs.append(job)
        storage = Storage.for_prefix(os.path.dirname(job.output_path))

        def work() -> None:
            began = time.time()
            write_status(storage, job.output_path, RUNNING, owner="node-a")
            self.lost.set()
            if self._stop.wait(1.0):  # five progress timeouts in Ray's queue again
                on_done(Outcome(ok=False, started=began, ended=time.time(), error="cancelled"))
                return
            self.lost.clear()
            write_status(storage, job.output_path, RUNNING, owner="node-b")
            on_done(Outcome(ok=True, started=began, ended=time.time()))

        threading.Thread(target=work).start()
        return self


def test_an_attempt_whose_worker_was_lost_is_no_hang_while_it_waits_to_run_again(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.001")
    inner = _LostAndRequeued()
    done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
    job = dataclasses.replace(_job(tmp_path), progress_timeout=0.2)
    Retrying(inner, lambda name: RetryBudgets(hang=0)).start(job, done.put)  # type: ignore[arg-type]
    outcome = done.get(timeout=20)
    assert outcome.ok and inner.cancelled == [] and len(inner.jobs) == 1
    assert "its worker was lost, or it waits in its cluster's queue); no hang is counted" in (tmp_path / "logs" / "step.log").read_text()
