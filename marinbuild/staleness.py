"""Whether a step runs, and why: the one place staleness is decided.

``run``, ``plan``, ``status`` and ``why`` all call :func:`decide`. A decision is a small
value, an action and a one-line reason, so that every view can show it.

>>> decide(None, forced=None).reason
'new'
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, UNREADABLE, StatusRecord

__all__ = ["Action", "Change", "Decision", "decide", "describe_changes", "diff_payloads"]


class Action(enum.StrEnum):
    RUN = "run"
    SKIP = "skip"
    WAIT = "wait"


@dataclass(frozen=True)
class Decision:
    """What happens to a step in this plan, and the reason shown to the user."""

    action: Action
    reason: str
    forced: bool = field(default=False, compare=False)
    """Whether the step runs because it (or a step upstream) was forced: it starts over."""


_NEW = Decision(Action.RUN, "new")
_UP_TO_DATE = Decision(Action.SKIP, "up to date")


def decide(record: StatusRecord | None, forced: str | None, rerun_inputs: str | None = None) -> Decision:
    """Decide from a step's stored status and whether (and by what) it is forced.

    ``forced`` is None, ``"forced"``, or a reason such as ``"upstream X forced"``. A step
    another runner holds a live lease on waits for it, forced or not. A status written for
    another identity (``mismatch``) or one that cannot be read counts as no status: the
    step runs, and the reason says whose marker, or which file, was found. ``rerun_inputs``
    says which dependency's output was rewritten since this step's ``SUCCESS`` read it
    (see :mod:`marinbuild.input_times`): the step runs again, like make's newer prerequisite.
    """
    if record is not None and record.status == RUNNING and record.leased_by:
        return Decision(Action.WAIT, f"waiting: leased by {record.leased_by}")
    if forced:
        return Decision(Action.RUN, forced, forced=True)
    if record is None:
        return _NEW
    if record.mismatch:
        return Decision(Action.RUN, f"its output path holds the {record.mismatch}, not this identity")
    if record.status == SUCCESS:
        if rerun_inputs is not None:
            return Decision(Action.RUN, rerun_inputs)
        return _UP_TO_DATE
    if record.status == UNREADABLE:
        return Decision(Action.RUN, f"unreadable status marker {record.error}")
    if record.status == FAILED:
        error = f": {record.error}" if record.error else ""
        return Decision(Action.RUN, f"failed before{error}")
    if record.status == RUNNING:
        return Decision(Action.RUN, "incomplete: an earlier run did not finish")
    return Decision(Action.RUN, f"unknown status {record.status!r}")


@dataclass(frozen=True)
class Change:
    """One difference between two identity payloads."""

    kind: str  # "versioned" or "dependency"
    path: str
    old: Any
    new: Any

    def line(self) -> str:
        if self.kind == "dependency":
            return f"dependency {self.path}: {_show(self.old)} -> {_show(self.new)}"
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"


_MISSING = "<absent>"


def diff_payloads(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[Change]:
    """Field-level differences between an earlier identity payload and the current one."""
    changes: list[Change] = []
    for kind, key in (("versioned", "versioned"), ("dependency", "dependencies")):
        before = old.get(key) or {}
        after = new.get(key) or {}
        for path in sorted(set(before) | set(after)):
            a, b = before.get(path, _MISSING), after.get(path, _MISSING)
            if a != b:
                changes.append(Change(kind, path, a, b))
    return changes


def describe_changes(changes: list[Change], limit: int = 3) -> str:
    """A one-line summary of changes, for the plan's reason column."""
    if not changes:
        return "changed (identity differs, payload equal)"
    shown = "; ".join(c.line() for c in changes[:limit])
    more = f" (+{len(changes) - limit} more)" if len(changes) > limit else ""
    return f"changed: {shown}{more}"


def _show(value: Any) -> str:
    if value == _MISSING:
        return _MISSING
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True)
