"""Accelerator-hours: what each attempt held and for how long, and estimates from earlier runs.

Every attempt in a step's ledger (``attempts.json``) records what it held (``held``) and
which backend ran it, on which runner::

    {"attempt": 2, "class": "SUCCESS", "duration_s": 5400.0, "backend": "tpu", "runner": "box",
     "held": {"cores": 0, "tpu_type": "v4-32", "slices": 2, "tpu_chips": 32, "tpu_hosts": 8}}

so that its cost is ``duration x held``: TPU chip-hours (chips from the slice type, see
:mod:`marinbuild.tpu_types`, times the number of slices), GPU-hours and core-hours.
*Accelerator-hours* are chip-hours plus GPU-hours. An attempt recorded before ``held``
existed is costed with the ``held`` of its run's info JSON, when there is one.

:func:`estimate` predicts a step's duration and accelerator-hours from its earlier
successful runs under the prefix (any identity of the same step name): the median of
each, or nothing when there is no history.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from marinbuild.errors import ResourceError
from marinbuild.resources import as_request
from marinbuild.store.json_text import loads_or_none, number_or_none
from marinbuild.tpu_types import tpu_topology

__all__ = [
    "Estimate",
    "Usage",
    "attempt_usage",
    "estimate",
    "estimates_for",
    "held_by",
    "parse_time",
    "provisioned_usage",
    "run_attempts",
]

def held_by(resources: Any, cores: Sequence[int] = ()) -> dict[str, Any]:
    """What a step with ``resources`` holds while it runs (``cores``: the cores it was pinned to).

    >>> from marinbuild.resources import ResourceConfig
    >>> held_by(ResourceConfig.with_tpu("v4-32", slice_count=2))
    {'cores': 0, 'tpu_type': 'v4-32', 'slices': 2, 'tpu_chips': 32, 'tpu_hosts': 8}
    >>> held_by(ResourceConfig.with_gpu("H100", count=2))
    {'cores': 1, 'gpus': 2, 'gpu_type': 'H100'}
    >>> held_by(None)
    {'cores': 1}
    """
    request = as_request(resources)
    if request.slices is not None:
        top = tpu_topology(request.slices.tpu_type)  # alternatives share the shape, hence the chips
        n = request.slices.n
        return {"cores": 0, "tpu_type": top.name, "slices": n, "tpu_chips": top.chips * n, "tpu_hosts": top.vm_count * n}
    held: dict[str, Any] = {"cores": len(cores) or (request.cores.N if request.cores is not None else 1)}
    if request.gpus is not None:
        held["gpus"] = request.gpus.n
        if request.gpus.gpu_type:
            held["gpu_type"] = request.gpus.gpu_type
    return held


@dataclass(frozen=True)
class Usage:
    """Hours held: wall-clock hours, and each kind of hardware times those hours."""

    hours: float = 0.0
    core_hours: float = 0.0
    gpu_hours: float = 0.0
    chip_hours: float = 0.0

    @property
    def accelerator_hours(self) -> float:
        """TPU chip-hours plus GPU-hours."""
        return self.chip_hours + self.gpu_hours

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.hours + other.hours,
            self.core_hours + other.core_hours,
            self.gpu_hours + other.gpu_hours,
            self.chip_hours + other.chip_hours,
        )

    def to_json(self) -> dict[str, float]:
        return {
            "hours": round(self.hours, 6),
            "core_hours": round(self.core_hours, 6),
            "gpu_hours": round(self.gpu_hours, 6),
            "tpu_chip_hours": round(self.chip_hours, 6),
            "accelerator_hours": round(self.accelerator_hours, 6),
        }


def attempt_usage(entry: Mapping[str, Any], fallback: Mapping[str, Any] | None = None) -> Usage:
    """The hours one ledger entry held (``fallback``: its run's ``held`` when the entry has none).

    >>> attempt_usage({"duration_s": 1800, "held": {"cores": 0, "tpu_chips": 16}}).chip_hours
    8.0
    >>> attempt_usage({"duration_s": 3600, "held": {"cores": 1, "gpus": 2}}).accelerator_hours
    2.0
    >>> attempt_usage({"duration_s": 600, "cause": "provisioning", "held": {"tpu_chips": 16}}).chip_hours
    0.0
    """
    if entry.get("cause") == "provisioning":
        # It got no hosts (its queued resource never turned ACTIVE): nothing ran or was held by
        # the step; the queued resource's own hours are provisioned_usage's.
        return Usage()
    own = entry.get("held")
    held: Mapping[str, Any] = own if isinstance(own, Mapping) else fallback or {}
    duration = number_or_none(entry.get("duration_s"))
    hours = duration / 3600 if duration is not None and 0 < duration < math.inf else 0.0
    return Usage(
        hours,
        hours * _number(held.get("cores")),
        hours * _number(held.get("gpus")),
        hours * _number(held.get("tpu_chips")),
    )


def provisioned_usage(entry: Mapping[str, Any]) -> Usage:
    """The hours the TPU slices created for one attempt were held: ACTIVE to deleted, whether
    the step ran on them or not (``provisioned`` in the ledger entry; none for static slices),
    or until ``still_held_at`` for one whose delete only the runner's exit achieved.

    >>> attempt = {"provisioned": [{"tpu_type": "v4-32", "slices": 2, "created_at": 100, "deleted_at": 1900}]}
    >>> provisioned_usage(attempt).chip_hours   # 2 slices x 16 chips x half an hour
    16.0
    >>> waited = {"provisioned": [{"tpu_type": "v4-32", "slices": 2, "created_at": 0, "active_at": 100, "deleted_at": 1900}]}
    >>> provisioned_usage(waited).chip_hours, provisioned_usage({"provisioned": [{**waited["provisioned"][0], "active_at": None}]}).chip_hours
    (16.0, 0.0)
    """
    total = Usage()
    held = entry.get("provisioned")
    for p in held if isinstance(held, list) else ():
        if not isinstance(p, Mapping):
            continue
        # One whose deletes kept failing until the step's record was written (the runner's exit
        # deleted it) counts until it was last found held.
        # Chips are billed from ACTIVE: a queued resource waiting for capacity holds none (its
        # waiting is shown apart). Records older than ``active_at`` count from their creation.
        created = _number(p.get("active_at")) if "active_at" in p else _number(p.get("created_at"))
        deleted = _number(p.get("deleted_at")) or _number(p.get("still_held_at"))
        if not created or deleted < created:
            continue
        hours = (deleted - created) / 3600
        try:
            chips = tpu_topology(str(p.get("tpu_type"))).chips * max(1, int(_number(p.get("slices"))))
        except ResourceError:
            chips = 0
        total = total + Usage(hours, 0.0, 0.0, hours * chips)
    return total


def _number(value: Any) -> float:
    return number_or_none(value) or 0.0


def parse_time(text: Any) -> float | None:
    """Seconds since the epoch of a ledger timestamp (ISO 8601), or None."""
    if isinstance(text, (int, float)):
        return number_or_none(text)
    if not isinstance(text, str):
        return None
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def run_attempts(attempts: Iterable[Mapping[str, Any]], info: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    """The ledger entries of the run ``info`` describes (started within it); all of them without one."""
    entries = list(attempts)
    if not info:
        return entries
    start, end = info.get("start_time"), info.get("end_time")
    if not isinstance(start, (int, float)):
        return entries
    stop = float(end) + 1 if isinstance(end, (int, float)) else float("inf")
    # A little slack: the ledger's clock and the info's are the same machine's, rounded.
    return [e for e in entries if (t := parse_time(e.get("started_at"))) is not None and start - 1 <= t <= stop]


@dataclass(frozen=True)
class Estimate:
    """A step's expected duration and hours: medians over its earlier successful runs."""

    runs: int
    duration_s: float
    usage: Usage

    def to_json(self) -> dict[str, Any]:
        return {"runs": self.runs, "duration_s": round(self.duration_s, 3), **self.usage.to_json()}


def estimate(runs: Sequence[tuple[float, Usage]]) -> Estimate | None:
    """The median duration and the median of each kind of hours of ``runs``; None without any.

    >>> e = estimate([(10.0, Usage(1, 0, 0, 4.0)), (30.0, Usage(1, 0, 0, 8.0)), (20.0, Usage(1, 0, 0, 6.0))])
    >>> e.duration_s, e.usage.chip_hours
    (20.0, 6.0)
    """
    if not runs:
        return None
    import statistics  # with fractions and decimal, a few ms of every plan's start

    med = statistics.median
    usages = [u for _, u in runs]
    return Estimate(
        len(runs),
        med(d for d, _ in runs),
        Usage(
            med(u.hours for u in usages),
            med(u.core_hours for u in usages),
            med(u.gpu_hours for u in usages),
            med(u.chip_hours for u in usages),
        ),
    )


def estimates_for(storage: Any, graph: Any, names: Sequence[str], index: Any = None) -> dict[str, Estimate | None]:
    """An estimate for each named step from its earlier successful runs under the prefix.

    Reads the info JSON and the ledger of every earlier output of those step names (one
    listing per folder, then one batch read of each kind). ``index``: the
    :class:`~marinbuild.history.RunIndex` of ``names``, when the caller listed them already.
    """
    from marinbuild.history import RunIndex
    from marinbuild.store.attempt_ledger import LEDGER, ledger_attempts
    from marinbuild.store.index import index_of
    from marinbuild.store.markers import info_path

    if not names:
        return {}
    index = index if index is not None else RunIndex(storage, graph, names)
    if not index:
        return dict.fromkeys(names)  # nothing under the prefix ever ran
    summary = index_of(storage)
    # Outputs that exist (a step never run costs no read), less those the status summary
    # shows running or failed: 10,000 steps running elsewhere would cost 10,000 misses.
    paths = {n: [p for p in index.outputs(graph.nodes[n]) if not summary.without_success(p)] for n in names}
    wanted = [p for ps in paths.values() for p in ps]
    infos = storage.read_many([info_path(p) for p in wanted])
    ledgers = storage.read_many([storage.join(p, LEDGER) for p in wanted if info_path(p) in infos])
    out: dict[str, Estimate | None] = {}
    for name, outputs in paths.items():
        runs: list[tuple[float, Usage]] = []
        for p in outputs:
            info = _json(infos.get(info_path(p)))
            if not info or info.get("error") or not isinstance(info.get("duration"), (int, float)):
                continue
            entries = run_attempts(list(ledger_attempts(_json(ledgers.get(storage.join(p, LEDGER))))), info)
            held = info.get("held") if isinstance(info.get("held"), dict) else None
            if entries:
                usage = sum((attempt_usage(e, held) for e in entries), Usage())
            else:
                usage = attempt_usage({"duration_s": info["duration"]}, held)
            runs.append((float(info["duration"]), usage))
        out[name] = estimate(runs)
    return out


def _json(text: str | None) -> dict[str, Any] | None:
    value = loads_or_none(text)
    return value if isinstance(value, dict) else None
