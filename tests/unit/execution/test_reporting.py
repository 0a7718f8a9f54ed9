"""Unit tests of marinbuild.execution.reporting: what a run tells the outside world."""

from __future__ import annotations

import io
import json

from marinbuild.execution.reporting import (
    Failure,
    JsonReporter,
    PlainReporter,
    Summary,
    json_step_lines,
)


def _events(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_summary_is_ok_only_when_everything_ran() -> None:
    assert Summary(total=2, done=2).ok
    assert not Summary(failed=[Failure("a", "boom", "/log")]).ok
    assert not Summary(interrupted=True).ok
    assert not Summary(not_started=1).ok


def test_json_reporter_writes_one_object_per_event() -> None:
    out = io.StringIO()
    r = JsonReporter(out)
    r.run_started(3, 1)  # not an event of its own
    r.step_started("a", "/o/a")
    r.step_waiting("b", "a lease held by another runner")
    r.step_finished("a", 1.5)
    r.step_failed("c", "exit 3", "/o/c/logs/step.log")
    r.step_skipped("d", "up to date")
    r.run_finished(Summary(total=4, done=1, skipped=1, failed=[Failure("c", "exit 3", "")],
                           retries={"c": {"failure": {"used": 1, "max": 1}}}))
    events = _events(out)
    assert [e["event"] for e in events] == ["started", "waiting", "finished", "failed", "skipped", "summary"]
    assert all(isinstance(e["time"], float) for e in events)
    assert events[0] == {**events[0], "step": "a", "output": "/o/a"}
    assert events[3]["error"] == "exit 3" and events[3]["log"] == "/o/c/logs/step.log"
    assert events[-1] == {**events[-1], "total": 4, "done": 1, "skipped": 1, "failed": ["c"], "not_started": 0,
                          "retries": {"c": {"failure": {"used": 1, "max": 1}}}}


def test_plain_reporter_lines() -> None:
    out = io.StringIO()
    r = PlainReporter(out)
    r.step_started("a", "/o/a")
    r.step_waiting("b", "cores")
    r.step_finished("a", 1.25)
    r.step_failed("c", "exit 3", "/log")
    r.step_failed("d", "lost", "")
    r.step_skipped("e", "up to date")  # quiet about skipped steps
    r.step_finished("f", 3.94, capacity_wait=90.2)
    r.step_finished("g", 1.0, capacity_wait=2.34)
    assert out.getvalue().splitlines() == [
        "start a  /o/a", "wait  b: cores", "done  a (1.2 s)", "FAIL  c: exit 3 (log: /log)", "FAIL  d: lost",
        "done  f (3.9 s after 90 s waiting for capacity)", "done  g (1.0 s after 2.3 s waiting for capacity)",
    ]


def test_json_step_lines() -> None:
    out = io.StringIO()
    json_step_lines("output", out)("a", "hello")
    json_step_lines("command", out)("a", "echo hello")
    first, second = _events(out)
    assert (first["event"], first["step"], first["line"]) == ("output", "a", "hello")
    assert (second["event"], second["command"]) == ("command", "echo hello")
