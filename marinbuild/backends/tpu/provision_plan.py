"""At plan time: which TPU steps get slices created for them, and the slices admission may hand out.

A step whose ``with_tpu(TYPE, slice_count=K)`` no static ``[[slices]]`` entry can serve (fewer
than K slices of its types) gets K slices *to be created* when the cluster file has a ``[gcp]``
table. They are offered to admission as slices named ``@gcp/<n>/<i>``, reserved for that
step alone, so that steps are admitted as usual and every step needing created slices may
run at once; the TPU backend turns such names into a queued resource when the step starts.

>>> from marinbuild.backends.tpu.cluster import parse_cluster
>>> from marinbuild.resources import Request, Slices
>>> cluster = parse_cluster({"gcp": {"project": "my-project", "zone": "us-central2-b", "runtime_version": "r"}})
>>> requests, offered = created_slices(cluster, {"train": Request(slices=Slices("v4-32", 2))}, ["train"])
>>> offered
{'v4-32': ('@gcp/0/0', '@gcp/0/1')}
>>> is_created_slice(requests["train"].slices.among and sorted(requests["train"].slices.among)[0])
True
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from marinbuild.backends.tpu.cluster import Cluster
from marinbuild.resources import Request, Slices

__all__ = ["CREATED_SLICE_MARK", "created_slices", "is_created_slice"]

CREATED_SLICE_MARK = "@gcp/"
"""Names of slices to be created start with this (no cluster file may name a slice so)."""


def is_created_slice(name: object) -> bool:
    """Whether a slice name stands for a slice created on demand."""
    return isinstance(name, str) and name.startswith(CREATED_SLICE_MARK)


def _served(cluster: Cluster, slices: Slices) -> bool:
    static = cluster.slices_by_type()
    for tpu_type in slices.tpu_types:
        names = [n for n in static.get(tpu_type, ()) if slices.among is None or n in slices.among]
        if len(names) >= slices.n:
            return True
    return False


def created_slices(
    cluster: Cluster, requests: Mapping[str, Request], names: Iterable[str]
) -> tuple[dict[str, Request], dict[str, tuple[str, ...]]]:
    """Requests of ``names`` narrowed to slices to be created where no static slice serves them.

    Returns every request (changed or not) and the created slices to offer, per TPU type.
    Without a ``[gcp]`` table nothing changes. A step that lists alternatives gets its first type.
    """
    out = dict(requests)
    offered: dict[str, list[str]] = {}
    if cluster.gcp is None:
        return out, {}
    for n, name in enumerate(names):
        req = requests[name]
        if req.slices is None or req.slices.names is not None or _served(cluster, req.slices):
            continue
        mine = tuple(f"{CREATED_SLICE_MARK}{n}/{i}" for i in range(req.slices.n))
        offered.setdefault(req.slices.tpu_type, []).extend(mine)
        out[name] = replace(req, slices=Slices(req.slices.tpu_type, req.slices.n, among=mine))
    return out, {t: tuple(v) for t, v in offered.items()}
