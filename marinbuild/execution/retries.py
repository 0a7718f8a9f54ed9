"""Retries of failed steps on every backend, and ``attempts.json``: one ledger for all of them.

:class:`Retrying` wraps a backend. Each attempt of a step runs with ``MARINBUILD_ATTEMPT``
set to its number; when it fails (not when it is cancelled or runs out of wall time) and the
step's failure budget (``max_retries_failure``, else the run's ``--retries``) allows, the
same job is started again after a short back-off, and only the last attempt's outcome
reaches the scheduler. Every attempt is appended to the step's ledger,
``OUTPUT/attempts.json``, whatever the backend::

    {"step": "train", "attempts": [
      {"attempt": 1, "class": "FAILED", "exit_code": 1, "started_at": "...", "ended_at": "...",
       "duration_s": 0.4, "host": "box", "message": "exit status 1"},
      {"attempt": 2, "class": "SUCCESS", "exit_code": 0, ...}]}

Attempt numbers go on across runs (the ledger is kept with the output, as a TPU step's is).
The TPU backend retries inside its gang loop (it tells preemptions from failures) and
writes its attempts through the same :class:`AttemptLedger`; it is not wrapped.
"""

from __future__ import annotations

import dataclasses
import json
import os
import queue
import random
import socket
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from marinbuild.backends.base import Backend, Job, Outcome
from marinbuild.errors import StorageError
from marinbuild.execution.accounting import attempt_extras, backend_label
from marinbuild.store.step_logs import write_header
from marinbuild.store.storage import Storage

__all__ = [
    "ATTEMPT_VAR",
    "LEDGER",
    "RETRY_BASE_DELAY_ENV",
    "AttemptLedger",
    "Retrying",
    "attempt_entry",
    "backoff_delay",
    "classify",
    "iso_time",
    "read_attempts",
    "with_retries",
]

LEDGER = "attempts.json"
ATTEMPT_VAR = "MARINBUILD_ATTEMPT"
RETRY_BASE_DELAY_ENV = "MARINBUILD_RETRY_BASE_DELAY"
_DEFAULT_BASE_DELAY_S = 5.0
_MAX_DELAY_S = 120.0


def iso_time(t: float) -> str:
    """A timestamp as the ledger writes it (UTC, milliseconds)."""
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def backoff_delay(retry: int, base: float | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): doubling, capped, jittered.

    The base is ``$MARINBUILD_RETRY_BASE_DELAY`` (default 5 s). Jitter keeps many steps
    failing together from all coming back at the same instant.
    """
    if base is None:
        base = float(os.environ.get(RETRY_BASE_DELAY_ENV, _DEFAULT_BASE_DELAY_S))
    return min(_MAX_DELAY_S, base * 2 ** (retry - 1)) * random.uniform(0.5, 1.0)


def classify(outcome: Outcome) -> str:
    """The ledger's class of one attempt: SUCCESS, FAILED, CANCELLED or TIMEOUT."""
    if outcome.ok:
        return "SUCCESS"
    if outcome.timed_out:
        return "TIMEOUT"
    if outcome.cancelled:
        return "CANCELLED"
    return "FAILED"


def attempt_entry(number: int, outcome: Outcome, host: str | None = None) -> dict[str, Any]:
    """The ledger entry of one attempt that ended with ``outcome``."""
    return {
        "attempt": number,
        "class": classify(outcome),
        "exit_code": outcome.returncode if outcome.returncode is not None else (0 if outcome.ok else None),
        "started_at": iso_time(outcome.started),
        "ended_at": iso_time(outcome.ended),
        "duration_s": round(outcome.ended - outcome.started, 3),
        "host": host or getattr(outcome, "host", None) or socket.gethostname(),
        "message": outcome.error or "",
    }


def read_attempts(storage: Storage, output_path: str) -> tuple[dict[str, Any], ...]:
    """The attempts recorded in a step's ledger; none when it is absent or unreadable (it is then replaced)."""
    try:
        text = storage.read_text(Storage.join(output_path, LEDGER))
        prior = json.loads(text) if text else {}
        return tuple(a for a in prior.get("attempts", []) if isinstance(a, dict))
    except (OSError, ValueError, AttributeError, StorageError):
        return ()


class AttemptLedger:
    """``attempts.json`` in a step's output folder, kept across runs of the step.

    ``head`` holds what a backend adds about the step (the TPU backend: command, slices).
    Every write replaces the whole file atomically, so a reader never sees half of it.
    """

    def __init__(
        self,
        output_path: str,
        step: str,
        head: Mapping[str, Any] | None = None,
        previous: tuple[Mapping[str, Any], ...] | None = None,
    ) -> None:
        self.storage = Storage.for_prefix(output_path)
        self.path = Storage.join(output_path, LEDGER)
        self.output_path = output_path
        self.head = {"step": step, **(head or {})}
        self.entries: list[dict[str, Any]] = []
        if previous is None:
            previous = read_attempts(self.storage, output_path)
        self.previous: list[dict[str, Any]] = [dict(a) for a in previous]

    @property
    def next_number(self) -> int:
        """The number the next attempt gets: one more than any recorded."""
        numbers = [a.get("attempt", 0) for a in self.previous + self.entries]
        return max((n for n in numbers if isinstance(n, int)), default=0) + 1

    def append(self, entry: Mapping[str, Any]) -> None:
        """Record one more attempt and rewrite the ledger."""
        self.entries.append(dict(entry))
        self.write()

    def replace_last(self, entry: Mapping[str, Any]) -> None:
        """Replace this run's last entry (an attempt whose record grew), or append the first."""
        if self.entries:
            self.entries[-1] = dict(entry)
        else:
            self.entries.append(dict(entry))
        self.write()

    def text(self) -> str:
        """The ledger as written: its head and every attempt, earlier runs' first."""
        return json.dumps({**self.head, "attempts": self.previous + self.entries}, indent=2) + "\n"

    def write(self) -> None:
        self.storage.makedirs(self.output_path)
        self.storage.write_atomic(self.path, self.text())


class Retrying:
    """A backend that runs each job until it succeeds or its failure budget is spent.

    ``budget_of(name)`` is the step's ``max_retries_failure`` (else the run's default).
    """

    def __init__(self, inner: Backend, budget_of: Callable[[str], int]) -> None:
        self.inner = inner
        self.budget_of = budget_of

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _RetryRun:
        run = _RetryRun(self, job, on_done)
        run.launch()
        return run


class _RetryRun:
    """One step across its attempts; cancelling it stops the current attempt and any retry."""

    def __init__(self, owner: Retrying, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.owner = owner
        self.job = job
        self.on_done = on_done
        self.ledger = AttemptLedger(job.output_path, job.name, previous=job.previous_attempts)
        self.budget = owner.budget_of(job.name)
        self.backend = backend_label(owner.inner)
        self.failures = 0
        self.first_start: float | None = None
        self._lock = threading.Lock()
        self._handle: Any = None
        self._reason: str | None = None
        self._waiting = threading.Event()  # set to end a back-off early

    def launch(self) -> None:
        number = self.ledger.next_number
        job = dataclasses.replace(self.job, attempt=number, env={**self.job.env, ATTEMPT_VAR: str(number)})
        write_header(job.log_file, number, "ray-node" if self.backend == "ray" else socket.gethostname(), self.backend)
        handle = self.owner.inner.start(job, lambda outcome: self._attempt_done(number, outcome))
        with self._lock:
            self._handle = handle
            reason = self._reason
        if reason is not None:
            handle.cancel(reason)

    def _attempt_done(self, number: int, outcome: Outcome) -> None:
        if self.first_start is None:
            self.first_start = outcome.started
        entry = {**attempt_entry(number, outcome), **attempt_extras(self.job.extra, self.backend)}
        with self._lock:
            reason = self._reason
        retryable = not outcome.ok and not outcome.cancelled and not outcome.timed_out
        retryable = retryable and getattr(outcome, "retryable", True) and reason is None
        if not (retryable and self.failures < self.budget):
            # The last attempt: its entry is written with the step's record, in the same
            # round trip as the info JSON (step_records.commit), not one before it.
            self.ledger.entries.append(entry)
            outcome = dataclasses.replace(outcome, records={**outcome.records, self.ledger.path: self.ledger.text()})
            if self.failures and self.first_start is not None:
                outcome = dataclasses.replace(outcome, started=self.first_start)
            self.on_done(outcome)
            return
        try:
            self.ledger.append(entry)
        except Exception as e:  # a ledger that cannot be written must not hide the outcome
            _note(self.job.log_file, f"marinbuild: could not write {LEDGER}: {type(e).__name__}: {e}")
        self.failures += 1
        delay = backoff_delay(self.failures)
        _note(
            self.job.log_file,
            f"marinbuild: attempt {number} failed ({outcome.error}); "
            f"retry {self.failures} of {self.budget} in {delay:.1f} s",
        )
        threading.Thread(target=self._retry_after, args=(delay,), daemon=True, name=f"retry-{self.job.name}").start()

    def _retry_after(self, delay: float) -> None:
        self._waiting.wait(delay)
        with self._lock:
            reason = self._reason
        if reason is not None:
            now = time.time()
            self.on_done(Outcome(ok=False, started=self.first_start or now, ended=now, error=reason, cancelled=True))
            return
        _launcher.submit(self.launch)

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
            handle = self._handle
        self._waiting.set()
        if handle is not None:
            handle.cancel(reason)


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


def _note(log_file: str, line: str) -> None:
    try:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        with open(log_file, "a") as f:
            f.write(line + "\n")
    except OSError:
        pass


def with_retries(
    backend: Backend, backend_for: Callable[[Any], Backend] | None, budget_of: Callable[[str], int]
) -> tuple[Backend, Callable[[Any], Backend]]:
    """``backend`` and ``backend_for`` with every backend wrapped in :class:`Retrying`, once each.

    A backend whose class sets ``retries_itself = True`` (TPU slices: preemptions and
    failures have budgets of their own there) is left as it is.
    """
    wrapped: dict[int, Backend] = {}

    def wrap(b: Backend) -> Backend:
        if getattr(b, "retries_itself", False):
            return b
        if id(b) not in wrapped:
            wrapped[id(b)] = Retrying(b, budget_of)
        return wrapped[id(b)]

    choose = backend_for or (lambda node: backend)
    return wrap(backend), lambda node: wrap(choose(node))
