"""What the run loop takes off its queue besides a step's :class:`~marinbuild.backends.base.Outcome`.

Every one is put there by another thread (a lease heartbeat, a store thread, a signal
handler, the reader of the run's output) and handled on the loop alone, which is the only
place the scheduler's state changes. :class:`StoreDone` carries back what a step's store
work came to: a :class:`Claimed` on its way in, a :class:`Committed` on its way out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Job, Outcome

__all__ = ["WAKE", "ClaimLost", "Claimed", "Committed", "Stop", "StoreDone", "Wake"]


@dataclass(frozen=True)
class ClaimLost:
    """Event: the claim of a running step was lost; the step must be cancelled."""

    reason: str


@dataclass(frozen=True)
class StoreDone:
    """Event: a step's store work finished on a store thread; ``then(result)`` runs on the loop."""

    then: Callable[[Any], None]
    result: Any


@dataclass(frozen=True)
class Claimed:
    """What claiming and preparing a step came to (worked out on a store thread).

    ``kind``: ``go`` (``job`` and ``info`` set), ``done`` (finished elsewhere), ``wait``
    (leased elsewhere), ``busy`` (a dependency redone elsewhere), ``refused`` (the store
    refused the lease) or ``unprepared`` (it could not be prepared; its FAILED marker is
    written and its claim let go already).
    """

    kind: str
    why: str = ""
    job: Job | None = None
    info: dict[str, Any] | None = None


@dataclass(frozen=True)
class Committed:
    """How recording a step's outcome went (on a store thread); its claim is let go by then."""

    outcome: Outcome | None = None
    lost: str | None = None
    """Set when another runner holds the step now: nothing was recorded."""
    error: str | None = None
    """Set when the outcome could not be recorded."""


class Wake:
    """The event a Ctrl-C puts on the queue to end the loop's wait (handled as nothing)."""


WAKE = Wake()


@dataclass(frozen=True)
class Stop:
    """Event: another thread found the run cannot go on (the reader of its output went away)."""

    error: BaseException
