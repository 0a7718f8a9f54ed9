"""The interface between the scheduler and whatever executes a step.

A backend starts a :class:`Job` and reports its :class:`Outcome` through a callback, from
any thread; the scheduler never waits on a backend directly. ``cancel`` asks a running job
to stop (Ctrl-C, a lost lease, a wall-time limit). A :class:`Grant` is what admission
reserved for the job: cores to pin, environment, wall-time limit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

__all__ = ["Backend", "Grant", "Job", "Outcome", "Running"]


@dataclass(frozen=True)
class Grant:
    """What admission handed a step: the allocation to release later, and what it implies."""

    allocation: Any = None
    cores: tuple[int, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float | None = None
    group: str | None = None


@dataclass(frozen=True)
class Job:
    """Everything a backend needs to execute one step once."""

    name: str
    output_path: str
    log_file: str
    """A local file receiving the step's stdout and stderr."""
    workdir: str
    env: Mapping[str, str]
    fn: Callable[[Any], Any] | None = None
    config: Any = None
    command: str | None = None
    cores: tuple[int, ...] = ()
    timeout: float | None = None
    attempt: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    previous_attempts: tuple[Mapping[str, Any], ...] | None = None
    """Attempts earlier runs of the step recorded in its ledger, read while it was prepared
    (off the run loop: on a remote store a read is a round trip); None: not read yet."""


@dataclass(frozen=True)
class Outcome:
    """How a job ended. ``error`` is one line for the summary when ``ok`` is false."""

    ok: bool
    started: float
    ended: float
    error: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    host: str | None = None
    """Where it ran, when not this machine (a Ray node)."""
    records: Mapping[str, str] = field(default_factory=dict)
    """Files to write with the step's record, before its final status (path -> text): the
    attempt ledger, so that it costs no round trip of its own."""

    @property
    def duration(self) -> float:
        return self.ended - self.started


class Running(Protocol):
    def cancel(self, reason: str) -> None:
        """Stop the job; its outcome still arrives through the callback."""


class Backend(Protocol):
    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Running:
        """Start ``job`` without blocking; call ``on_done`` exactly once when it ends."""
