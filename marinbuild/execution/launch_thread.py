"""Starting steps' processes on one thread beside the run loop.

Starting a local step waits for the kernel: ``posix_spawn`` returns only once the child has
reached ``exec``, a fraction of a millisecond on a quiet machine and several on a busy one,
time in which the loop could have recorded the outcome of the step before. The spawn call
releases the GIL, so a thread that does nothing else can wait for it while the loop goes on.

One long-lived thread starts every step: a function step's child asks for a death signal
when the thread that forked it ends (``PR_SET_PDEATHSIG`` follows the thread, not the
process), so that thread must outlive every step.

Until its process exists a step is represented by a :class:`PendingStart`: a cancel (a lost
lease, Ctrl-C) is kept and passed on as soon as the start returns, and an outcome that
arrives before the start has been announced waits behind the announcement, so the loop
always hears ``started`` before ``finished``.

Example::

    pending = PendingStart()
    LaunchThread.shared().submit(lambda: backend.start(job, pending.relay(post)), pending, announce, failed)
"""

from __future__ import annotations

import os
import queue
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

__all__ = ["LaunchThread", "PendingStart"]


class PendingStart:
    """A step whose process is being started on the launch thread; stands in for its handle."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handle: Any = None
        self._reason: str | None = None
        self._announced = False
        self._early: list[Callable[[], None]] = []

    def cancel(self, reason: str) -> None:
        """Cancel the step now if it runs, else as soon as it does."""
        with self._lock:
            handle = self._handle
            if handle is None and self._reason is None:
                self._reason = reason
        if handle is not None:
            handle.cancel(reason)

    def relay(self, post: Callable[[Any], None]) -> Callable[[Any], None]:
        """``post`` for the backend's outcome callback, held back until the start is announced."""

        def on_done(outcome: Any) -> None:
            with self._lock:
                if not self._announced:
                    self._early.append(lambda: post(outcome))
                    return
            post(outcome)

        return on_done

    def _started(self, handle: Any, announce: Callable[[], None]) -> None:
        with self._lock:
            self._handle = handle
            reason = self._reason
            announce()  # under the lock: an outcome posted meanwhile waits until after it
            self._announced = True
            early, self._early = self._early, []
        for post in early:
            post()
        if reason is not None:
            handle.cancel(reason)


class LaunchThread:
    """One daemon thread, started on first use, that starts every step handed to it in order."""

    _shared: LaunchThread | None = None
    _shared_lock = threading.Lock()

    def __init__(self) -> None:
        self._work: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="marinbuild-launch", daemon=True)
        self._thread.start()

    @classmethod
    def shared(cls) -> LaunchThread:
        """The launch thread of this process."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def submit(
        self,
        start: Callable[[], Any],
        pending: PendingStart,
        announce: Callable[[], None],
        failed: Callable[[BaseException], None],
    ) -> None:
        """Run ``start()`` on the thread; then ``announce()``, or ``failed(error)`` when it raised."""

        def work() -> None:
            try:
                handle = start()
            except Exception as e:
                failed(e)
                return
            pending._started(handle, announce)

        self._work.put(work)

    def _serve(self) -> None:
        while True:
            work = self._work.get()
            try:
                work()
            except Exception:  # the thread that starts every step must not end
                traceback.print_exc(file=sys.stderr)


def _forget_launch_thread() -> None:
    # A forked child has no launch thread.
    LaunchThread._shared = None
    LaunchThread._shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_launch_thread)
