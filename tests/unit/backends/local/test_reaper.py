"""Unit tests of marinbuild.backends.local.reaper: one thread reaping step processes and running timers.

Both implementations are tested: the epoll one (pidfds, Linux) and the thread-per-process one.
"""

from __future__ import annotations

import os
import queue
import signal
import threading
from collections.abc import Iterator

import pytest

from marinbuild.backends.local.reaper import Reaper, _EpollReaper, _ThreadReaper, shared_reaper

WAIT = 30.0


@pytest.fixture(params=["epoll", "threads"])
def reaper(request: pytest.FixtureRequest) -> Iterator[Reaper]:
    yield _EpollReaper() if request.param == "epoll" else _ThreadReaper()


def _child(script: str) -> int:
    # Not Popen: it reaps finished children of its own accord; the reaper must be the only waiter.
    return os.posix_spawn("/bin/sh", ["/bin/sh", "-c", script], os.environ)


def test_each_exit_status_reaches_its_callback(reaper: Reaper) -> None:
    statuses: queue.Queue[tuple[int, int]] = queue.Queue()
    pids = {_child(f"exit {code}"): code for code in (0, 3, 7)}
    for pid in pids:
        reaper.watch(pid, lambda status, pid=pid: statuses.put((pid, os.waitstatus_to_exitcode(status))))
    got = dict(statuses.get(timeout=WAIT) for _ in pids)
    assert got == pids
    for pid in pids:  # reaped: nothing is left to wait for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_a_killed_process_reports_its_signal(reaper: Reaper) -> None:
    statuses: queue.Queue[int] = queue.Queue()
    pid = _child("sleep 300")
    reaper.watch(pid, statuses.put)
    os.kill(pid, signal.SIGKILL)
    assert os.waitstatus_to_exitcode(statuses.get(timeout=WAIT)) == -signal.SIGKILL


def test_timers_run_in_deadline_order_and_cancelled_ones_never(reaper: Reaper) -> None:
    ran: list[str] = []
    done = threading.Event()
    reaper.call_later(0.2, lambda: (ran.append("late"), done.set()))
    reaper.call_later(0.0, lambda: ran.append("soon"))
    reaper.call_later(0.05, lambda: ran.append("cancelled")).cancel()
    assert done.wait(WAIT)
    assert ran == ["soon", "late"]


def test_a_failing_callback_does_not_stop_the_reaper(reaper: Reaper) -> None:
    done = threading.Event()

    def boom() -> None:
        raise RuntimeError("callback bug")

    reaper.call_later(0.0, boom)
    reaper.call_later(0.01, done.set)
    assert done.wait(WAIT)


def test_the_shared_reaper_is_one_per_process() -> None:
    assert shared_reaper() is shared_reaper()
