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
from marinbuild.store.markers import FAILED, UNREADABLE, info_path, log_path, read_texts
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from marinbuild.project import Project

__all__ = ["AttemptRecord", "StepRecord", "collect", "describe_retries", "flatten"]

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
    from marinbuild.execution.admission import describe_request, requests_of
    from marinbuild.project import probe

    graph, storage = project.graph, project.storage
    nodes = [graph.nodes[n] for n in names]
    statuses = probe(project, names)
    ran = [n.output_path for n in nodes if n.output_path in statuses]
    infos = read_json_many(storage, [info_path(p) for p in ran])
    ledgers = read_json_many(storage, [Storage.join(p, LEDGER) for p in ran])
    metrics = read_json_many(storage, [Storage.join(p, metrics_file) for p in ran]) if metrics_file else {}
    failed = [p for p in ran if statuses[p].status == FAILED and not statuses[p].mismatch]
    # A log holding bytes that are not UTF-8 is left out rather than failing the report.
    logs = read_texts(storage, [log_path(p) for p in failed])[0] if log_tails and failed else {}
    requests = requests_of(graph, names)
    out: list[StepRecord] = []
    for node in nodes:
        path = node.output_path
        rec = statuses.get(path)
        usable = rec is not None and not rec.mismatch and rec.status != UNREADABLE
        info = _object(infos.get(info_path(path)))
        held = info.get("held") if isinstance(info.get("held"), dict) else None
        ledger = _object(ledgers.get(Storage.join(path, LEDGER)))
        entries = list(ledger_attempts(ledger)) if usable else []
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
                retries=_retries_of(ledger) if usable else None,
                provenance={k: info[k] for k in PROVENANCE if info.get(k) is not None} if usable else {},
                log_tail=_last_lines(logs[log_path(path)]) if log_path(path) in logs else None,
            )
        )
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
