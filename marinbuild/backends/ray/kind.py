"""Ray as a kind of backend: ``--backend ray`` places each step to run on the cluster's nodes.

At plan time the Ray cluster (``--ray-address``, ``RAY_ADDRESS``, else one started for the
run) is joined and every step to run is placed (:func:`~marinbuild.backends.ray.cluster.place`);
a step Ray cannot place (a TPU step kept on SSH) goes to the next kind of the run. A dry run
with no cluster named joins none. Steps on Ray take nothing of this machine's pools.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from marinbuild.backends.kinds import BackendKind, PlacedKind, PlanInput

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, WireInput
    from marinbuild.backends.ray.cluster import Placement
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request

__all__ = ["KIND", "RayKind", "RayPlaced"]


class RayPlaced(PlacedKind):
    """The steps Ray placed, as Ray tasks."""

    name = "ray"
    remote = True
    preemption_unknown = "Ray does not say which nodes may be preempted"

    def __init__(self, placements: Mapping[str, Placement | None]) -> None:
        self.placements = placements

    def takes(self, name: str, request: Request) -> bool:
        return self.placements.get(name) is not None

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        from marinbuild.backends.ray.backend import RayBackend, ship_project_code

        project = wire.project
        ship_project_code(project.marinfile.path)
        ray = RayBackend(project.graph, self.placements, fallback, fresh_output=wire.fresh_output, lease=wire.lease)
        return ray.backend_for


class RayKind(BackendKind):
    name = "ray"
    help = "a Ray cluster, --ray-address"
    options: Mapping[str, Any] = {"ray_address": None}

    def plan(self, given: PlanInput) -> PlacedKind | None:
        requests = {n: given.requests[n] for n in given.to_run}
        if not requests:
            return None
        address = given.options.get("ray_address")
        if given.dry and not (address or os.environ.get("RAY_ADDRESS")):
            # A Ray started for a dry run would offer this machine, which the local check covers
            # (and `plan` of a Ray project works where ray is not installed).
            return None
        from marinbuild.backends.ray.cluster import connect, place, require_ray

        require_ray()
        return RayPlaced(place(requests, connect(address, given.capacity)))


KIND = RayKind()
