"""Progress watching: file changes seen, the clock, and a hang called back once (real files and threads)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from marinbuild.backends.progress import FileProgress, HangWatch, ProgressClock, poll_interval


def test_a_file_that_appears_grows_or_is_touched_counts_as_progress(tmp_path: Path) -> None:
    log, beacon = tmp_path / "step.log", tmp_path / "progress"
    log.write_text("start\n")
    watch = FileProgress([str(log), str(beacon)])
    assert not watch.changed()
    beacon.touch()
    assert watch.changed() and not watch.changed()
    with log.open("a") as f:
        f.write("more\n")
    assert watch.changed()
    beacon.unlink()
    assert watch.changed()


def test_the_clock_only_moves_forward() -> None:
    now = [100.0]
    clock = ProgressClock(lambda: now[0])
    now[0] = 130.0
    assert clock.quiet_for() == 30.0
    clock.moved()
    assert clock.last == 130.0 and clock.quiet_for() == 0.0


def test_poll_interval_is_a_quarter_of_the_timeout_within_bounds() -> None:
    assert poll_interval(0.01) == 0.05
    assert poll_interval(2) == 0.5
    assert poll_interval(3600) == 30.0


def test_a_watch_calls_back_once_when_nothing_moves() -> None:
    hung: list[float] = []
    fired = threading.Event()

    def on_hang(last: float) -> None:
        hung.append(last)
        fired.set()

    watch = HangWatch(0.2, lambda: False, on_hang)
    assert fired.wait(10)
    watch.stop()
    assert len(hung) == 1 and hung[0] == watch.clock.last


def test_a_watch_whose_source_keeps_moving_never_fires() -> None:
    fired = threading.Event()
    polls = threading.Semaphore(0)

    def changed() -> bool:
        polls.release()
        return True

    watch = HangWatch(0.2, changed, lambda last: fired.set())
    for _ in range(8):  # eight polls, twice the timeout's worth, all seeing progress
        assert polls.acquire(timeout=10)
    watch.stop()
    assert not fired.is_set()


def test_a_stopped_watch_never_fires() -> None:
    fired = threading.Event()
    watch = HangWatch(0.2, lambda: False, lambda last: fired.set())
    watch.stop()
    assert not fired.wait(0.6)


def test_a_watch_tells_of_its_start_and_of_each_look_that_saw_a_change() -> None:
    told: list[float] = []
    enough = threading.Event()
    answers = iter([True, False, True])

    def moved(last: float) -> None:
        told.append(last)
        if len(told) == 3:
            enough.set()

    watch = HangWatch(1.0, lambda: next(answers, False), lambda last: None, on_moved=moved)
    assert enough.wait(10)
    watch.stop()
    assert len(told) == 3 and told == sorted(told)  # the start, then two looks that saw a change


def test_a_watch_started_later_waits_through_any_silence_before_the_start() -> None:
    """Queued work (a Ray task waiting for a node) is silent until it starts: that is no hang."""
    fired = threading.Event()
    polls = threading.Semaphore(0)
    started = threading.Event()
    told: list[float] = []

    def has_started() -> bool:
        polls.release()
        return started.is_set()

    watch = HangWatch(0.2, lambda: False, lambda last: fired.set(), on_moved=told.append, started=has_started)
    for _ in range(12):  # three timeouts' worth of looks while queued
        assert polls.acquire(timeout=10)
    assert not fired.is_set() and told == []
    before = time.time()
    started.set()
    assert fired.wait(10)  # silent after its start for the timeout: now a hang
    watch.stop()
    assert len(told) == 1 and told[0] >= before and watch.clock.last == told[0]


def test_a_watch_stopped_while_waiting_for_the_start_ends_its_thread() -> None:
    polls = threading.Semaphore(0)

    def has_started() -> bool:
        polls.release()
        return False

    watch = HangWatch(0.2, lambda: True, lambda last: None, started=has_started)
    assert polls.acquire(timeout=10)
    watch.stop()
    watch._thread.join(10)
    assert not watch._thread.is_alive()
