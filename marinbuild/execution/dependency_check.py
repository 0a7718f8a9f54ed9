"""Right before a step starts: its dependencies still hold the SUCCESS it was planned on, and nobody redoes them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from marinbuild.errors import MarinbuildError
from marinbuild.graph import StepNode
from marinbuild.store.lease import LeaseRecord, LeaseSettings, Owner, Verdict, judge, observe, read_leases
from marinbuild.store.markers import RUNNING, SUCCESS, StatusRecord, read_statuses, status_path

if TYPE_CHECKING:
    from marinbuild.execution.run_context import RunContext

__all__ = ["DependencyBusy", "DependencyChanged", "check_dependencies", "describe_status"]


class DependencyBusy(MarinbuildError):
    """A dependency is being redone by another runner: the step waits, it has not failed."""


class DependencyChanged(MarinbuildError):
    """A dependency no longer holds the ``SUCCESS`` the step was planned on, and nobody redoes it."""


def check_dependencies(ctx: RunContext, node: StepNode) -> dict[str, float]:
    """Right before a step starts: every dependency still holds ``SUCCESS`` and nobody redoes it.

    The plan was made from statuses read earlier; meanwhile another runner may have begun
    a forced rerun of a dependency (``run a --force a``), rewriting its output in place.
    A dependency whose lease another live runner holds is being redone (or about to be):
    :class:`DependencyBusy`, the step waits and is asked again a poll interval later. A
    lease seen unchanged for its expiry is a dead runner's and does not count. A dependency
    whose status is not ``SUCCESS`` for its identity and that nobody holds raises
    :class:`DependencyChanged`. Returns each dependency's status time, which
    :func:`commit` compares once the step has run.
    """
    if not node.deps:
        return {}
    outputs = {d: ctx.outputs[d] for d in node.deps}
    identities = {ctx.outputs[d]: ctx.identities[d] for d in node.deps if d in ctx.identities}
    statuses = read_statuses(ctx.storage, outputs.values(), identities)
    leases = read_leases(ctx.storage, outputs.values())
    seen: dict[str, float] = {}
    now = time.monotonic()
    for dep, out in outputs.items():
        record = statuses.get(out)
        if out in leases:
            holder = _live_holder(ctx, out, leases[out], now)
            if holder is not None:
                raise DependencyBusy(f"dependency {dep} is being redone: leased by {holder}")
        ctx.dependency_leases.pop(out, None)
        if record is None or record.mismatch or record.status != SUCCESS:
            raise DependencyChanged(f"dependency {dep} is no longer done: {describe_status(record, status_path(out))}; run it again")
        seen[dep] = record.time
    return seen


def _live_holder(ctx: RunContext, out: str, lease: LeaseRecord | None, now: float) -> str | None:
    """Who holds a dependency's lease, or None when that lease is a dead runner's."""
    watch = ctx.dependency_leases[out] = observe(ctx.dependency_leases.get(out), repr(lease), now)
    nobody = Owner("", 0, "", "not-a-runner")  # a dependency's lease is never this step's own
    if judge(lease, True, watch, now, nobody, _DEPENDENCY_LEASES) in (Verdict.ORPHANED, Verdict.EXPIRED):
        return None
    return lease.describe() if lease is not None else "an unreadable lease"


_DEPENDENCY_LEASES = LeaseSettings()
"""Expiry for a dependency's lease that states none; a lease's own expiry wins."""


def describe_status(record: StatusRecord | None, path: str) -> str:
    """A dependency's status as a reason: missing, another identity's, failed, or what it is."""
    if record is None:
        return f"no status at {path}"
    if record.mismatch:
        return f"{path} holds the {record.mismatch}"
    if record.error and record.status not in (SUCCESS, RUNNING):
        return f"{record.status} ({record.error})"
    return f"{record.status} at {path}"
