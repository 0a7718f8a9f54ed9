"""TPU slices over SSH as a kind of backend: the cluster file's slices (and ``[gcp]``) in a run.

This kind is no ``--backend`` choice: it joins every run whose cluster file declares slices
or a ``[gcp]`` table, and takes the steps that ask for TPU slices (the chosen kind, Ray or
Slurm, takes the rest). At plan time it offers the file's slices to admission, narrows a
``preemptible=False`` step to slices not marked preemptible, refuses environment variable
names a remote shell cannot export, and adds the slices ``[gcp]`` will create; before every
run it deletes the queued resources a killed runner left.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from marinbuild.backends.cluster_file import cluster_path
from marinbuild.backends.kinds import BackendKind, PlacedKind, PlanInput
from marinbuild.capacity import Capacity, with_overrides
from marinbuild.errors import ResourceError, missing_extra
from marinbuild.resources import Slices

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, WireInput
    from marinbuild.backends.tpu.cluster import Cluster
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request, ResourceConfig

__all__ = ["KIND", "TPU_KEYS", "TpuKind", "TpuPlaced", "tpu_cluster"]

TPU_KEYS = frozenset({"ssh", "slices", "max_parallel", "gcp", "progress_timeout"})
"""The cluster file's top-level keys this kind reads."""

_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def tpu_cluster(data: Mapping[str, Any] | None, source: str) -> Cluster | None:
    """The TPU part of a decoded cluster file; None when it declares no slices and no ``[gcp]``."""
    if data is None or not any(k in data for k in TPU_KEYS):
        return None
    from marinbuild.backends.tpu.cluster import parse_cluster

    return parse_cluster({k: v for k, v in data.items() if k in TPU_KEYS}, source=source)


def project_cluster(project: Any, path: str | None) -> Cluster | None:
    """The TPU cluster a run of ``project`` uses: ``path``, else the Marinfile's ``DEFAULT_CLUSTER``."""
    from marinbuild.backends.cluster_file import read_cluster_file
    from marinbuild.backends.registry import kinds

    chosen = cluster_path(project.workdir, project.marinfile.default("DEFAULT_CLUSTER"), path)
    if chosen is None:
        return None
    known = {key for kind in kinds() for key in kind.cluster_keys}
    return tpu_cluster(read_cluster_file(chosen, known), chosen)


class TpuPlaced(PlacedKind):
    """The steps holding TPU slices, run over SSH on the cluster file's (or created) slices."""

    name = "tpu"

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        gcp = cluster.gcp
        self.provision_timeout = float(gcp.provision_timeout) if gcp is not None and gcp.provision_timeout else None

    def takes(self, name: str, request: Request) -> bool:
        return request.slices is not None

    def offer(self, capacity: Capacity) -> Capacity:
        return with_overrides(capacity, slices=self.cluster.slices_by_type())

    def check_step(self, name: str, rc: ResourceConfig, request: Request) -> Request:
        from marinbuild.backends.kinds import check_replicas

        check_replicas(name, rc, self.name)
        bad = [k for k in rc.env_vars if not _SHELL_NAME.fullmatch(k)]
        if bad:
            raise ResourceError(f"step {name!r}: env_vars name {bad[0]!r} cannot be exported on the tpu backend")
        return request if rc.preemptible else self._not_preemptible(name, request)

    def _not_preemptible(self, name: str, request: Request) -> Request:
        """The request narrowed to slices not marked preemptible."""
        if request.slices is None:
            return request
        slices, cluster = request.slices, self.cluster
        specs = cluster.slices
        stable = {s.name for s in specs if not s.preemptible and s.tpu_type in slices.tpu_types}
        if not stable and cluster.gcp is not None and not cluster.gcp.spot:
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

    def settle(self, given: PlanInput, requests: Mapping[str, Request], capacity: Capacity
               ) -> tuple[Mapping[str, Request], Capacity]:
        """TPU steps no static slice serves get slices created from ``[gcp]``, offered to admission;
        their prefix and ``gs://`` inputs must lie in the zone's region (a one-line refusal otherwise)."""
        cluster = self.cluster
        if cluster.gcp is None:
            return requests, capacity
        from marinbuild.backends.tpu.provision_plan import created_slices, is_created_slice

        to_run = list(given.to_run)
        narrowed, offered = created_slices(cluster, dict(requests), to_run)
        if not offered:
            return narrowed, capacity
        capacity = with_overrides(capacity, slices={t: (*capacity.slices.get(t, ()), *names) for t, names in offered.items()})
        from marinbuild.backends.tpu.preflight import preflight

        preflight(cluster.gcp, offered)  # credentials, project, the TPU API, the zone's types and images
        if not given.allow_cross_region:
            from marinbuild.backends.tpu.regions import check_regions, gs_inputs
            from marinbuild.store.buckets import bucket_locations

            graph = given.project.graph
            inputs = {
                n: list(gs_inputs(graph.nodes[n].step.config)) for n in to_run
                if (sl := narrowed[n].slices) is not None and sl.among and all(is_created_slice(a) for a in sl.among)
            }
            check_regions(cluster.gcp.zone, cluster.gcp.region, graph.prefix, inputs, bucket_locations)
        return narrowed, capacity

    def before_run(self, project: Any, echo: Callable[[str], None]) -> None:
        """Queued resources an earlier runner made under this prefix and left (SIGKILL): deleted
        when no live runner's lease holds their step. Trouble with the API is a warning, not a stop."""
        if self.cluster.gcp is None:
            return
        from marinbuild.backends.tpu.leftovers import delete_unheld, find_made
        from marinbuild.backends.tpu.tpu_api import TpuApi
        from marinbuild.errors import MarinbuildError

        try:
            with TpuApi(self.cluster.gcp) as api:
                delete_unheld(api, find_made(api, project.graph.prefix, project.storage),
                              say=lambda line: echo(f"marinbuild: {line}"))
        except MarinbuildError as e:
            echo(f"marinbuild: warning: leftover queued resources not checked: {e}")

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        """Steps holding TPU slices go to the SSH gang backend; the rest to ``fallback``."""
        try:
            from marinbuild.backends.tpu.backend import TpuDispatch
        except ImportError as e:
            raise missing_extra(e, "TPU steps") or e from None

        project = wire.project
        tpu = TpuDispatch(self.cluster, marinfile=project.marinfile.path, prefix=project.graph.prefix,
                          sync=wire.sync, console=wire.echo, output=wire.output)
        requests = wire.requests
        return lambda node: tpu if requests[node.name].slices is not None else fallback(node)


class TpuKind(BackendKind):
    name = "tpu"
    help = "TPU slices over SSH"
    choice = False
    cluster_keys = TPU_KEYS

    def plan(self, given: PlanInput) -> PlacedKind | None:
        cluster = tpu_cluster(given.cluster, given.cluster_source)
        return TpuPlaced(cluster) if cluster is not None else None


KIND = TpuKind()
