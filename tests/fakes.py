"""The fakes the tests share: backends that end jobs as a test says, and a clock a test moves.

A fake stands in where the real part cannot be steered (an outcome scripted per attempt, time
set by the test); everything else in those tests is real: the scheduler, the retry loop, the
store on a real folder.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable
from typing import Any

from marinbuild.backends.base import Job, Outcome

__all__ = ["FakeClock", "FunctionBackend", "ScriptedBackend", "ThreadBackend"]


class FakeClock:
    """A monotonic clock that stands still until the test sets ``now``."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class ScriptedBackend:
    """Records each job it is given and ends it at once, as scripted: one ``ok`` per attempt (all ok by default)."""

    def __init__(self, results: list[bool] | None = None) -> None:
        self.results = results
        self.jobs: list[Job] = []

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        self.jobs.append(job)
        ok = True if self.results is None else self.results[len(self.jobs) - 1]
        now = time.time()
        on_done(Outcome(ok=ok, started=now, ended=now, error=None if ok else "boom", returncode=0 if ok else 1))
        return self

    def cancel(self, reason: str) -> None:
        pass


class ThreadBackend:
    """Ends every job on a thread of its own soon after: failed when its config says ``{"fail": True}``.

    ``most`` is the most jobs it held at once, ``started`` the jobs in the order they came.
    """

    def __init__(self) -> None:
        self.started: list[str] = []
        self.lock = threading.Lock()
        self.most = 0
        self.now = 0

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        with self.lock:
            self.started.append(job.name)
            self.now += 1
            self.most = max(self.most, self.now)

        def body() -> None:
            t = time.time()
            time.sleep(0.01)  # long enough for a second start to overlap if the gates allow it
            with self.lock:
                self.now -= 1
            fail = isinstance(job.config, dict) and job.config.get("fail")
            on_done(Outcome(not fail, t, time.time(), error="failed on purpose" if fail else None))

        threading.Thread(target=body, daemon=True).start()
        return self

    def cancel(self, reason: str) -> None:
        pass


class _Cancellable:
    def __init__(self, cancelled: threading.Event) -> None:
        self.cancelled = cancelled

    def cancel(self, reason: str) -> None:
        self.cancelled.set()


class FunctionBackend:
    """Runs ``job.fn(job.config)`` on a thread; a step function may take ``cancelled=`` too.

    A job named in ``refuse`` is refused as it starts, as a backend with no worker for it would.
    """

    def __init__(self, refuse: frozenset[str] = frozenset()) -> None:
        self.refuse = refuse
        self.started: list[str] = []

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _Cancellable:
        if job.name in self.refuse:
            raise RuntimeError(f"no worker will take {job.name}")
        self.started.append(job.name)
        cancelled = threading.Event()

        def body() -> None:
            t0 = time.time()
            try:
                assert job.fn is not None
                if "cancelled" in inspect.signature(job.fn).parameters:
                    job.fn(job.config, cancelled=cancelled)  # type: ignore[call-arg]
                else:
                    job.fn(job.config)
            except Exception as e:
                on_done(Outcome(False, t0, time.time(), error=f"{type(e).__name__}: {e}", cancelled=cancelled.is_set()))
                return
            on_done(Outcome(not cancelled.is_set(), t0, time.time(), cancelled=cancelled.is_set(),
                            error="cancelled" if cancelled.is_set() else None))

        threading.Thread(target=body, daemon=True).start()
        return _Cancellable(cancelled)
