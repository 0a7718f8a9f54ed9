"""Plan-time checks that every setting a step declares is honoured by the backend it runs on.

Accepting a setting and ignoring it is worse than refusing it, so before anything runs:

* ``pip_dependency_groups`` become each step's environment (an unknown extra is an error
  naming the step and the extras that exist);
* ``env_vars`` reach the step on every backend (a name the shell could not export is refused
  for TPU hosts);
* ``image`` runs locally in podman or docker when one of them really runs the image, and is
  refused otherwise, and on the TPU and Ray backends;
* ``disk`` is checked against the free space where outputs live when that is a local disk;
  a remote store cannot be asked, which is said once;
* ``replicas`` above one is for TPU steps (one replica per slice); elsewhere a step runs
  once, so it is refused;
* ``preemptible=False`` keeps a TPU step off slices the cluster file marks
  ``preemptible = true`` (an error when only such slices exist); on Ray, which cannot tell
  which nodes may vanish, it is refused.

Every refusal is a :class:`~marinbuild.errors.ResourceError` (exit 2) naming the step and the
backend.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from marinbuild.errors import ResourceError
from marinbuild.graph import StepGraph
from marinbuild.pyenv.spec import EnvSpec, environment_of
from marinbuild.resources import Request, ResourceConfig, Slices, TpuConfig
from marinbuild.units import format_bytes

if TYPE_CHECKING:
    from marinbuild.backends.tpu.cluster import Cluster

__all__ = ["FieldCheck", "backend_namer", "check_fields", "free_bytes"]

_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class FieldCheck:
    """What planning learned: requests narrowed to allowed slices, environments, images, notes."""

    requests: Mapping[str, Request]
    environments: Mapping[str, EnvSpec]
    images: Mapping[str, tuple[str, str]]
    """Step name -> (engine, image) for steps running locally in a container."""
    notes: tuple[str, ...] = ()
    """Lines to tell the user once (what could not be checked)."""


def backend_namer(requests: Mapping[str, Request], cluster: Cluster | None, on_ray: Callable[[str], bool]) -> Callable[[str], str]:
    """Which backend a step runs on, as the run wires them: ray where placed, tpu for slices, else local."""

    def backend_of(name: str) -> str:
        if on_ray(name):
            return "ray"
        return "tpu" if cluster is not None and requests[name].slices is not None else "local"

    return backend_of


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
    backend_of: Callable[[str], str],
    cluster: Cluster | None = None,
    engine_for: Callable[[str], tuple[str | None, str]] | None = None,
) -> FieldCheck:
    """Check the steps of a plan (raising on the first refusal); ``backend_of(name)``: local, tpu or ray.

    Environments are found for every step in ``names`` (``plan`` shows them); the other fields
    are checked only for the steps ``to_run``: a step that is up to date needs no disk or image.
    """
    narrowed = dict(requests)
    environments: dict[str, EnvSpec] = {}
    images: dict[str, tuple[str, str]] = {}
    notes: list[str] = []
    free: int | None = None
    for name in names:
        s = graph.nodes[name].step
        env = environment_of(name, s.pip_dependency_groups, marinfile)
        if env is not None:
            environments[name] = env
    for name in to_run:
        rc = graph.nodes[name].step.resources
        if not isinstance(rc, ResourceConfig):
            continue
        backend = backend_of(name)
        if rc.replicas > 1 and not isinstance(rc.device, TpuConfig):
            raise ResourceError(
                f"step {name!r}: replicas={rc.replicas} is for TPU steps (one replica per slice); "
                f"the {backend} backend runs a step once"
            )
        if rc.env_vars and backend == "tpu":
            bad = [k for k in rc.env_vars if not _SHELL_NAME.fullmatch(k)]
            if bad:
                raise ResourceError(f"step {name!r}: env_vars name {bad[0]!r} cannot be exported on the tpu backend")
        if rc.image is not None:
            if name in environments:
                raise ResourceError(f"step {name!r}: image= and pip_dependency_groups= cannot be combined ({backend} backend)")
            images[name] = _image(name, rc.image, backend, engine_for or _working_engine)
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
                        f"{format_bytes(free)} free ({backend} backend)"
                    )
        if not rc.preemptible:
            narrowed[name] = _not_preemptible(name, narrowed[name], backend, cluster)
    return FieldCheck(narrowed, environments, images, tuple(notes))


def _working_engine(image: str) -> tuple[str | None, str]:
    # Imported only for a step with an image to run: a run of none, or a no-op, never pays for it.
    from marinbuild.backends.container import working_engine

    return working_engine(image)


def _image(name: str, image: str, backend: str, engine_for: Callable[[str], tuple[str | None, str]]) -> tuple[str, str]:
    if backend != "local":
        raise ResourceError(f"step {name!r}: image={image!r} is not supported on the {backend} backend")
    engine, why = engine_for(image)
    if engine is None:
        raise ResourceError(
            f"step {name!r}: image={image!r} needs podman or docker that can run it on the local backend; "
            f"none here can ({why})"
        )
    return engine, image


def _not_preemptible(name: str, request: Request, backend: str, cluster: Cluster | None) -> Request:
    """The request narrowed to slices not marked preemptible (TPU); local machines are never preempted."""
    if backend == "ray":
        raise ResourceError(
            f"step {name!r}: preemptible=False cannot be honoured on the ray backend "
            "(Ray does not say which nodes may be preempted)"
        )
    if request.slices is None:
        return request
    slices = request.slices
    specs = cluster.slices if cluster is not None else ()
    stable = {s.name for s in specs if not s.preemptible and s.tpu_type in slices.tpu_types}
    if not stable and cluster is not None and cluster.gcp is not None and not cluster.gcp.spot:
        # No static slice will do, but slices created from [gcp] are not spot ones.
        return replace(request, slices=Slices(slices.tpu_type, slices.n, alternatives=slices.alternatives,
                                              names=slices.names, among=()))
    if not stable:
        offered = [s.name for s in specs if s.tpu_type in slices.tpu_types]
        raise ResourceError(
            f"step {name!r} asks for preemptible=False on the tpu backend but every slice of "
            f"{' or '.join(slices.tpu_types)} is marked preemptible ({', '.join(offered) or 'none offered'})"
        )
    among = stable if slices.among is None else stable & slices.among
    narrowed = Slices(slices.tpu_type, slices.n, alternatives=slices.alternatives, names=slices.names, among=among)
    return replace(request, slices=narrowed)
