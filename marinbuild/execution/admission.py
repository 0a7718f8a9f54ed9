"""Admission: whether a ready step's resources are free now, and what it is given.

This joins the plan to the allocator. Every step's request is computed once, checked at
plan time against the total capacity (a request nothing could ever satisfy is an error
naming the step and the field, never a hang), and allocated all-or-nothing when the step
is about to start. Wall-time limits come from the request or, for a ``WTime(group=...)``,
from the group's recorded history; with ``--walltime`` a step whose soft limit exceeds the
time left in the run is not started.

With ``-j N`` a step that declares no resources takes no core: ``-j`` alone limits such
steps, as ``make -j`` does (the scheduler counts them), while a step that declares
resources is still allocated what it asks for. Without ``-j`` it counts as one core.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING

from marinbuild.capacity import Capacity
from marinbuild.execution.allocator import Allocation, Allocator, check_fits, shortage
from marinbuild.graph import StepGraph, StepNode
from marinbuild.resources import Request, WTime, as_request
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from marinbuild.backends.base import Grant

__all__ = ["RemoteAdmission", "ResourceAdmission", "check_plan_fits", "describe_request", "requests_of"]

LEASE_WAIT = "a lease held by another runner"
"""What a step leased elsewhere waits on, as the live view says it."""
JOBS_WAIT = "the -j limit"
"""What a ready step waits on when ``-j`` steps already run."""


def requests_of(graph: StepGraph, names: Iterable[str]) -> dict[str, Request]:
    """Each named step's resources as a request (no resources: one core, no memory)."""
    # Most steps share one resources object (often None): convert each object once.
    by_object: dict[int, Request] = {}
    out: dict[str, Request] = {}
    for n in names:
        resources = graph.nodes[n].step.resources
        key = id(resources)
        if key not in by_object:
            by_object[key] = as_request(resources)
        out[n] = by_object[key]
    return out


def check_plan_fits(requests: Mapping[str, Request], capacity: Capacity) -> None:
    """Refuse, before anything runs, a step that could never fit (ResourceError, exit 2)."""
    checked: set[int] = set()
    for name, request in requests.items():
        if id(request) not in checked:
            check_fits(name, request, capacity)
            checked.add(id(request))


def describe_request(request: Request) -> str:
    """Short text for the plan's resources column."""
    return repr(request)


class ResourceAdmission:
    """The scheduler's admission gate over an :class:`~marinbuild.execution.allocator.Allocator`."""

    def __init__(
        self,
        capacity: Capacity,
        requests: Mapping[str, Request],
        prefix: str,
        walltime: float | None = None,
        jobs: int | None = None,
    ) -> None:
        self.allocator = Allocator(capacity)
        self.requests = requests
        self.jobs = jobs
        self._deadline = time.monotonic() + walltime if walltime is not None else None
        self._machine_has_gpus = bool(capacity.gpus)
        groups = any(r.group for r in requests.values())
        self._estimator = _estimator(prefix) if groups else None

    def _wtime(self, node: StepNode) -> WTime | None:
        wtime = self.requests[node.name].wtime
        if wtime is not None and self._estimator is not None:
            wtime = self._estimator.resolve(wtime)
        return wtime

    def refusal(self, node: StepNode) -> str | None:
        """Why the step must not start at all in this run (its soft limit exceeds the time left)."""
        if self._deadline is None:
            return None
        wtime = self._wtime(node)
        soft = wtime.softT if wtime is not None else None
        left = self._deadline - time.monotonic()
        if soft is not None and soft > left:
            return f"not started: soft wall time {soft:g} s exceeds the {max(left, 0):.0f} s left (--walltime)"
        if left <= 0:
            return "not started: --walltime is used up"
        return None

    def waits_on(self, node: StepNode) -> str:
        """What the step's request lacks now, in a word or two ("cores", "memory", "a GPU")."""
        return shortage(self.requests[node.name], self.allocator.free)

    def try_acquire(self, node: StepNode) -> Grant | None:
        pinned = node.step.resources is not None
        counted = None
        if pinned or self.jobs is None:
            counted = self.allocator.try_allocate(self.requests[node.name])
            if counted is None:
                return None
        # -j given: a step that declares nothing is limited by -j alone and takes no core.
        request = counted.request if counted is not None else self.requests[node.name]
        allocation = Allocation(request, machine_has_gpus=self._machine_has_gpus)
        wtime = self._wtime(node)
        env = allocation.env()
        # A step that declares nothing counts as one core but is not pinned: pinned, a
        # stream of short default steps queued on their own core while the other sat idle
        # (15% slower over 3,000 trivial steps on 2 cores).
        if not pinned:
            env.pop("MARINBUILD_CORES", None)
        from marinbuild.backends.base import Grant  # the run machinery: `plan` only sizes requests

        return Grant(
            allocation=allocation if counted is not None else None,
            cores=allocation.request.core_ids if pinned else (),
            env=tuple(env.items()),
            timeout=wtime.T if wtime is not None else None,
            group=wtime.group if wtime is not None else None,
        )

    def release(self, grant: Grant, duration: float | None = None) -> None:
        """Return the allocation; a successful run's duration feeds its wall-time group."""
        if grant.allocation is not None:
            self.allocator.release(grant.allocation)
        if duration is not None and grant.group and self._estimator is not None:
            self._estimator.record(grant.group, duration)


def _estimator(prefix: str):  # type: ignore[no-untyped-def]
    from marinbuild.walltime import WallTimeEstimator

    return WallTimeEstimator(Storage.join(prefix, ".marinbuild", "walltime.json"))


class RemoteAdmission:
    """The scheduler's gate when a remote backend runs some steps: it hands out limits, the
    backend's cluster the resources.

    Steps that run elsewhere get no local allocation: their grant carries the environment a
    local step would see (thread counts from the core request, ``MARINBUILD_MEMORY``) and the
    wall-time limit. The other steps go through this machine's pools as they would otherwise;
    ``--walltime`` applies to all.
    """

    def __init__(self, local: ResourceAdmission, elsewhere: Collection[str]) -> None:
        self.local = local
        self.elsewhere = frozenset(elsewhere)

    def refusal(self, node: StepNode) -> str | None:
        return self.local.refusal(node)

    def try_acquire(self, node: StepNode) -> Grant | None:
        if node.name not in self.elsewhere:
            return self.local.try_acquire(node)
        from marinbuild.backends.base import Grant  # the run machinery: `plan` only sizes requests

        request = self.local.requests[node.name]
        wtime = self.local._wtime(node)
        return Grant(
            env=tuple(Allocation(request).env().items()),
            timeout=wtime.T if wtime is not None else None,
            group=wtime.group if wtime is not None else None,
        )

    def release(self, grant: Grant, duration: float | None = None) -> None:
        self.local.release(grant, duration)
