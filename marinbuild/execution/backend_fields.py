"""Plan-time checks that every setting a step declares is honoured by the backend it runs on.

Accepting a setting and ignoring it is worse than refusing it, so before anything runs:

* ``pip_dependency_groups`` become each step's environment (an unknown extra is an error
  naming the step and the extras that exist);
* ``image`` runs where the step's kind of backend can run it (this machine: podman or docker
  that really runs the image) and is refused elsewhere; it cannot be combined with an
  environment;
* ``disk`` is checked against the free space where outputs live when that is a local disk;
  a remote store cannot be asked, which is said once;
* ``replicas``, ``env_vars`` names and ``preemptible=False`` are for the step's kind of
  backend to honour, narrow or refuse (:meth:`~marinbuild.backends.kinds.PlacedKind.check_step`).

Every refusal is a :class:`~marinbuild.errors.ResourceError` (exit 2) naming the step and the
backend.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marinbuild.errors import ResourceError
from marinbuild.graph import StepGraph
from marinbuild.resources import Request, ResourceConfig
from marinbuild.units import format_bytes

if TYPE_CHECKING:
    from marinbuild.backends.kinds import PlacedKind
    from marinbuild.pyenv.spec import EnvSpec

__all__ = ["FieldCheck", "check_fields", "free_bytes"]


@dataclass(frozen=True)
class FieldCheck:
    """What planning learned: requests narrowed to allowed slices, environments, images, notes."""

    requests: Mapping[str, Request]
    environments: Mapping[str, EnvSpec]
    images: Mapping[str, tuple[str, str]]
    """Step name -> (engine, image) for steps running locally in a container."""
    notes: tuple[str, ...] = ()
    """Lines to tell the user once (what could not be checked)."""


def free_bytes(path: str) -> int:
    """Free bytes on the file system holding ``path`` (or its nearest existing parent)."""
    here = os.path.abspath(path)
    while not os.path.exists(here):
        parent = os.path.dirname(here)
        if parent == here:
            break
        here = parent
    return shutil.disk_usage(here).free


def check_fields(
    graph: StepGraph,
    names: Iterable[str],
    requests: Mapping[str, Request],
    *,
    to_run: Iterable[str],
    marinfile: str,
    kind_of: Callable[[str], PlacedKind],
    engine_for: Callable[[str], tuple[str | None, str]] | None = None,
) -> FieldCheck:
    """Check the steps of a plan (raising on the first refusal); ``kind_of(name)``: the kind of
    backend the step runs on.

    Environments are found for every step in ``names`` (``plan`` shows them); the other fields
    are checked only for the steps ``to_run``: a step that is up to date needs no disk or image.
    """
    narrowed = dict(requests)
    environments: dict[str, EnvSpec] = {}
    images: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    free: int | None = None
    nodes = graph.nodes
    for name in names:
        groups = nodes[name].step.pip_dependency_groups
        if groups:  # most steps ask for no environment: not a call each, nor the module's load
            from marinbuild.pyenv.spec import environment_of

            env = environment_of(name, groups, marinfile)
            if env is not None:
                environments[name] = env
    for name in to_run:
        rc = graph.nodes[name].step.resources
        if not isinstance(rc, ResourceConfig):
            continue
        kind = kind_of(name)
        narrowed[name] = kind.check_step(name, rc, narrowed[name])
        if rc.image is not None:
            if name in environments:
                raise ResourceError(f"step {name!r}: image= and pip_dependency_groups= cannot be combined ({kind.name} backend)")
            images[name] = kind.image(name, rc.image, engine_for or _working_engine)
        if rc.disk:
            if "://" in graph.prefix:
                note = f"disk requests are not checked: free space of {graph.prefix} cannot be asked"
                if note not in notes:
                    notes.append(note)
            else:
                if free is None:
                    free = free_bytes(graph.prefix)
                if rc.disk > free:
                    raise ResourceError(
                        f"step {name!r} asks for disk={format_bytes(rc.disk)} but {graph.prefix} has "
                        f"{format_bytes(free)} free ({kind.name} backend)"
                    )
    return FieldCheck(narrowed, environments, images, tuple(notes))


def _working_engine(image: str) -> tuple[str | None, str]:
    # Imported only for a step with an image to run: a run of none, or a no-op, never pays for it.
    from marinbuild.backends.container import working_engine

    return working_engine(image)
