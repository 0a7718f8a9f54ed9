"""Each step's stored record, gathered in a few batched reads: status, config, attempts, hours, metrics.

Reads only what runs left beside their outputs: the status marker (through
:func:`~marinbuild.project.probe`), the info JSON, the attempt ledger (``attempts.json``,
written for every backend by :mod:`marinbuild.backends.retrying`) and, when asked, a
metrics JSON file inside each output. Nothing is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from marinbuild.accounting import Usage, attempt_usage, parse_time, provisioned_usage
from marinbuild.store.attempt_ledger import LEDGER, ledger_attempts
from marinbuild.store.json_notes import read_json_many
from marinbuild.store.markers import (
    FAILED,
    UNREADABLE,
    StatusRecord,
    info_path,
    log_path,
    read_statuses,
    read_texts,
)
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from marinbuild.graph import StepGraph, StepNode
    from marinbuild.project import Project

__all__ = ["AttemptRecord", "StepRecord", "collect", "collect_earlier", "describe_retries", "flatten",
           "outside_writes_of", "with_earlier"]

_CAUSE_WORDS = (("failure", "failures"), ("preemption", "preemptions"), ("hang", "hangs"))


@dataclass(frozen=True)
class AttemptRecord:
    """One attempt from a step's ledger."""

    step: str
    number: int
    kind: str
    """SUCCESS, FAILED, PREEMPTED, INFRA, PROVISIONING, HANG, CANCELLED or TIMEOUT."""
    started: float | None
    ended: float | None
    duration_s: float
    host: str
    backend: str
    runner: str
    usage: Usage
    message: str = ""
    provisioned: Usage = field(default_factory=Usage)
    """Hours the TPU slices created for the attempt were held, created to deleted (waiting included)."""


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
    retries: Mapping[str, Any] | None = None
    """What the step's last run used of each retry budget: ``{"failure": {"used": 1, "max": 3}, ...}``."""
    provenance: Mapping[str, Any] = field(default_factory=dict)
    """From the info JSON: ``command`` or ``function``, ``git_commit``, ``host``, ``user``, ``start_time``, ``end_time``."""
    log_tail: str | None = None
    """The last lines of a failed step's log, when asked for (``collect(..., log_tails=True)``)."""
    upstream: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The versioned fields of the steps upstream, by step group (``{"train": {"lr": 0.1}}``; see
    :func:`marinbuild.report.chain.upstream_fields`)."""
    metrics_from: str | None = None
    """The step downstream whose metrics file :attr:`metrics` holds, when the step has none of its own
    (its evaluation lives in another step); None: its own."""
    outside_writes: tuple[str, ...] = ()
    """What its run wrote outside its output folder, as noted beside it (see :mod:`marinbuild.execution.stray_writes`)."""
    earlier: bool = False
    """An earlier identity of the step name (``--history``), not the one the Marinfile declares now."""
    when: float | None = None
    """When the run recorded here ended (its info's ``end_time``), for earlier identities."""

    @property
    def usage(self) -> Usage:
        """Everything this identity's attempts held, summed."""
        return sum((a.usage for a in self.attempts), Usage())

    @property
    def provisioned(self) -> Usage:
        """What the TPU slices created for its attempts held, created to deleted, summed (apart from
        :attr:`usage`, the time the step ran on them)."""
        return sum((a.provisioned for a in self.attempts), Usage())


def flatten(value: Any, path: str = "", out: dict[str, Any] | None = None) -> dict[str, Any]:
    """Nested dicts and lists as one level of dotted keys.

    >>> flatten({"loss": 0.5, "eval": {"acc": 0.9, "f1": [1, 2]}})
    {'loss': 0.5, 'eval.acc': 0.9, 'eval.f1.0': 1, 'eval.f1.1': 2}

    An empty object or list holds no values (a metrics file of ``{}`` has no metric):

    >>> flatten({}), flatten({"eval": {}})
    ({}, {'eval': {}})
    """
    out = {} if out is None else out
    if not path and isinstance(value, (dict, list)) and not value:
        return out
    if isinstance(value, dict) and value:
        for k, v in value.items():
            flatten(v, f"{path}.{k}" if path else str(k), out)
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            flatten(v, f"{path}.{i}" if path else str(i), out)
    else:
        out[path or "value"] = value
    return out


PROVENANCE = ("command", "function", "git_commit", "host", "user", "start_time", "end_time")
"""The info JSON's fields that say where and how a step's run was made."""
LOG_TAIL = 20
"""Lines of a failed step's log kept by ``collect(..., log_tails=True)``."""


def collect(
    project: Project, names: Sequence[str], metrics_file: str | None = None, log_tails: bool = False
) -> list[StepRecord]:
    """The stored record of each named step (its current identity), in the order given.

    ``log_tails``: also the last :data:`LOG_TAIL` lines of each failed step's log (one batch).
    """
    reads = _read_current(project, names, metrics_file, log_tails)
    return [_current_record(project.graph.nodes[n], reads) for n in names]


@dataclass(frozen=True)
class _CurrentReads:
    """What the batched reads found beside the current outputs of a report's steps."""

    graph: StepGraph
    metrics_file: str | None
    statuses: Mapping[str, StatusRecord]
    infos: Mapping[str, Any]
    ledgers: Mapping[str, Any]
    metrics: Mapping[str, Any]
    """Each metrics file read: the steps' own and their evaluations' (see :func:`~marinbuild.report.chain.evaluators`)."""
    judges: Mapping[str, list[str]]
    logs: Mapping[str, str]
    outside: Mapping[str, tuple[str, ...]]
    upstream: Mapping[str, Mapping[str, Mapping[str, Any]]]
    resources: Mapping[str, str]
    """Each step's resources, described."""


def _read_current(project: Project, names: Sequence[str], metrics_file: str | None, log_tails: bool) -> _CurrentReads:
    """Everything :func:`collect` shows, read for all the steps at once: a batch per kind of file."""
    from marinbuild.execution.admission import describe_request, requests_of
    from marinbuild.project import probe
    from marinbuild.report.chain import evaluators, upstream_fields

    graph, storage = project.graph, project.storage
    statuses = probe(project, names)
    ran = [graph.nodes[n].output_path for n in names if graph.nodes[n].output_path in statuses]
    infos = read_json_many(storage, [info_path(p) for p in ran])
    ledgers = read_json_many(storage, [Storage.join(p, LEDGER) for p in ran])
    # A row without a metrics file of its own shows its evaluation's: read in the same batch.
    judges = evaluators(graph, names) if metrics_file else {}
    judged = list(dict.fromkeys(graph.nodes[j].output_path for found in judges.values() for j in found))
    wanted = list(dict.fromkeys([*ran, *judged]))
    metrics = read_json_many(storage, [Storage.join(p, metrics_file) for p in wanted]) if metrics_file else {}
    failed = [p for p in ran if statuses[p].status == FAILED and not statuses[p].mismatch]
    # A log holding bytes that are not UTF-8 is left out rather than failing the report.
    logs = read_texts(storage, [log_path(p) for p in failed])[0] if log_tails and failed else {}
    outside = outside_writes_of(storage, [p for p in ran if statuses[p].status in ("SUCCESS", "FAILED")])
    return _CurrentReads(
        graph=graph, metrics_file=metrics_file, statuses=statuses, infos=infos, ledgers=ledgers, metrics=metrics,
        judges=judges, logs=logs, outside=outside, upstream=upstream_fields(graph, names),
        resources={n: describe_request(r) for n, r in requests_of(graph, names).items()},
    )


def _current_record(node: StepNode, reads: _CurrentReads) -> StepRecord:
    """The record of a step's current identity from what was read."""
    path = node.output_path
    rec = reads.statuses.get(path)
    if rec is not None and (rec.mismatch or rec.status == UNREADABLE):
        rec = None  # another identity's marker, or one that cannot be read: as if it never ran
    info = _object(reads.infos.get(info_path(path)))
    held = _held_of(info)
    ledger = _object(reads.ledgers.get(Storage.join(path, LEDGER)))
    found, metrics_from = _metrics_of(node.name, reads)
    versioned = node.payload.get("versioned")
    return StepRecord(
        name=node.name,
        identity=node.identity,
        output_path=path,
        status=rec.status if rec is not None else "NONE",
        duration=rec.duration if rec is not None else None,
        versioned=flatten(dict(versioned)) if versioned else {},
        deps=node.deps,
        resources=reads.resources[node.name],
        held=held,
        attempts=tuple(_attempt(node.name, a, held) for a in ledger_attempts(ledger)) if rec is not None else (),
        metrics=flatten(found) if isinstance(found, (dict, list)) else {},
        error=rec.error if rec is not None and rec.status != "SUCCESS" else None,
        retries=_retries_of(ledger) if rec is not None else None,
        provenance=_provenance_of(info) if rec is not None else {},
        log_tail=_last_lines(reads.logs[log_path(path)]) if log_path(path) in reads.logs else None,
        upstream=reads.upstream.get(node.name, {}),
        metrics_from=metrics_from,
        outside_writes=reads.outside.get(path, ()) if rec is not None else (),
    )


def _metrics_of(name: str, reads: _CurrentReads) -> tuple[Any, str | None]:
    """A step's metrics as read, and the step downstream whose file they come from (None: its own);
    a step without a metrics file of its own has the first of its evaluations' that has one."""
    if not reads.metrics_file:
        return None, None
    nodes, file = reads.graph.nodes, reads.metrics_file
    found = reads.metrics.get(Storage.join(nodes[name].output_path, file))
    if isinstance(found, (dict, list)):
        return found, None
    for judge in reads.judges.get(name, ()):
        theirs = reads.metrics.get(Storage.join(nodes[judge].output_path, file))
        if isinstance(theirs, (dict, list)):
            return theirs, judge
    return found, None


def collect_earlier(project: Project, names: Sequence[str], metrics_file: str | None = None) -> list[StepRecord]:
    """The earlier identities of the named steps found under the prefix (``--history``), most recent
    first for each name: their versioned fields and upstream fields from the recorded info, status,
    attempts, metrics (their own, else those of an earlier evaluation that read them) and when they ended.

    An output folder that holds no status marker (cleaned, or never started) is no run: it is left out.
    """
    from marinbuild.history import RunIndex
    from marinbuild.report.chain import evaluators

    graph = project.graph
    judges = evaluators(graph, names) if metrics_file else {}
    judge_names = list(dict.fromkeys(j for found in judges.values() for j in found))
    index = RunIndex(project.storage, graph, [*names, *judge_names])
    found = [(name, p) for name in names for p in index.others(graph.nodes[name])]
    judge_outputs = [p for j in judge_names for p in index.outputs(graph.nodes[j])]
    reads = _read_earlier(project.storage, found, judge_outputs, metrics_file)
    out = [_earlier_record(name, path, tuple(graph.nodes[name].deps), reads) for name, path in reads.runs]
    order = {n: i for i, n in enumerate(names)}
    out.sort(key=lambda r: (order[r.name], -(r.when or 0.0)))
    return out


@dataclass(frozen=True)
class _EarlierReads:
    """What the batched reads found in the output folders of earlier identities (and their evaluations')."""

    runs: tuple[tuple[str, str], ...]
    """``(step name, output path)`` of each earlier identity with a readable status marker."""
    metrics_file: str | None
    statuses: Mapping[str, StatusRecord]
    infos: Mapping[str, Any]
    """The info JSON of each run and of each earlier evaluation, by info path."""
    ledgers: Mapping[str, Any]
    judged_by: Mapping[str, str]
    """The output of the earlier evaluation that read each output, by output path."""
    upstream_infos: Mapping[str, Mapping[str, Any]]
    metrics: Mapping[str, Any]


def _read_earlier(
    storage: Storage, found: Sequence[tuple[str, str]], judge_outputs: Sequence[str], metrics_file: str | None
) -> _EarlierReads:
    """Everything :func:`collect_earlier` shows of the runs ``found``, read for all of them at once."""
    statuses = read_statuses(storage, [p for _, p in found])
    runs = tuple((name, p) for name, p in found if p in statuses and statuses[p].status != UNREADABLE)
    infos = read_json_many(storage, [info_path(p) for _, p in runs] + [info_path(p) for p in judge_outputs])
    ledgers = read_json_many(storage, [Storage.join(p, LEDGER) for _, p in runs])
    # Which earlier evaluation read which output: the dependencies its info records.
    judged_by: dict[str, str] = {}
    for p in judge_outputs:
        for dep in (_object(infos.get(info_path(p))).get("dependencies") or {}).values():
            judged_by.setdefault(str(dep), p)
    upstream_infos = _upstream_infos(storage, [_object(infos.get(info_path(p))) for _, p in runs])
    metric_paths = [Storage.join(p, metrics_file) for _, p in runs] if metrics_file else []
    metric_paths += [Storage.join(judged_by[p], metrics_file) for _, p in runs if metrics_file and p in judged_by]
    metrics = read_json_many(storage, metric_paths) if metric_paths else {}
    return _EarlierReads(runs=runs, metrics_file=metrics_file, statuses=statuses, infos=infos, ledgers=ledgers,
                         judged_by=judged_by, upstream_infos=upstream_infos, metrics=metrics)


def _earlier_record(name: str, path: str, deps: tuple[str, ...], reads: _EarlierReads) -> StepRecord:
    """The record of the earlier identity of ``name`` at ``path``, from what its run recorded."""
    from marinbuild.report.chain import flat_versioned, grouped

    info = _object(reads.infos.get(info_path(path)))
    held = _held_of(info)
    rec = reads.statuses[path]
    ledger = _object(reads.ledgers.get(Storage.join(path, LEDGER)))
    # As for the current identity: two recorded runs upstream of one group go by their full names.
    upstream = grouped([(dep_name, flat_versioned(_object(dep_info.get("identity_payload"))))
                        for dep_name, dep_info in _ancestry(info, reads.upstream_infos)])
    own, metrics_from = _earlier_metrics_of(path, reads)
    ended = info.get("end_time")
    return StepRecord(
        name=name,
        identity=str(info.get("identity") or path.rsplit("-", 1)[-1]),
        output_path=path,
        status=rec.status,
        duration=rec.duration,
        versioned=flat_versioned(_object(info.get("identity_payload"))),
        deps=deps,
        resources="",
        held=held,
        attempts=tuple(_attempt(name, a, held) for a in ledger_attempts(ledger)),
        metrics=flatten(own) if isinstance(own, (dict, list)) else {},
        error=rec.error if rec.status != "SUCCESS" else None,
        retries=_retries_of(ledger),
        provenance=_provenance_of(info),
        upstream=upstream,
        metrics_from=metrics_from,
        earlier=True,
        when=float(ended) if isinstance(ended, (int, float)) and not isinstance(ended, bool) else rec.time or None,
    )


def _earlier_metrics_of(path: str, reads: _EarlierReads) -> tuple[Any, str | None]:
    """An earlier identity's metrics as read, and the name of the earlier evaluation whose file they
    come from (None: its own)."""
    if not reads.metrics_file:
        return None, None
    own = reads.metrics.get(Storage.join(path, reads.metrics_file))
    judge = reads.judged_by.get(path)
    if isinstance(own, (dict, list)) or judge is None:
        return own, None
    judge_name = str(_object(reads.infos.get(info_path(judge))).get("name") or "") or None
    return reads.metrics.get(Storage.join(judge, reads.metrics_file)), judge_name


def _held_of(info: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """What the run's info says it held, when that is an object."""
    held = info.get("held")
    return held if isinstance(held, dict) else None


def _provenance_of(info: Mapping[str, Any]) -> dict[str, Any]:
    return {k: info[k] for k in PROVENANCE if info.get(k) is not None}


_UPSTREAM_LEVELS = 8
"""Levels of recorded dependencies followed up from an earlier identity (each level one batch read)."""


def _upstream_infos(storage: Storage, infos: Sequence[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """The info JSON of every output the recorded ``dependencies`` lead to, level by level, by output path."""
    found: dict[str, Mapping[str, Any]] = {}
    frontier = [dict(_object(i.get("dependencies"))) for i in infos]
    for _ in range(_UPSTREAM_LEVELS):
        paths = list(dict.fromkeys(str(p) for deps in frontier for p in deps.values() if str(p) not in found))
        if not paths:
            break
        read = read_json_many(storage, [info_path(p) for p in paths])
        for p in paths:
            found[p] = _object(read.get(info_path(p)))
        frontier = [dict(_object(found[p].get("dependencies"))) for p in paths]
    return found


def _ancestry(info: Mapping[str, Any], infos: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(step name, info)`` of each recorded run upstream of ``info``, nearest first."""
    out: list[tuple[str, Mapping[str, Any]]] = []
    seen: set[str] = set()
    frontier = list(_object(info.get("dependencies")).items())
    while frontier:
        name, path = frontier.pop(0)
        if str(path) in seen or str(path) not in infos:
            continue
        seen.add(str(path))
        out.append((str(name), infos[str(path)]))
        frontier += list(_object(infos[str(path)].get("dependencies")).items())
    return out


def with_earlier(current: Sequence[StepRecord], earlier: Sequence[StepRecord]) -> list[StepRecord]:
    """Each step's current record followed by its earlier identities, most recent first."""
    by_name: dict[str, list[StepRecord]] = {}
    for r in earlier:
        by_name.setdefault(r.name, []).append(r)
    return [x for r in current for x in (r, *by_name.get(r.name, ()))]


def outside_writes_of(storage: Storage, outputs: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """The writes outside its output noted beside each of ``outputs``, on a local prefix (a read each:
    remote stores are never noted, and not read)."""
    from marinbuild.execution.stray_writes import note_path

    local = [o for o in outputs if storage.local_file(o) is not None]
    found = read_json_many(storage, [note_path(o) for o in local]) if local else {}
    out: dict[str, tuple[str, ...]] = {}
    for o in local:
        note = _object(found.get(note_path(o))).get("outside")
        if isinstance(note, list) and note:
            out[o] = tuple(str(x) for x in note)
    return out


def _object(value: Any) -> Mapping[str, Any]:
    """A record read back as a JSON object; one edited by hand into another JSON type (``"x"``,
    ``[1, 2]``) is read as empty, so its step's row shows empty cells rather than failing."""
    return value if isinstance(value, dict) else {}


def _last_lines(text: str) -> str:
    return "\n".join(text.splitlines()[-LOG_TAIL:])


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
        provisioned=provisioned_usage(entry),
    )


def _retries_of(ledger: Mapping[str, Any]) -> dict[str, Any] | None:
    retries = ledger.get("retries")
    if not isinstance(retries, dict):
        return None
    return {k: v for k, v in retries.items() if isinstance(v, dict) and isinstance(v.get("used"), int)}


def describe_retries(retries: Mapping[str, Any] | None, used_only: bool = False) -> str:
    """Retries by cause in one line: failures, preemptions and hangs always (``used_only``: only
    the causes that were used, as the end of a run says them), the others once used.

    >>> describe_retries({"failure": {"used": 1, "max": 3}, "preemption": {"used": 4, "max": 100},
    ...                   "hang": {"used": 0, "max": 2}, "infra": {"used": 0, "max": 2},
    ...                   "provisioning": {"used": 2, "max": None, "timeout_s": 3600}})
    'failures 1/3 · preemptions 4/100 · hangs 0/2 · provisioning 2 (within 3600 s)'
    >>> describe_retries({"failure": {"used": 1, "max": 3}, "preemption": {"used": 0, "max": 100}}, used_only=True)
    'failures 1/3'
    """
    if not retries:
        return ""
    parts = []
    for key, word in _CAUSE_WORDS:
        if key in retries and (not used_only or retries[key].get("used")):
            parts.append(f"{word} {retries[key].get('used', 0)}/{retries[key].get('max')}")
    infra = retries.get("infra") or {}
    if infra.get("used"):
        parts.append(f"infra {infra['used']}/{infra.get('max')}")
    provisioning = retries.get("provisioning") or {}
    if provisioning.get("used"):
        timeout = provisioning.get("timeout_s")
        # A hand-edited ledger may hold any JSON there: only a number is formatted as one.
        within = timeout if isinstance(timeout, (int, float)) else 0
        parts.append(f"provisioning {provisioning['used']} (within {within:g} s)")
    return " · ".join(parts)
