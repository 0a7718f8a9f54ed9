"""Unit tests of marinbuild.backends.deadlines: when the work under each lease must have stopped."""

from __future__ import annotations

import math
import time

from marinbuild.backends.deadlines import Deadline, Deadlines


def test_within_is_ahead_on_both_clocks() -> None:
    before_m, before_w = time.monotonic(), time.time()
    d = Deadline.within(30.0)
    assert d.monotonic >= before_m + 30.0 and d.wall >= before_w + 30.0
    assert 0 < d.remaining() <= 30.0


def test_the_clock_saying_fewer_seconds_wins() -> None:
    wall_passed = Deadline(time.monotonic() + 100, time.time() - 1)
    assert wall_passed.remaining() == 0.0
    mono_soon = Deadline(time.monotonic() + 5, time.time() + 100)
    assert mono_soon.remaining() <= 5


def test_never() -> None:
    assert Deadline.never().remaining() == math.inf


def test_words_read_back_exactly() -> None:
    d = Deadline(12.25, 1700000000.5)
    mono, wall = (float(w) for w in d.words().split())
    assert (mono, wall) == (12.25, 1700000000.5)


def test_publish_latest_withdraw() -> None:
    board = Deadlines()
    assert board.latest("/o") is None
    d1, d2 = Deadline(1.0, 1.0), Deadline(2.0, 2.0)
    board.publish("/o", d1)
    board.publish("/o", d2)
    assert board.latest("/o") == d2
    board.withdraw("/o")
    assert board.latest("/o") is None
    board.withdraw("/o")  # twice is fine


def test_subscribers_hear_every_new_deadline_until_they_stop() -> None:
    board = Deadlines()
    heard: list[Deadline] = []
    other: list[Deadline] = []
    stop = board.subscribe("/o", heard.append)
    board.subscribe("/elsewhere", other.append)
    board.publish("/o", Deadline(1.0, 1.0))
    stop()
    stop()  # twice is fine
    board.publish("/o", Deadline(2.0, 2.0))
    assert heard == [Deadline(1.0, 1.0)] and other == []


def test_a_started_process_is_recorded_before_started_returns_and_a_failed_record_is_raised():
    from marinbuild.backends.deadlines import Deadlines
    from marinbuild.store.lease_owner import StepProcess

    d = Deadlines()
    seen: list[StepProcess] = []
    process = StepProcess("h", 10, 10, "5", "boot", "pid:[1]")
    d.keep_records("/out/a", seen.append)
    d.started("/out/a", process)
    assert seen == [process] and d.process("/out/a") == process
    d.started("/out/a", None)  # its end is not recorded
    assert seen == [process]

    def refuse(p: StepProcess) -> None:
        raise RuntimeError("the lease could not be written")

    d.keep_records("/out/a", refuse)
    try:
        d.started("/out/a", process)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a record that failed must stop the step at its gate")
    d.keep_records("/out/a", None)
    d.started("/out/a", process)  # nobody records: nothing raised
