"""Each step's stored record, gathered in a few batched reads: status, config, attempts, hours, metrics.

Reads only what runs left beside their outputs: the status marker (through
:func:`~marinbuild.project.probe`), the info JSON, the attempt ledger (``attempts.json``,
written for every backend by :mod:`marinbuild.backends.retrying`) and, when asked, a
metrics JSON file inside each output. Nothing is written.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marinbuild.execution.accounting import Usage, attempt_usage, parse_time
from marinbuild.store.attempt_ledger import LEDGER
from marinbuild.store.markers import UNREADABLE, info_path
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from marinbuild.project import Project

__all__ = ["AttemptRecord", "StepRecord", "collect", "flatten"]


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt from a step's ledger."""

    step: str
    number: int
    kind: str
    """SUCCESS, FAILED, PREEMPTED, INFRA, CANCELLED or TIMEOUT."""
    started: float | None
    ended: float | None
    duration_s: float
    host: str
    backend: str
    runner: str
    usage: Usage
    message: str = ""


@dataclass(frozen=True)
class StepRecord:
    """What is stored about one step's current identity."""

    name: str
    identity: str
    output_path: str
    status: str
    """SUCCESS, FAILED, RUNNING, or NONE when it never ran."""
    duration: float | None
    versioned: Mapping[str, Any]
    """Versioned config values by dotted path (nested values flattened)."""
    deps: tuple[str, ...]
    resources: str
    held: Mapping[str, Any] | None
    attempts: tuple[AttemptRecord, ...] = ()
    metrics: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def usage(self) -> Usage:
        """Everything this identity's attempts held, summed."""
        return sum((a.usage for a in self.attempts), Usage())


def flatten(value: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nested dicts and lists as one level of dotted keys.

    >>> flatten({"loss": 0.5, "eval": {"acc": 0.9, "f1": [1, 2]}})
    {'loss': 0.5, 'eval.acc': 0.9, 'eval.f1.0': 1, 'eval.f1.1': 2}
    """
    out = {} if out is None else out
    if isinstance(value, dict) and value:
        for k, v in value.items():
            flatten(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            flatten(v, f"{path}.{i}" if path else str(i), out)
    else:
        out[path or "value"] = value
    return out


def collect(project: Project, names: Sequence[str], metrics_file: str | None = None) -> list[StepRecord]:
    """The stored record of each named step (its current identity), in the order given."""
    from marinbuild.execution.admission import describe_request, requests_of
    from marinbuild.project import probe

    graph, storage = project.graph, project.storage
    nodes = [graph.nodes[n] for n in names]
    statuses = probe(project, names)
    ran = [n.output_path for n in nodes if n.output_path in statuses]
    infos = _read_json(storage, [info_path(p) for p in ran])
    ledgers = _read_json(storage, [Storage.join(p, LEDGER) for p in ran])
    metrics = _read_json(storage, [Storage.join(p, metrics_file) for p in ran]) if metrics_file else {}
    requests = requests_of(graph, names)
    out: list[StepRecord] = []
    for node in nodes:
        path = node.output_path
        rec = statuses.get(path)
        usable = rec is not None and not rec.mismatch and rec.status != UNREADABLE
        info = infos.get(info_path(path)) or {}
        held = info.get("held") if isinstance(info.get("held"), dict) else None
        ledger = ledgers.get(Storage.join(path, LEDGER)) or {}
        entries = [a for a in ledger.get("attempts", []) if isinstance(a, dict)] if usable else []
        found = metrics.get(Storage.join(path, metrics_file)) if metrics_file else None
        out.append(
            StepRecord(
                name=node.name,
                identity=node.identity,
                output_path=path,
                status=rec.status if usable and rec is not None else "NONE",
                duration=rec.duration if usable and rec is not None else None,
                versioned=flatten(dict(node.payload.get("versioned") or {})) if node.payload.get("versioned") else {},
                deps=node.deps,
                resources=describe_request(requests[node.name]),
                held=held,
                attempts=tuple(_attempt(node.name, a, held) for a in entries),
                metrics=flatten(found) if isinstance(found, (dict, list)) else {},
                error=rec.error if usable and rec is not None and rec.status != "SUCCESS" else None,
            )
        )
    return out


def _attempt(step: str, entry: Mapping[str, Any], held: Mapping[str, Any] | None) -> AttemptRecord:
    started, ended = parse_time(entry.get("started_at")), parse_time(entry.get("ended_at"))
    duration = entry.get("duration_s")
    if not isinstance(duration, (int, float)):
        duration = (ended - started) if started is not None and ended is not None else 0.0
    number = entry.get("attempt")
    return AttemptRecord(
        step=step,
        number=number if isinstance(number, int) else 0,
        kind=str(entry.get("class") or "?"),
        started=started,
        ended=ended,
        duration_s=float(duration),
        host=str(entry.get("host") or "?"),
        backend=str(entry.get("backend") or ("tpu" if "hosts" in entry else "local")),
        runner=str(entry.get("runner") or entry.get("host") or "?"),
        usage=attempt_usage(entry, held),
        message=str(entry.get("message") or ""),
    )


def _read_json(storage: Storage, paths: Iterable[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, text in storage.read_many(list(paths)).items():
        try:
            out[path] = json.loads(text)
        except ValueError:
            continue
    return out
