"""The one step-retry loop, for every backend: causes, budgets, back-off and the attempt ledger.

A backend runs one attempt of a step and says how it ended (:class:`~marinbuild.backends.base.Cause`).
:class:`Retrying` wraps every backend (local, containers, Ray, TPU slices over SSH) and decides
what comes next from the cause alone:

========================  =====================================  ==================================
cause                     budget (a step's own setting wins)      example
========================  =====================================  ==================================
``FAILED``                ``max_retries_failure`` (run: 0)        the program exited 1
``PREEMPTED``             ``max_retries_preemption`` (100)        a TPU host vanished, GCE says so
``HANG``                  ``max_retries_hang`` (2)                no progress for ``progress_timeout``
``INFRA``                 ``max_retries_infra`` (2)               SSH refused, an upload failed
``PROVISIONING``          time: ``provision_timeout`` (3600 s)    no capacity for a queued resource
``TIMEOUT``/``CANCELLED`` never retried                           wall time spent, Ctrl-C
========================  =====================================  ==================================

Each attempt runs with ``MARINBUILD_ATTEMPT`` set to its number and ``MARINBUILD_PROGRESS``
naming the file it may touch to show progress. A retry waits out the one back-off policy
(:func:`backoff_delay`, a :class:`~marinbuild.store.retry.RetryPolicy`), and only the last
attempt's outcome reaches the scheduler. Every attempt is appended to the step's ledger
(:mod:`marinbuild.store.attempt_ledger`) with its ``cause``; the ledger's head carries the
``retries`` the run used of each budget, ``{"failure": {"used": 1, "max": 3}, ...}``.

Where the backend does not watch for hangs itself (``watches_progress``), the loop does: the
step's log and its progress file on this machine (:mod:`marinbuild.backends.progress`). What
the loop asks of a backend beyond ``start`` is declared, with defaults, on
:class:`~marinbuild.backends.base.BackendHooks`.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import HELD_EXTRA, PROGRESS_VAR, Backend, BackendHooks, Cause, Job, Outcome, hooks_of
from marinbuild.backends.progress import FileProgress, HangWatch
from marinbuild.backends.retry_budgets import BUDGET_NAMES, RetryBudgets
from marinbuild.store.attempt_ledger import LEDGER, AttemptLedger, ended_progress_note, iso_time, write_progress_note
from marinbuild.store.markers import status_path
from marinbuild.store.retry import RetryPolicy
from marinbuild.store.step_logs import LOG_NOTE_EXTRA, append_note, write_header

__all__ = [
    "ATTEMPT_VAR",
    "BUDGET_NAMES",
    "RETRY_BASE_DELAY_ENV",
    "RetryBudgets",
    "RetryCounter",
    "RetryDecision",
    "Retrying",
    "attempt_entry",
    "attempt_extras",
    "backend_label",
    "backoff_delay",
    "progress_file",
    "step_retry_policy",
    "with_retries",
]

ATTEMPT_VAR = "MARINBUILD_ATTEMPT"
RETRY_BASE_DELAY_ENV = "MARINBUILD_RETRY_BASE_DELAY"
_DEFAULT_BASE_DELAY_S = 5.0
_MAX_DELAY_S = 120.0


_VERBS = {
    Cause.FAILED: "failed",
    Cause.PREEMPTED: "was preempted",
    Cause.HANG: "hung",
    Cause.INFRA: "met infrastructure trouble",
    Cause.PROVISIONING: "got no hosts",
}


def step_retry_policy(base: float | None = None) -> RetryPolicy:
    """The back-off between attempts of a step: doubling from ``base``, capped at 120 s, half jittered.

    The base is ``$MARINBUILD_RETRY_BASE_DELAY`` (default 5 s). The same policy class as the
    store's retries, with a step's patience: many steps failing together do not all come back
    at the same instant.
    """
    if base is None:
        base = float(os.environ.get(RETRY_BASE_DELAY_ENV, _DEFAULT_BASE_DELAY_S))
    return RetryPolicy(base=base, cap=_MAX_DELAY_S, floor=0.5)


def backoff_delay(retry: int, base: float | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based) of a step; see :func:`step_retry_policy`."""
    return step_retry_policy(base).delay(retry)


@dataclass(frozen=True)
class RetryDecision:
    """What follows an attempt: another one after ``delay`` seconds, or the end (``why``)."""

    retry: bool
    cause: Cause
    delay: float = 0.0
    used: int = 0
    """Retries of this cause so far, this one included when it is a retry."""
    why: str = ""


class RetryCounter:
    """What one run of a step has used of each budget, and the decision after each attempt.

    >>> c = RetryCounter(RetryBudgets(failure=1), rng=lambda: 0.0)
    >>> c.decide(Cause.FAILED, started=0, now=1).retry
    True
    >>> d = c.decide(Cause.FAILED, started=2, now=3)
    >>> d.retry, d.why
    (False, 'failure budget spent (1/1)')
    """

    def __init__(self, budgets: RetryBudgets, policy: RetryPolicy | None = None,
                 rng: Callable[[], float] | None = None) -> None:
        self.budgets = budgets
        self.policy = policy or step_retry_policy()
        self.rng = rng
        self.used: dict[str, int] = dict.fromkeys(BUDGET_NAMES.values(), 0)
        self.provisioning_since: float | None = None

    def decide(self, cause: Cause, *, started: float, now: float, fatal: bool = False) -> RetryDecision:
        """Count an attempt that ended with ``cause`` and say whether another may follow."""
        if cause is not Cause.PROVISIONING:
            self.provisioning_since = None  # a new wait for hosts starts its own clock
        name = BUDGET_NAMES.get(cause)
        if name is None:
            return RetryDecision(False, cause, why="" if cause is Cause.SUCCESS else cause.value.lower())
        if fatal:
            return RetryDecision(False, cause, used=self.used[name], why="no retry can help")
        used = self.used[name] + 1
        delay = self.policy.delay(used, self.rng) if self.rng is not None else self.policy.delay(used)
        if cause is Cause.PROVISIONING:
            since = self.provisioning_since = self.provisioning_since if self.provisioning_since is not None else started
            limit = self.budgets.provision_timeout
            if now + delay - since > limit:
                return RetryDecision(False, cause, used=self.used[name],
                                     why=f"no hosts within provision_timeout ({limit:g} s)")
        else:
            budget = self.budgets.of(cause) or 0
            if used > budget:
                return RetryDecision(False, cause, used=self.used[name],
                                     why=f"{name} budget spent ({self.used[name]}/{budget})")
        self.used[name] = used
        return RetryDecision(True, cause, delay, used)

    def give_back(self, cause: Cause) -> None:
        """Uncount the retry :meth:`decide` just granted for ``cause``: something else ruled it out."""
        name = BUDGET_NAMES.get(cause)
        if name is not None and self.used[name] > 0:
            self.used[name] -= 1

    def summary(self) -> dict[str, dict[str, Any]]:
        """``{"failure": {"used": 1, "max": 3}, ...}``; provisioning's ``max`` is None, its bound ``timeout_s``."""
        out: dict[str, dict[str, Any]] = {}
        for cause, name in BUDGET_NAMES.items():
            if cause is Cause.PROVISIONING:
                out[name] = {"used": self.used[name], "max": None, "timeout_s": self.budgets.provision_timeout}
            else:
                out[name] = {"used": self.used[name], "max": self.budgets.of(cause)}
        return out


def backend_label(backend: Any) -> str:
    """A short name for the backend that ran an attempt (its :attr:`BackendHooks.label`: local,
    container, ray, tpu, slurm), looked for through wrappers that pass jobs to an ``inner`` one."""
    seen = 0
    while not isinstance(backend, BackendHooks) and hasattr(backend, "inner") and seen < 8:
        backend, seen = backend.inner, seen + 1
    if isinstance(backend, BackendHooks):
        return backend.label
    return type(backend).__name__.lower().removesuffix("backend") or "local"


def attempt_extras(extra: Mapping[str, Any] | None, backend: str) -> dict[str, Any]:
    """The fields every ledger entry carries beside its outcome: what it held, the backend, the runner."""
    held = (extra or {}).get(HELD_EXTRA)
    return {"held": dict(held) if isinstance(held, Mapping) else None, "backend": backend, "runner": socket.gethostname()}


def attempt_entry(number: int, outcome: Outcome, host: str | None = None) -> dict[str, Any]:
    """The ledger entry of one attempt that ended with ``outcome``."""
    kind = outcome.kind
    return {
        "attempt": number,
        "class": kind.value,
        "cause": BUDGET_NAMES.get(kind, kind.value.lower()),
        "exit_code": outcome.returncode if outcome.returncode is not None else (0 if outcome.ok else None),
        "started_at": iso_time(outcome.started),
        "ended_at": iso_time(outcome.ended),
        "duration_s": round(outcome.ended - outcome.started, 3),
        "host": host or outcome.host or socket.gethostname(),
        "message": outcome.error or "",
        **outcome.details,
    }


def progress_file(job: Job) -> str:
    """The file a step on this machine touches to show progress: beside its log, per step."""
    return os.path.join(os.path.dirname(job.log_file), "progress")


BudgetOf = Callable[[str], "int | RetryBudgets"]


def announces_start(backend: Backend) -> bool:
    """Whether ``backend``'s attempts rewrite the step's ``RUNNING`` status where they run
    (:attr:`BackendHooks.announces_start`), looked through the retry loop around it."""
    inner = backend.inner if isinstance(backend, Retrying) else backend
    return hooks_of(inner).announces_start


class Retrying:
    """A backend that runs each job until it succeeds or the budget of how it ended is spent.

    ``budget_of(name)`` gives the step's :class:`RetryBudgets` (an int: the failure budget
    alone, the others at their defaults). ``tally``, when given, receives what each step that
    retried or failed used of its budgets, by step name, as its last attempt ends (the run's
    summary shows it).
    """

    def __init__(self, inner: Backend, budget_of: BudgetOf, tally: dict[str, dict[str, Any]] | None = None) -> None:
        self.inner = inner
        self.budget_of = budget_of
        self.tally = tally

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _StepRun:
        run = _StepRun(self, job, on_done)
        run.launch()
        return run


class _StepRun:
    """One step across its attempts; cancelling it stops the current attempt and any retry."""

    def __init__(self, owner: Retrying, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.owner = owner
        self.inner = owner.inner
        self.job = job
        self.on_done = on_done
        budgets = owner.budget_of(job.name)
        self.counter = RetryCounter(budgets if isinstance(budgets, RetryBudgets) else RetryBudgets(failure=budgets))
        self.hooks = hooks_of(self.inner)
        head = dict(self.hooks.ledger_head(job))
        self.ledger = AttemptLedger(job.output_path, job.name, head=head, previous=job.previous_attempts,
                                    lost=job.lost_attempt)
        self.backend = backend_label(self.inner)
        self.first_start: float | None = None
        self.deadline = time.monotonic() + job.timeout if job.timeout is not None else None
        self._lock = threading.Lock()
        self._handle: Any = None
        self._reason: str | None = None
        self._hung_at: float | None = None
        self._watch: HangWatch | None = None
        self._ended_attempt = 0
        self._waiting = threading.Event()  # set to end a back-off early
        self._log_note = str(job.extra.get(LOG_NOTE_EXTRA) or "")

    def launch(self) -> None:
        number = self.ledger.next_number
        job = self.job
        timeout = job.timeout
        if self.deadline is not None:
            timeout = max(0.001, self.deadline - time.monotonic())  # wall time covers every attempt
        progress = progress_file(job)
        job = dataclasses.replace(
            job, attempt=number, timeout=timeout,
            walltime=job.walltime if job.walltime is not None else job.timeout,
            env={**job.env, ATTEMPT_VAR: str(number), PROGRESS_VAR: progress},
            retries=self.counter.summary(),  # a last attempt adds nothing to them
        )
        write_header(job.log_file, number, self.hooks.header_host(job), self.backend)
        if self._log_note:  # the run's first attempt: how it found its output folder
            append_note(job.log_file, self._log_note)
            self._log_note = ""
        with self._lock:
            self._hung_at = None
            self._handle = None  # the last attempt's: a hang of this one must not cancel it
        if job.progress_timeout is not None and not self.hooks.watches_progress(job):
            self._watch = self._hang_watch(job, number, job.progress_timeout)
        handle = self.inner.start(job, lambda outcome: self._attempt_done(number, outcome))
        with self._lock:
            self._handle = handle
            reason, hung_at = self._reason, self._hung_at
        if reason is not None:
            handle.cancel(reason)
        elif hung_at is not None and job.progress_timeout is not None:  # hung before it was even started
            handle.cancel(_hang_error(hung_at, job.progress_timeout))

    def _hang_watch(self, job: Job, number: int, timeout: float) -> HangWatch:
        """Watch attempt ``number`` of ``job`` for a hang: its log and progress file standing still."""
        out, progress = job.output_path, progress_file(job)
        return HangWatch(
            timeout, FileProgress([job.log_file, progress]).changed,
            lambda last: self._hung(job, number, last, timeout), name=f"progress-{job.name}",
            on_moved=lambda last: write_progress_note(out, number, last, timeout),
            # Queued elsewhere: the clock starts when the attempt rewrites the step's RUNNING
            # marker (or shows progress), not at submission.
            started=(FileProgress([status_path(out), job.log_file, progress]).changed
                     if self.hooks.announces_start else None),
        )

    def _hung(self, job: Job, number: int, last: float, timeout: float) -> None:
        if self.hooks.requeued(job):
            # Its worker is gone and it waits to run again (Ray reruns a task whose worker it
            # lost, Slurm requeues a job): no hang yet, and the clock waits for it to start again.
            append_note(self.job.log_file, f"marinbuild: attempt {number} waits to run (its worker was lost, or "
                                           "it waits in its cluster's queue); no hang is counted while it waits")
            with self._lock:
                if self._reason is None and self._ended_attempt < number:
                    self._watch = self._hang_watch(job, number, timeout)
            return
        with self._lock:
            if self._reason is not None:
                return
            self._hung_at = last
            handle = self._handle
        when = time.strftime("%H:%M:%S", time.localtime(last))
        append_note(self.job.log_file, f"marinbuild: attempt {number}: no progress for {timeout:g} s "
                                 f"(log and ${PROGRESS_VAR} unchanged since {when}); killing it as a hang")
        if handle is not None:
            handle.cancel(_hang_error(last, timeout))

    def _attempt_done(self, number: int, outcome: Outcome) -> None:
        with self._lock:
            self._ended_attempt = number  # a hang watch restarted from now on would outlive it
            watch = self._watch
        if watch is not None:
            watch.stop()
        if self.first_start is None:
            self.first_start = outcome.started
        with self._lock:
            reason, hung_at = self._reason, self._hung_at
        if hung_at is not None and reason is None and not outcome.ok:
            assert self.job.progress_timeout is not None
            outcome = dataclasses.replace(
                outcome, cause=Cause.HANG, cancelled=False, error=_hang_error(hung_at, self.job.progress_timeout),
                details={**outcome.details, "last_progress_at": iso_time(hung_at)},
            )
        cause = Cause.CANCELLED if reason is not None and not outcome.ok and not outcome.timed_out else outcome.kind
        if cause is Cause.CANCELLED and outcome.cause not in (None, Cause.CANCELLED):
            outcome = dataclasses.replace(outcome, cause=Cause.CANCELLED, cancelled=True)
        decision = self.counter.decide(cause, started=outcome.started, now=outcome.ended, fatal=outcome.fatal)
        if decision.retry and self.deadline is not None and time.monotonic() + decision.delay >= self.deadline:
            self.counter.give_back(cause)  # no retry follows: none is counted
            decision = dataclasses.replace(decision, retry=False, used=decision.used - 1,
                                           why="its wall time would pass during the back-off")
        entry = {**attempt_extras(self.job.extra, self.backend), **attempt_entry(number, outcome)}
        self.ledger.head["retries"] = self.counter.summary()
        if not decision.retry:
            self._finish(entry, outcome, decision)
            return
        try:
            self.ledger.append(entry)
        except Exception as e:  # a ledger that cannot be written must not hide the outcome
            append_note(self.job.log_file, f"marinbuild: could not write {LEDGER}: {type(e).__name__}: {e}")
        name = BUDGET_NAMES[cause]
        append_note(
            self.job.log_file,
            f"marinbuild: attempt {number} {_VERBS[cause]} ({outcome.error}); "
            f"{name} retry {decision.used} {_budget_text(self.counter, cause)} in {decision.delay:.1f} s",
        )
        threading.Thread(target=self._retry_after, args=(cause, decision.delay), daemon=True,
                         name=f"retry-{self.job.name}").start()

    def _finish(self, entry: dict[str, Any], outcome: Outcome, decision: RetryDecision) -> None:
        # The last attempt: its entry is written with the step's record, in the same round
        # trip as the info JSON (attempt_commit.commit), not one before it.
        self.ledger.entries.append(entry)
        # Before the ledger is written: what the step held until its end (a queued resource
        # whose delete failed at its attempt's end) is let go, and its entry amended.
        waited = self._step_ended(retried=any(self.counter.used.values()) or not outcome.ok)
        records = {**outcome.records, self.ledger.path: self.ledger.text()}
        if self.job.progress_timeout is not None or self.hooks.watches_progress(self.job):
            records.update(ended_progress_note(self.job.output_path))  # with the record: no round trip of its own
        changes: dict[str, Any] = {"records": records, "retries": self.counter.summary(), "capacity_wait": waited}
        if decision.why and decision.cause not in (Cause.FAILED, Cause.CANCELLED, Cause.TIMEOUT, Cause.SUCCESS):
            changes["error"] = f"{outcome.error or decision.cause.value} ({decision.why})"
        if self.first_start is not None and self.first_start < outcome.started:
            changes["started"] = self.first_start
        # The attempt's handle and hang watch refer back to this run: let them go, or each
        # step would leave a cycle of some forty objects for the collector.
        self._handle = None
        self._watch = None
        self.on_done(dataclasses.replace(outcome, **changes))

    def _step_ended(self, retried: bool) -> float:
        """Lets the backend end the step; the seconds it waited for machines made for it."""
        tally = self.owner.tally
        if tally is not None and retried:
            tally[self.job.name] = self.counter.summary()
        waited = 0.0
        try:
            self.hooks.step_ended(self.job)
            waited = self.hooks.capacity_wait(self.job)
            self.hooks.amend_ledger(self.job, self.ledger.entries)
        except Exception:  # per-step cleanup must not keep the outcome from the scheduler
            traceback.print_exc()
        return waited

    def _retry_after(self, cause: Cause, delay: float) -> None:
        self._waiting.wait(delay)
        with self._lock:
            reason = self._reason
        if reason is not None:
            # Cancelled during the back-off: the retry never ran, so it is not counted (as one
            # the wall time rules out), and the ledger's head says so.
            self.counter.give_back(cause)
            self.ledger.head["retries"] = self.counter.summary()
            now = time.time()
            outcome = Outcome(ok=False, started=self.first_start or now, ended=now, error=reason, cancelled=True)
            self._step_ended(retried=True)
            self.on_done(dataclasses.replace(outcome, records={self.ledger.path: self.ledger.text()},
                                             retries=self.counter.summary()))
            return
        _launcher.submit(self._relaunch)

    def _relaunch(self) -> None:
        try:
            self.launch()
        except Exception as e:  # a retry that cannot even start still ends the step, never leaves it waiting
            now = time.time()
            self.ledger.head["retries"] = self.counter.summary()
            self._step_ended(retried=True)
            self.on_done(Outcome(ok=False, started=self.first_start or now, ended=now,
                                 error=f"retry could not start: {type(e).__name__}: {e}",
                                 records={self.ledger.path: self.ledger.text()}))

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
            handle = self._handle
        self._waiting.set()
        if self._watch is not None:
            self._watch.stop()
        if handle is not None:
            handle.cancel(reason)


def _hang_error(last: float, timeout: float) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last))
    return f"hang: no progress for {timeout:g} s (last moved at {when})"


def _budget_text(counter: RetryCounter, cause: Cause) -> str:
    if cause is Cause.PROVISIONING:
        return f"(within {counter.budgets.provision_timeout:g} s)"
    return f"of {counter.budgets.of(cause)}"


class _Launcher:
    """One long-lived thread that starts every retry.

    A forked step's death signal (``PR_SET_PDEATHSIG``, which kills it when its runner dies)
    follows the *thread* that forked it, not the process: a retry forked from the thread
    that waited out its back-off would be killed the moment that thread ended.
    """

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, launch: Callable[[], None]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="marinbuild-retries", daemon=True)
                self._thread.start()
        self._jobs.put(launch)

    def _run(self) -> None:
        while True:
            launch = self._jobs.get()
            try:
                launch()
            except Exception:  # one retry that cannot start must not stop the others
                traceback.print_exc()


_launcher = _Launcher()


def with_retries(
    backend: Backend,
    backend_for: Callable[[Any], Backend] | None,
    budget_of: BudgetOf,
    tally: dict[str, dict[str, Any]] | None = None,
) -> tuple[Backend, Callable[[Any], Backend]]:
    """``backend`` and ``backend_for`` with every backend wrapped in :class:`Retrying`, once each."""
    wrapped: dict[int, Backend] = {}

    def wrap(b: Backend) -> Backend:
        if id(b) not in wrapped:
            wrapped[id(b)] = Retrying(b, budget_of, tally)
        return wrapped[id(b)]

    choose = backend_for or (lambda node: backend)
    return wrap(backend), lambda node: wrap(choose(node))
