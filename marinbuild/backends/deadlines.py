"""When the work under each lease this process holds must have stopped.

A runner renews its leases from one heartbeat thread. If it stops renewing (its store is
down, its disk is full, the runner is suspended with SIGSTOP or Ctrl-Z, its VM is frozen),
another runner takes a step over once the lease has been seen unchanged for the expiry.
Before that can happen the step must be dead, and it cannot be the runner's own threads
that make sure of it: a stopped runner runs no thread at all.

So each successful renewal publishes here a *deadline*, the last moment the step may still
run (:attr:`~marinbuild.store.lease.LeaseSettings.kill_after` after the renewal was sent),
keyed by the step's output path. Backends pass it on to something outside the runner that
kills the work when it passes: the local guardian process, the watcher beside a TPU
step's command on each host. A deadline is a monotonic time and a wall-clock time; the
work is killed when either passes, so that a clock that stood still while a VM was frozen
is overruled by one that did not.

The backends answer with the process now running each step (:meth:`Deadlines.started`),
which the lease's holder records in the lease before the step may run, for a runner
taking the step over on this machine to kill its cgroup and process group.

Example::

    deadlines.publish("/out/train-1a2b", Deadline.within(55.0))
    stop = deadlines.subscribe("/out/train-1a2b", lambda d: print(d.remaining()))
    stop()
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from marinbuild.store.lease_owner import StepProcess

__all__ = ["Deadline", "Deadlines", "deadlines"]


@dataclass(frozen=True)
class Deadline:
    """A moment on this machine's monotonic clock and on its wall clock."""

    monotonic: float
    wall: float

    @classmethod
    def within(cls, seconds: float) -> Deadline:
        return cls(time.monotonic() + seconds, time.time() + seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf, math.inf)

    def remaining(self) -> float:
        """Seconds left by the clock that says fewer (never below 0)."""
        return max(0.0, min(self.monotonic - time.monotonic(), self.wall - time.time()))

    def words(self) -> str:
        """Monotonic and wall time as two words, for a line to a guardian process."""
        return f"{self.monotonic!r} {self.wall!r}"


class Deadlines:
    """The latest deadline of each output path, and who wants to hear of a new one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: dict[str, Deadline] = {}
        self._listeners: dict[str, list[Callable[[Deadline], None]]] = {}
        self._processes: dict[str, StepProcess] = {}
        self._recorders: dict[str, Callable[[StepProcess], None]] = {}

    def publish(self, output_path: str, deadline: Deadline) -> None:
        """The work writing ``output_path`` must have stopped by ``deadline``."""
        with self._lock:
            self._latest[output_path] = deadline
            listeners = list(self._listeners.get(output_path, ()))
        for listener in listeners:
            listener(deadline)

    def withdraw(self, output_path: str) -> None:
        """The lease was let go: no deadline (the work under it is over)."""
        with self._lock:
            self._latest.pop(output_path, None)

    def started(self, output_path: str, process: StepProcess | None) -> None:
        """The step writing ``output_path`` now runs as ``process`` (None: it ended).

        A backend calls this while the step still waits at its gate: the recorder of the
        path (:meth:`keep_records`, the lease's holder) writes the process into the lease
        before this returns, and whatever it raises (the lease could not be written, or is
        another runner's now) means the step must not pass its gate.
        """
        with self._lock:
            if process is None:
                self._processes.pop(output_path, None)
                return
            self._processes[output_path] = process
            recorder = self._recorders.get(output_path)
        if recorder is not None:
            recorder(process)

    def keep_records(self, output_path: str, recorder: Callable[[StepProcess], None] | None) -> None:
        """Have ``recorder`` write each process started for ``output_path`` where a taker finds it (None: stop)."""
        with self._lock:
            if recorder is None:
                self._recorders.pop(output_path, None)
            else:
                self._recorders[output_path] = recorder

    def process(self, output_path: str) -> StepProcess | None:
        """The process running the step writing ``output_path``, as its backend last said."""
        with self._lock:
            return self._processes.get(output_path)

    def latest(self, output_path: str) -> Deadline | None:
        """The deadline now, or None when no lease of this process covers the path."""
        with self._lock:
            return self._latest.get(output_path)

    def subscribe(self, output_path: str, listener: Callable[[Deadline], None]) -> Callable[[], None]:
        """Call ``listener`` with every deadline published from now on; returns the way to stop."""
        with self._lock:
            self._listeners.setdefault(output_path, []).append(listener)

        def stop() -> None:
            with self._lock:
                listeners = self._listeners.get(output_path, [])
                if listener in listeners:
                    listeners.remove(listener)
                if not listeners:
                    self._listeners.pop(output_path, None)

        return stop


deadlines = Deadlines()
"""This process's deadlines: the lease claims publish, the backends listen."""
