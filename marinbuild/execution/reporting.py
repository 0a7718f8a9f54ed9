"""What a run tells the outside world, through a small reporter interface.

The scheduler calls a :class:`Reporter`; the CLI picks one (a rich live view, JSON lines,
or nothing). Nothing here imports a terminal library.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TextIO

__all__ = ["Failure", "JsonReporter", "NullReporter", "PlainReporter", "Reporter", "Summary", "finished_text",
           "json_step_lines"]


def finished_text(duration: float, capacity_wait: float = 0.0) -> str:
    """``3.9 s`` or, for a step that first waited for machines made for it, ``3.9 s after 90 s waiting for capacity``."""
    if capacity_wait < 0.05:
        return f"{duration:.1f} s"
    waited = f"{capacity_wait:.0f}" if capacity_wait >= 10 else f"{capacity_wait:.1f}"
    return f"{duration:.1f} s after {waited} s waiting for capacity"


@dataclass(frozen=True)
class Failure:
    """A failed step for the end-of-run summary."""

    name: str
    error: str
    log: str


@dataclass
class Summary:
    """Counts and failures of one run."""

    total: int = 0
    done: int = 0
    skipped: int = 0
    failed: list[Failure] = field(default_factory=list)
    not_started: int = 0
    finished_elsewhere: list[str] = field(default_factory=list)
    """Steps another runner finished while this run waited for them (counted in ``done``)."""
    interrupted: bool = False
    started_at: float = field(default_factory=time.time)
    retries: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Steps that retried or failed, by name: what they used of each retry budget
    (``{"failure": {"used": 1, "max": 3}, ...}``)."""

    @property
    def ok(self) -> bool:
        return not self.failed and not self.interrupted and self.not_started == 0


class Reporter(Protocol):
    def run_started(self, total: int, skipped: int) -> None: ...
    def step_started(self, name: str, output: str) -> None: ...
    def step_waiting(self, name: str, reason: str) -> None: ...
    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None: ...
    def step_failed(self, name: str, error: str, log: str) -> None: ...
    def step_skipped(self, name: str, reason: str) -> None: ...
    def run_finished(self, summary: Summary) -> None: ...


class NullReporter:
    """Reports nothing."""

    def run_started(self, total: int, skipped: int) -> None:
        pass

    def step_started(self, name: str, output: str) -> None:
        pass

    def step_waiting(self, name: str, reason: str) -> None:
        pass

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        pass

    def step_failed(self, name: str, error: str, log: str) -> None:
        pass

    def step_skipped(self, name: str, reason: str) -> None:
        pass

    def run_finished(self, summary: Summary) -> None:
        pass


class JsonReporter(NullReporter):
    """One JSON object per event, one per line, for machines."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stdout

    def _emit(self, event: str, **fields: object) -> None:
        self.stream.write(json.dumps({"event": event, "time": time.time(), **fields}) + "\n")
        self.stream.flush()

    def step_started(self, name: str, output: str) -> None:
        self._emit("started", step=name, output=output)

    def step_waiting(self, name: str, reason: str) -> None:
        self._emit("waiting", step=name, reason=reason)

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self._emit("finished", step=name, duration=duration, capacity_wait=capacity_wait)

    def step_failed(self, name: str, error: str, log: str) -> None:
        self._emit("failed", step=name, error=error, log=log)

    def step_skipped(self, name: str, reason: str) -> None:
        self._emit("skipped", step=name, reason=reason)

    def run_finished(self, summary: Summary) -> None:
        self._emit(
            "summary",
            total=summary.total,
            done=summary.done,
            skipped=summary.skipped,
            failed=[f.name for f in summary.failed],
            not_started=summary.not_started,
            retries=summary.retries,
        )


class PlainReporter(NullReporter):
    """Plain lines for a library caller: what started, finished and failed (no terminal library)."""

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream or sys.stderr

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def step_started(self, name: str, output: str) -> None:
        self._line(f"start {name}  {output}")

    def step_waiting(self, name: str, reason: str) -> None:
        self._line(f"wait  {name}: {reason}")

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self._line(f"done  {name} ({finished_text(duration, capacity_wait)})")

    def step_failed(self, name: str, error: str, log: str) -> None:
        self._line(f"FAIL  {name}: {error}" + (f" (log: {log})" if log else ""))


def json_step_lines(event: str, stream: TextIO | None = None) -> Callable[[str, str], None]:
    """``(step, text)`` as JSON event lines: ``output`` events carry a ``line``, ``command`` events a ``command``."""
    key = "line" if event == "output" else event

    def emit(step: str, text: str) -> None:
        out = stream or sys.stdout
        out.write(json.dumps({"event": event, "time": time.time(), "step": step, key: text}) + "\n")
        out.flush()

    return emit
