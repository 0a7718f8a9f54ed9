"""Kinds of backend: what a run is told about each (:class:`BackendKind`), and what each takes
of one run (:class:`PlacedKind`), decided at plan time.

A plan loads this module and not :mod:`marinbuild.backends.base`, the interface of a backend that
runs steps (its :class:`~marinbuild.backends.base.Job` and
:class:`~marinbuild.backends.base.Outcome`), which only a run needs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marinbuild.errors import ResourceError

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, WireInput
    from marinbuild.capacity import Capacity
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request, ResourceConfig

__all__ = ["BackendKind", "PlacedKind", "PlanInput", "check_replicas"]


@dataclass(frozen=True)
class PlanInput:
    """What planning shows a kind: the project, every step's request, the capacity so far."""

    project: Any
    """The :class:`~marinbuild.project.Project` (its graph, prefix, storage and Marinfile)."""
    requests: Mapping[str, Request]
    to_run: tuple[str, ...]
    capacity: Capacity
    cluster: Mapping[str, Any] | None = None
    """The cluster file, decoded: each kind reads its own tables; None when no file is named."""
    cluster_source: str = "<cluster>"
    """Where the cluster file was read from, for messages."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The run options kinds declare (:attr:`BackendKind.options`), by name."""
    dry: bool = True
    """Nothing will run (``plan``, ``run -n``): a kind joins no cluster it need not."""
    allow_cross_region: bool = False


def check_replicas(name: str, rc: ResourceConfig, backend: str) -> None:
    """Refuse ``replicas`` above one on a backend that runs a step once (TPU steps: one per slice)."""
    from marinbuild.resources import TpuConfig

    if rc.replicas > 1 and not isinstance(rc.device, TpuConfig):
        raise ResourceError(
            f"step {name!r}: replicas={rc.replicas} is for TPU steps (one replica per slice); "
            f"the {backend} backend runs a step once"
        )


class PlacedKind:
    """What one kind takes of one run, decided at plan time; the defaults are a backend that
    runs steps elsewhere, once each, with no container and no say over preemption."""

    name: str = ""
    remote: bool = False
    """Steps it takes use nothing of this machine: admission hands them limits (wall time,
    thread counts), not cores, and planning does not fit them to this machine."""
    provision_timeout: float | None = None
    """How long its steps may go on failing to get hosts (the provisioning budget); None: the default."""

    def takes(self, name: str, request: Request) -> bool:
        """Whether this kind runs step ``name`` (the first kind of the run that takes it does)."""
        return True

    def offer(self, capacity: Capacity) -> Capacity:
        """This machine's capacity with what this kind adds to its pools (a cluster file's slices)."""
        return capacity

    def check_step(self, name: str, rc: ResourceConfig, request: Request) -> Request:
        """Refuse (:class:`~marinbuild.errors.ResourceError`) what of a step's fields this kind
        cannot honour; the request, narrowed where a field narrows it."""
        check_replicas(name, rc, self.name)
        if not rc.preemptible:
            raise ResourceError(
                f"step {name!r}: preemptible=False cannot be honoured on the {self.name} backend "
                f"({self.preemption_unknown})"
            )
        return request

    preemption_unknown: str = "it does not say which hosts may be preempted"

    def image(self, name: str, image: str, engine_for: Callable[[str], tuple[str | None, str]]) -> tuple[str, str]:
        """The (engine, image) a step's ``image=`` runs with, or a refusal."""
        raise ResourceError(f"step {name!r}: image={image!r} is not supported on the {self.name} backend")

    def settle(self, given: PlanInput, requests: Mapping[str, Request], capacity: Capacity
               ) -> tuple[Mapping[str, Request], Capacity]:
        """After the field checks: requests and capacity as this kind settles them (slices it will
        create, offered to admission)."""
        return requests, capacity

    def before_run(self, project: Any, echo: Callable[[str], None]) -> None:
        """Done before every run, even one with nothing to do: what a killed runner left (queued
        resources, jobs) is cleaned up. Trouble is a warning through ``echo``, not a stop."""

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        """The backend of each step: this kind's for the steps it takes, ``fallback(node)`` for the rest."""
        raise NotImplementedError(f"the {self.name} backend runs no steps")


class BackendKind:
    """A kind of backend as a run knows it; registered by name (:mod:`marinbuild.backends.registry`)."""

    name: str = ""
    help: str = ""
    """A few words for ``--backend``'s help."""
    choice: bool = True
    """Chosen with ``--backend`` (or ``DEFAULT_BACKEND``); False: it joins every run whose
    cluster file configures it, beside the chosen kind (TPU slices over SSH)."""
    cluster_keys: frozenset[str] = frozenset()
    """The cluster file's top-level keys it reads; a key no kind reads is refused."""
    options: Mapping[str, Any] = {}
    """The run options it reads (``marinbuild run`` flags and :func:`marinbuild.run` keywords), with defaults."""

    def plan(self, given: PlanInput) -> PlacedKind | None:
        """This kind's part of the run (plan time, no writes); None: it takes no step."""
        raise NotImplementedError
