"""What one run did with each step: its :class:`StepOutcome`, and the :class:`RunSummary` of them all.

:func:`marinbuild.run` returns a :class:`RunSummary`; the session's :class:`Recorder` fills it
from the scheduler's events. Only a run loads this module: a plan never does.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marinbuild.execution.reporting import NullReporter, Reporter, Summary

if TYPE_CHECKING:
    from marinbuild.execution.output_stream import OutputFollower

__all__ = ["Recorder", "RunSummary", "StepOutcome", "StepResult"]


class StepOutcome(enum.StrEnum):
    """What one run did with one step."""

    RAN = "ran"
    """Ran here and succeeded."""
    SKIPPED = "skipped"
    """Up to date when the run began."""
    FINISHED_ELSEWHERE = "finished elsewhere"
    """Another runner finished it while this run waited."""
    FAILED = "failed"
    NOT_STARTED = "not started"
    """Never started: a dependency failed, the run stopped, or it was refused."""


@dataclass(frozen=True)
class StepResult:
    """One step's fate in a run."""

    name: str
    outcome: StepOutcome
    output_path: str
    error: str | None = None
    log: str | None = None
    duration: float | None = None
    retries: Mapping[str, Any] | None = None
    """For a step that retried or failed: what it used of each retry budget,
    ``{"failure": {"used": 1, "max": 3}, "preemption": ..., "hang": ...}``."""


@dataclass(frozen=True)
class RunSummary:
    """What a run did, step by step.

    >>> s = RunSummary({"a": StepResult("a", StepOutcome.RAN, "/out/a-1", duration=0.5)})
    >>> s.ok, s.count(StepOutcome.RAN)
    (True, 1)
    >>> print(s)
    ran 1: a
    """

    steps: Mapping[str, StepResult]
    interrupted: bool = False

    @property
    def ok(self) -> bool:
        """True when nothing failed, nothing was left undone and the run was not interrupted."""
        return not self.interrupted and all(
            r.outcome not in (StepOutcome.FAILED, StepOutcome.NOT_STARTED) for r in self.steps.values()
        )

    def count(self, outcome: StepOutcome) -> int:
        return sum(1 for r in self.steps.values() if r.outcome is outcome)

    def names(self, outcome: StepOutcome) -> list[str]:
        return [n for n, r in self.steps.items() if r.outcome is outcome]

    def __str__(self) -> str:
        lines = []
        for outcome in StepOutcome:
            names = self.names(outcome)
            if names:
                lines.append(f"{outcome.value} {len(names)}: {', '.join(names)}")
        for r in self.steps.values():
            if r.outcome is StepOutcome.FAILED:
                lines.append(f"  {r.name}: {r.error}")
        if self.interrupted:
            lines.append("interrupted")
        return "\n".join(lines) if lines else "nothing to do"


@dataclass
class Recorder(NullReporter):
    """Passes every event on, and keeps each step's fate for the :class:`RunSummary`."""

    inner: Reporter
    results: dict[str, tuple[StepOutcome, str | None, str | None, float | None]] = field(default_factory=dict)

    def run_started(self, total: int, skipped: int) -> None:
        self.inner.run_started(total, skipped)

    follower: OutputFollower | None = None
    on_command: Callable[[str, str], None] | None = None

    def step_command(self, name: str, command: str) -> None:
        if self.on_command is not None:
            self.on_command(name, command)

    def step_starting(self, name: str, log_file: str) -> None:
        if self.follower is not None:
            self.follower.follow(name, log_file)
        starting = getattr(self.inner, "step_starting", None)
        if starting is not None:
            starting(name, log_file)

    def step_started(self, name: str, output: str) -> None:
        self.inner.step_started(name, output)

    def steps_waiting(self, counts: Mapping[str, int]) -> None:
        tell = getattr(self.inner, "steps_waiting", None)
        if tell is not None:
            tell(counts)

    def step_waiting(self, name: str, reason: str) -> None:
        self.inner.step_waiting(name, reason)

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self.results[name] = (StepOutcome.RAN, None, None, duration)
        if self.follower is not None:
            self.follower.finish(name)  # its last lines before the line saying it is done
        self.inner.step_finished(name, duration, capacity_wait)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.results[name] = (StepOutcome.FAILED, error, log, None)
        if self.follower is not None:
            self.follower.finish(name)
        self.inner.step_failed(name, error, log)

    def step_skipped(self, name: str, reason: str) -> None:
        self.results.setdefault(name, (StepOutcome.NOT_STARTED, reason, None, None))
        self.inner.step_skipped(name, reason)

    tally: dict[str, dict[str, Any]] = field(default_factory=dict)
    """What each step that retried or failed used of its retry budgets (filled by the retry loop)."""

    def run_finished(self, summary: Summary) -> None:
        summary.retries.update(self.tally)
        self.inner.run_finished(summary)

    def result(self, name: str, output_path: str, elsewhere: bool) -> StepResult:
        """Step ``name``'s fate once the run is over; ``elsewhere``: another runner finished it."""
        outcome, error, log, duration = self.results.get(name, (StepOutcome.NOT_STARTED, None, None, None))
        if elsewhere:
            outcome = StepOutcome.FINISHED_ELSEWHERE
        return StepResult(name, outcome, output_path, error, log, duration, self.tally.get(name))
