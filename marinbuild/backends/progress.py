"""Telling a wedged step from a slow one: its log and its progress file stop changing.

A step shows progress by writing to its log or by touching (or appending to) the file named
in ``$MARINBUILD_PROGRESS``. When neither has changed for the step's ``progress_timeout``, the
attempt is a hang: every task may still be alive (a collective waiting forever, a dead
coordinator), so liveness says nothing; only progress does.

:class:`ProgressClock` keeps the time of the last change seen, on the runner's clock (files on
other hosts are compared with their own earlier state, never with this machine's time).
:class:`HangWatch` polls sources in a thread and calls back once when the clock has stood
still for the timeout::

    watch = HangWatch(900, FileProgress(["logs/step.log", "logs/progress"]).changed, on_hang)
    ...
    watch.stop()
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence

__all__ = ["FileProgress", "HangWatch", "ProgressClock", "poll_interval"]


def poll_interval(timeout: float) -> float:
    """How often to look for progress: a quarter of the timeout, between 0.05 s and 30 s.

    >>> poll_interval(900), poll_interval(1)
    (30.0, 0.25)
    """
    return min(30.0, max(0.05, timeout / 4))


class ProgressClock:
    """The last time anything moved; thread-safe (readers from many hosts report to it)."""

    def __init__(self, now: Callable[[], float] = time.time) -> None:
        self._now = now
        self._lock = threading.Lock()
        self.last = now()

    def moved(self) -> None:
        """Something changed just now."""
        t = self._now()
        with self._lock:
            self.last = max(self.last, t)

    def quiet_for(self) -> float:
        """Seconds since the last change."""
        with self._lock:
            return self._now() - self.last


def _state(path: str) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino  # a file replaced is a change, however coarse its times


class FileProgress:
    """Local files watched for a change of size or modification time."""

    def __init__(self, paths: Sequence[str]) -> None:
        self.paths = tuple(paths)
        self._seen = {p: _state(p) for p in self.paths}

    def changed(self) -> bool:
        """Whether any file changed (or appeared, or went) since the last call (or creation)."""
        moved = False
        for p in self.paths:
            now = _state(p)
            if now != self._seen[p]:
                self._seen[p] = now
                moved = True
        return moved


class HangWatch:
    """Call ``on_hang(last_moved)`` once when ``changed()`` has said no for ``timeout`` seconds.

    ``last_moved`` is the time (this machine's clock) of the last change seen, or of the
    watch's start. :meth:`stop` ends the watch; a hang reported is never reported again.
    ``on_moved(last_moved)``, when given, hears of the start and of each look that saw a change.
    With ``started``, the clock starts once ``started()`` first says yes instead of at once:
    for work queued elsewhere (a Ray task waiting for a node), so that time spent waiting for
    resources is never taken for a hang.
    """

    def __init__(
        self,
        timeout: float,
        changed: Callable[[], bool],
        on_hang: Callable[[float], None],
        name: str = "marinbuild-progress",
        on_moved: Callable[[float], None] | None = None,
        started: Callable[[], bool] | None = None,
    ) -> None:
        self.timeout = timeout
        self._started = started
        self.clock = ProgressClock()
        self._changed = changed
        self._on_hang = on_hang
        self._on_moved = on_moved
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        interval = poll_interval(self.timeout)
        if self._started is not None:
            while not self._started():
                if self._stop.wait(interval):
                    return
            self.clock.moved()
        if self._on_moved is not None:
            self._on_moved(self.clock.last)
        while not self._stop.wait(interval):
            if self._changed():
                self.clock.moved()
                if self._on_moved is not None:
                    self._on_moved(self.clock.last)  # at most once a look: a note, not a stream
            elif self.clock.quiet_for() >= self.timeout:
                if not self._stop.is_set():
                    self._on_hang(self.clock.last)
                return

    def stop(self) -> None:
        self._stop.set()
