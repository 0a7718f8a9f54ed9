"""One thread that waits for every step process of this runner, and runs their timers.

A waiting thread per step cost the scheduler about 0.7 ms per step on a busy 2-core
machine: ``Thread.start`` returns only once the new thread has been scheduled. On Linux
a process file descriptor (``pidfd_open``) becomes readable when its process exits, so
one ``epoll`` waits on all running steps at once, and on the deadlines of wall-time
limits and kill grace periods. Elsewhere each process gets a thread and each timer a
:class:`threading.Timer`, as before.

Example::

    reaper = shared_reaper()
    reaper.watch(pid, lambda status: print(os.waitstatus_to_exitcode(status)))
    timer = reaper.call_later(30.0, lambda: os.killpg(pid, signal.SIGTERM))
    timer.cancel()
"""

from __future__ import annotations

import heapq
import itertools
import os
import select
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Protocol

__all__ = ["Reaper", "Timer", "shared_reaper"]


class Timer(Protocol):
    def cancel(self) -> None:
        """Do not run the callback (a no-op once it ran)."""


class Reaper(Protocol):
    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        """Reap child ``pid`` when it exits and call ``on_exit`` with its wait status."""

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        """Call ``fn`` after ``delay`` seconds, from the reaper's thread."""


class _Scheduled:
    def __init__(self, fn: Callable[[], None]) -> None:
        self.fn: Callable[[], None] | None = fn

    def cancel(self) -> None:
        self.fn = None


class _EpollReaper:
    """pidfds and a timer heap, served by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._epoll.register(self._wake_r, select.EPOLLIN)
        self._lock = threading.Lock()
        self._watched: dict[int, tuple[int, Callable[[int], None]]] = {}  # pidfd -> (pid, callback)
        self._timers: list[tuple[float, int, _Scheduled]] = []
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        fd = os.pidfd_open(pid)
        with self._lock:
            self._watched[fd] = (pid, on_exit)
            self._ensure_thread()
        self._epoll.register(fd, select.EPOLLIN)  # epoll_ctl is safe beside a running epoll_wait

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = _Scheduled(fn)
        with self._lock:
            heapq.heappush(self._timers, (time.monotonic() + delay, next(self._seq), timer))
            self._ensure_thread()
        self._wake()  # the thread may be sleeping until a later deadline
        return timer

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="marinbuild-reaper", daemon=True)
            self._thread.start()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass  # a wake-up is already pending

    def _serve(self) -> None:
        # This thread reaps every step and runs the timers that stop them: nothing may end it.
        while True:
            try:
                self._serve_once()
            except Exception:
                traceback.print_exc(file=sys.stderr)

    def _serve_once(self) -> None:
        while True:
            with self._lock:
                timeout = max(0.0, self._timers[0][0] - time.monotonic()) if self._timers else -1.0
            for fd, _ in self._epoll.poll(timeout):
                if fd == self._wake_r:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                self._reap(fd)
            self._run_due_timers()

    def _reap(self, fd: int) -> None:
        with self._lock:
            pid, on_exit = self._watched.pop(fd)
        self._epoll.unregister(fd)
        os.close(fd)
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped elsewhere: the exit status is lost, not the callback
            status = 255 << 8
        _call(lambda: on_exit(status))

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        due: list[_Scheduled] = []
        with self._lock:
            while self._timers and self._timers[0][0] <= now:
                due.append(heapq.heappop(self._timers)[2])
        for timer in due:
            fn = timer.fn
            if fn is not None:
                _call(fn)


class _ThreadReaper:
    """Where there are no pidfds: a thread per process, a ``threading.Timer`` per timer."""

    def watch(self, pid: int, on_exit: Callable[[int], None]) -> None:
        def wait() -> None:
            try:
                _, status = os.waitpid(pid, 0)
            except ChildProcessError:
                status = 255 << 8
            _call(lambda: on_exit(status))

        threading.Thread(target=wait, name=f"wait-{pid}", daemon=True).start()

    def call_later(self, delay: float, fn: Callable[[], None]) -> Timer:
        timer = threading.Timer(delay, lambda: _call(fn))
        timer.daemon = True
        timer.start()
        return timer


def _call(fn: Callable[[], None]) -> None:
    # A failing callback must not stop the thread that reaps every other step.
    try:
        fn()
    except Exception:
        traceback.print_exc(file=sys.stderr)


_shared: Reaper | None = None
_shared_lock = threading.Lock()


def shared_reaper() -> Reaper:
    """The reaper of this process, created on first use (pidfds where the kernel has them)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = _EpollReaper() if _has_pidfd() else _ThreadReaper()
        return _shared


def _has_pidfd() -> bool:
    if not hasattr(os, "pidfd_open") or not hasattr(select, "epoll"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # a kernel older than 5.3
        return False
    return True


def _forget_after_fork() -> None:
    # A forked child has no reaper thread and none of the parent's children.
    global _shared, _shared_lock
    _shared = None
    _shared_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
