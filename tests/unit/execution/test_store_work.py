"""Unit tests of marinbuild.execution.store_work: a step's store round trips, inline or on store threads."""

from __future__ import annotations

import queue
import threading
from typing import Any

from marinbuild.execution.loop_events import StoreDone
from marinbuild.execution.store_work import StoreWork


def test_on_local_disk_the_work_runs_on_the_loop_and_its_result_is_handed_over_at_once() -> None:
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    work = StoreWork(events, threads=0)
    got: list[Any] = []
    work.submit("a", lambda: threading.current_thread().name, got.append)
    work.submit("b", lambda: 1 // 0, got.append)
    assert got[0] == threading.current_thread().name
    assert isinstance(got[1], ZeroDivisionError), "an exception is handed over as the result"
    assert work.in_flight == set() and events.empty()
    work.close()


def test_on_store_threads_the_result_comes_back_as_an_event_for_the_loop() -> None:
    events: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
    work = StoreWork(events, threads=2)
    release = threading.Event()
    got: list[Any] = []

    def slow() -> str:
        release.wait(30)
        return threading.current_thread().name

    work.submit("a", slow, got.append)
    work.submit("b", lambda: 1 // 0, got.append)
    assert work.in_flight == {"a", "b"} and got == [], "nothing is handed over off the loop"
    name, event = events.get(timeout=30)
    assert name == "b" and isinstance(event, StoreDone) and isinstance(event.result, ZeroDivisionError)
    release.set()
    name, event = events.get(timeout=30)
    assert name == "a" and event.result.startswith("marinbuild-store")
    event.then(event.result)  # as the loop does
    work.finished("a")
    assert got == [event.result] and work.in_flight == {"b"}
    work.close()
