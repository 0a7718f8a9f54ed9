"""Unit tests of marinbuild.execution.launch_thread: starts off the loop, cancels and outcomes kept in order."""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable
from typing import Any

from marinbuild.execution.launch_thread import LaunchThread, PendingStart


class Handle:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)


def submit(start: Callable[[], Any], pending: PendingStart) -> queue.Queue[tuple[str, Any]]:
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    LaunchThread.shared().submit(start, pending, announce=lambda: events.put(("started", None)),
                                 failed=lambda e: events.put(("failed", e)))
    return events


def test_starts_run_on_one_thread_that_is_not_the_caller() -> None:
    threads: list[int] = []
    seen: queue.Queue[tuple[str, Any]] = queue.Queue()
    for _ in range(3):
        pending = PendingStart()
        events = submit(lambda: threads.append(threading.get_ident()) or Handle(), pending)
        seen.put(events.get(timeout=10))
    assert [seen.get()[0] for _ in range(3)] == ["started"] * 3
    assert len(set(threads)) == 1 and threads[0] != threading.get_ident()
    assert LaunchThread.shared() is LaunchThread.shared()


def test_a_failed_start_is_reported_with_its_error() -> None:
    def start() -> Any:
        raise OSError("no such shell")

    kind, error = submit(start, PendingStart()).get(timeout=10)
    assert kind == "failed" and isinstance(error, OSError) and str(error) == "no such shell"


def test_a_cancel_before_the_process_exists_reaches_it_once_started() -> None:
    pending = PendingStart()
    release = threading.Event()
    handle = Handle()

    def start() -> Handle:
        release.wait(10)
        return handle

    events = submit(start, pending)
    pending.cancel("lease lost")
    pending.cancel("interrupted")  # the first reason is the one kept
    release.set()
    assert events.get(timeout=10)[0] == "started"
    assert handle.cancelled == ["lease lost"]
    pending.cancel("again")  # once started, a cancel goes straight through
    assert handle.cancelled == ["lease lost", "again"]


def test_an_outcome_posted_before_the_start_is_announced_comes_after_it() -> None:
    pending = PendingStart()
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    post = pending.relay(lambda outcome: events.put(("outcome", outcome)))

    def start() -> Handle:
        post("done at once")  # the reaper fired before the start returned
        return Handle()

    LaunchThread.shared().submit(start, pending, announce=lambda: events.put(("started", None)),
                                 failed=lambda e: events.put(("failed", e)))
    assert [events.get(timeout=10) for _ in range(2)] == [("started", None), ("outcome", "done at once")]
    post("later")  # after the announcement, outcomes pass straight on
    assert events.get(timeout=10) == ("outcome", "later")


def test_a_forked_child_has_no_launch_thread_of_its_parents() -> None:
    LaunchThread.shared()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        os.write(write, b"1" if LaunchThread._shared is None else b"0")
        os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    os.waitpid(pid, 0)
