"""Unit tests of marinbuild.backends.local.reaper: one thread reaping step processes and running timers.

Both implementations are tested: the epoll one (pidfds, Linux) and the thread-per-process one.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import threading
import time
from collections.abc import Iterator

import pytest

from marinbuild.backends.local.reaper import Reaper, _EpollReaper, _has_pidfd, _ThreadReaper, shared_reaper
from tests.helpers import alive

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


# -- The reaper: real child processes reaped with their exit status, timers in deadline order.


KINDS = [_ThreadReaper] + ([_EpollReaper] if _has_pidfd() else [])


def _spawn(script: str) -> int:
    return os.posix_spawn("/bin/sh", ["/bin/sh", "-c", script], os.environ)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_every_child_is_reaped_with_its_own_status(kind):
    reaper = kind()
    results: dict[int, int] = {}
    done = threading.Event()
    pids = {_spawn(f"sleep 0.{i}; exit {i}"): i for i in range(1, 6)}

    def on_exit(pid: int, status: int) -> None:
        results[pid] = os.waitstatus_to_exitcode(status)
        if len(results) == len(pids):
            done.set()

    for pid in pids:
        reaper.watch(pid, lambda status, pid=pid: on_exit(pid, status))
    assert done.wait(30)
    assert results == pids
    for pid in pids:  # reaped: nothing is left to wait for
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_child_that_exited_before_it_was_watched_is_still_reported(kind):
    reaper = kind()
    pid = _spawn("exit 7")
    # Let it become a zombie first.
    while alive(pid):
        time.sleep(0.01)
    got: list[int] = []
    done = threading.Event()
    reaper.watch(pid, lambda status: (got.append(os.waitstatus_to_exitcode(status)), done.set()))
    assert done.wait(30)
    assert got == [7]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_timers_fire_in_deadline_order_and_cancelled_ones_never(kind):
    reaper = kind()
    fired: list[str] = []
    done = threading.Event()
    reaper.call_later(0.3, lambda: (fired.append("late"), done.set()))
    cancelled = reaper.call_later(0.1, lambda: fired.append("cancelled"))
    reaper.call_later(0.05, lambda: fired.append("early"))
    cancelled.cancel()
    assert done.wait(30)
    assert fired == ["early", "late"]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_failing_exit_callback_does_not_stop_the_reaper(kind, capfd):
    reaper = kind()
    done = threading.Event()

    def boom(status: int) -> None:
        raise RuntimeError("callback failed")

    reaper.watch(_spawn("exit 0"), boom)
    reaper.watch(_spawn("sleep 0.2"), lambda status: done.set())
    assert done.wait(30)
    assert "callback failed" in capfd.readouterr().err


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.__name__)
def test_a_child_reaped_elsewhere_still_gets_its_callback_and_the_reaper_goes_on(kind):
    reaper = kind()
    stolen = _spawn("exit 3")
    gone = threading.Event()
    later: list[int] = []
    done = threading.Event()
    reaper.watch(stolen, lambda status: gone.set())
    with contextlib.suppress(ChildProcessError):  # a waiting thread may win the race
        os.waitpid(stolen, 0)  # someone else's waitpid won the race for the status
    assert gone.wait(30)
    after = _spawn("exit 4")
    reaper.watch(after, lambda status: (later.append(os.waitstatus_to_exitcode(status)), done.set()))
    assert done.wait(30)
    assert later == [4]


def test_the_guardian_is_restarted_with_every_step_when_it_dies():
    import signal

    from marinbuild.backends.local.guardian import Guardian

    guardian = Guardian()
    step = os.posix_spawn("/bin/sh", ["/bin/sh", "-c", "exec sleep 300"], os.environ, setsid=True)
    try:
        guardian.adopt("test-token-1", step)
        first = guardian.pid
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while guardian.pid == first and time.monotonic() < deadline:
            time.sleep(0.01)
        assert guardian.pid != first and guardian.restarts == 1
        # The new guardian was told of the step: closing the runner's end kills it.
        guardian.close_in_child()
        deadline = time.monotonic() + 30
        while alive(step) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not alive(step)
    finally:
        os.kill(step, signal.SIGKILL) if alive(step) else None
        os.waitpid(step, 0)
