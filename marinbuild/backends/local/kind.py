"""The local kind: steps run on this machine, in their Python environments and container images."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from marinbuild.backends.kinds import BackendKind, PlacedKind, PlanInput, check_replicas
from marinbuild.errors import ResourceError

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, WireInput
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request, ResourceConfig

__all__ = ["KIND", "LocalKind", "LocalPlaced", "local_runner"]


class LocalPlaced(PlacedKind):
    """This machine: it takes every step no other kind of the run took; nothing is ever preempted here."""

    name = "local"

    def check_step(self, name: str, rc: ResourceConfig, request: Request) -> Request:
        check_replicas(name, rc, self.name)
        return request

    def image(self, name: str, image: str, engine_for: Callable[[str], tuple[str | None, str]]) -> tuple[str, str]:
        engine, why = engine_for(image)
        if engine is None:
            raise ResourceError(
                f"step {name!r}: image={image!r} needs podman or docker that can run it on the local backend; "
                f"none here can ({why})"
            )
        return engine, image

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        runner = local_runner(wire)
        return lambda node: runner


def local_runner(wire: WireInput) -> Backend:
    """The local backend, running steps in their Python environments and container images."""
    from marinbuild.backends.container import InContainers
    from marinbuild.backends.environments import WithEnvironments
    from marinbuild.backends.local.backend import LocalBackend

    project = wire.project
    path, prefix = project.marinfile.path, project.graph.prefix
    runner: Backend = WithEnvironments(LocalBackend(), path, prefix)
    return InContainers(runner, wire.images, path, prefix) if wire.images else runner


class LocalKind(BackendKind):
    name = "local"
    help = "this machine"

    def plan(self, given: PlanInput) -> PlacedKind:
        return LocalPlaced()


KIND = LocalKind()
