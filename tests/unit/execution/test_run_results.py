from __future__ import annotations

from marinbuild.execution.reporting import NullReporter, Summary
from marinbuild.execution.run_results import Recorder, RunSummary, StepOutcome, StepResult


def test_run_summary() -> None:
    summary = RunSummary({
        "a": StepResult("a", StepOutcome.RAN, "/o/a", duration=1.0),
        "b": StepResult("b", StepOutcome.FAILED, "/o/b", error="exit 3"),
        "c": StepResult("c", StepOutcome.SKIPPED, "/o/c"),
    })
    assert not summary.ok and summary.count(StepOutcome.RAN) == 1 and summary.names(StepOutcome.FAILED) == ["b"]
    assert str(summary) == "ran 1: a\nskipped 1: c\nfailed 1: b\n  b: exit 3"
    assert str(RunSummary({})) == "nothing to do" and RunSummary({}).ok
    assert not RunSummary({}, interrupted=True).ok


class _Events(NullReporter):
    def __init__(self) -> None:
        self.seen: list[tuple[object, ...]] = []

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self.seen.append(("finished", name, duration, capacity_wait))

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.seen.append(("failed", name, error, log))

    def step_skipped(self, name: str, reason: str) -> None:
        self.seen.append(("skipped", name, reason))

    def run_finished(self, summary: Summary) -> None:
        self.seen.append(("run", dict(summary.retries)))


def test_the_recorder_keeps_each_steps_fate_and_passes_every_event_on() -> None:
    inner = _Events()
    commands: list[tuple[str, str]] = []
    recorder = Recorder(inner, on_command=lambda n, c: commands.append((n, c)), tally={"b": {"failure": {"used": 1}}})
    recorder.step_command("a", "echo hi")
    recorder.step_finished("a", 1.5, 0.25)
    recorder.step_failed("b", "exit 3", "/logs/b")
    recorder.step_skipped("c", "a dependency failed")
    recorder.step_skipped("a", "late")  # a step's first fate stands
    summary = Summary()
    recorder.run_finished(summary)
    assert recorder.results == {
        "a": (StepOutcome.RAN, None, None, 1.5),
        "b": (StepOutcome.FAILED, "exit 3", "/logs/b", None),
        "c": (StepOutcome.NOT_STARTED, "a dependency failed", None, None),
    }
    assert commands == [("a", "echo hi")]
    assert inner.seen == [
        ("finished", "a", 1.5, 0.25), ("failed", "b", "exit 3", "/logs/b"), ("skipped", "c", "a dependency failed"),
        ("skipped", "a", "late"), ("run", {"b": {"failure": {"used": 1}}}),
    ]


def test_a_runs_results_are_still_found_where_they_lived() -> None:
    import marinbuild.execution.session as session

    assert session.RunSummary is RunSummary and session.StepOutcome is StepOutcome and session.StepResult is StepResult


def test_a_steps_result_says_its_fate_where_it_ran_and_its_retries() -> None:
    recorder = Recorder(NullReporter(), tally={"b": {"failure": {"used": 1, "max": 3}}})
    recorder.step_finished("a", 2.0)
    recorder.step_failed("b", "exit 3", "/logs/b")
    assert recorder.result("a", "/o/a", elsewhere=False) == StepResult("a", StepOutcome.RAN, "/o/a", duration=2.0)
    assert recorder.result("b", "/o/b", elsewhere=False) == StepResult(
        "b", StepOutcome.FAILED, "/o/b", error="exit 3", log="/logs/b", retries={"failure": {"used": 1, "max": 3}})
    assert recorder.result("c", "/o/c", elsewhere=True).outcome is StepOutcome.FINISHED_ELSEWHERE
    assert recorder.result("d", "/o/d", elsewhere=False) == StepResult("d", StepOutcome.NOT_STARTED, "/o/d")
