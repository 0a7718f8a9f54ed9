"""What ``marinbuild status`` shows, as values: each step's stored status, lease, retries and notes.

:func:`status_rows` joins the readers a status needs (the markers and leases of
:func:`~marinbuild.project.probe`, the retries of each last run, the progress, provisioning
and Slurm notes of the steps still running, and what a step wrote outside its output) into
one :class:`StepStatus` per step; ``marinbuild.status`` returns them and the command line
prints them. Every reader is asked only about the steps it can say something of: on gs://
each read costs a request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from marinbuild.planner import closure, select
from marinbuild.project import Project, probe
from marinbuild.store.markers import UNREADABLE

__all__ = ["StatusReport", "StepStatus", "status_rows"]


@dataclass(frozen=True)
class StepStatus:
    """One step's row of ``status``; :meth:`to_json` is the object ``status --json`` prints.

    ``status`` is ``SUCCESS``, ``FAILED``, ``RUNNING`` or ``NONE`` (never ran, or its output
    path holds another step's outputs: ``error`` says so). ``lease`` (``owner``, ``since``,
    ``renewed``) is that of a running step, None once its runner is gone. ``retries`` are by
    cause; ``progress``, ``provisioning`` and ``slurm`` are notes of running steps only.
    """

    name: str
    status: str
    output_path: str
    duration: float | None
    time: float | None
    error: str | None
    lease: dict[str, Any] | None
    retries: dict[str, Any] | None
    progress: dict[str, Any] | None
    provisioning: dict[str, Any] | None
    slurm: dict[str, Any] | None
    outside_writes: Any

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StatusReport:
    """The rows of ``status`` in graph order, the prefix they lie under, and the markers that could not be used."""

    rows: tuple[StepStatus, ...]
    prefix: str
    warnings: tuple[str, ...] = ()

    def to_json(self) -> list[dict[str, Any]]:
        return [row.to_json() for row in self.rows]


_RUNNING_LEDGERS = 50
"""Running steps whose ledger ``status`` reads for the retries of their run so far; beyond,
their ``retries`` stay unknown until the run ends (a request per step on gs:// otherwise)."""


def status_rows(project: Project, targets: Sequence[str] = ()) -> StatusReport:
    """The status of the targets (step names or globs; none: every step) and everything they need."""
    graph = project.graph
    needed = closure(graph, select(graph, list(targets)))  # once: per step it made status quadratic
    names = [n for n in graph.order if n in needed]
    leases: dict[str, Any] = {}
    problems: dict[str, str] = {}
    records = probe(project, names, leases, problems)  # the leases of RUNNING steps come with it
    # A marker that cannot be used is named, never fatal: the step is simply planned to run.
    problems.update({p: rec.error or p for p, rec in records.items() if rec.status == UNREADABLE})
    warnings = tuple(f"{line} (treated as unknown: the step will run)" for line in sorted(set(problems.values())))
    if leases:
        from marinbuild.store.lease import owner_alive

        # A lease whose runner exited on this machine is no one's: plan runs the step again.
        leases = {p: lease for p, lease in leases.items() if lease is None or owner_alive(lease.owner) is not False}
    running = [p for p, rec in records.items() if rec.status == "RUNNING" and rec.mismatch is None]
    kinds = {graph.nodes[n].output_path: graph.nodes[n].step for n in names}
    notes = _notes(project, records, running, leases, kinds)
    rows = tuple(_status_row(n, graph.nodes[n].output_path, records, leases, notes) for n in names)
    return StatusReport(rows, graph.prefix, warnings)


def _notes(project: Project, records: dict[str, Any], running: list[str], leases: dict[str, Any],
           kinds: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """What the other readers say, by kind of note and output path."""
    from marinbuild.backends.slurm.backend import read_slurm_markers, slurm_named
    from marinbuild.report.records import outside_writes_of
    from marinbuild.store.attempt_ledger import read_progress_notes
    from marinbuild.store.provisioning_note import read_provisioning_notes
    from marinbuild.store.retry_counts import decode_retries

    storage = project.storage
    # What each step's last run used of its budgets, from its final marker or summary entry:
    # a ledger read per step would cost a request each on gs:// (unknown for older markers).
    retries = {p: decode_retries(rec.retries) for p, rec in records.items() if rec.retries}
    retries.update(_running_retries(storage, running, leases))
    # Notes exist only for steps whose hangs are watched or that wait for TPU slices: a read
    # per running step of any other kind would cost a request each on gs:// for nothing.
    watched = [p for p in running if p in kinds and (kinds[p].progress_timeout is not None or _on_tpu(kinds[p]))]
    progress = read_progress_notes(storage, watched) if watched else {}  # when each last moved
    # A step whose runner is gone waits for nothing, whatever its last note says.
    on_tpu = [p for p in running if p in kinds and _on_tpu(kinds[p]) and leases.get(p)]
    waiting = read_provisioning_notes(storage, on_tpu) if on_tpu else {}  # TPU slices still to come
    # Where a running step's Slurm job stands (its id and why it pends), for the few that run.
    # On a store where each read is a round trip, only for a project that names Slurm.
    held = [p for p in running if leases.get(p)][:_RUNNING_LEDGERS]
    if held and storage.keeps_summary and not slurm_named(project):
        held = []
    queued = read_slurm_markers(storage, held) if held else {}
    # What a step wrote outside its output, noted beside it by the run (local prefixes only).
    outside = outside_writes_of(storage, [p for p, rec in records.items() if rec.status in ("SUCCESS", "FAILED")])
    return {"retries": retries, "progress": progress, "provisioning": waiting, "slurm": queued, "outside": outside}


def _status_row(name: str, path: str, records: dict[str, Any], leases: dict[str, Any],
         notes: dict[str, dict[str, Any]]) -> StepStatus:
    rec = records.get(path)
    lease = leases.get(path)
    foreign = rec is not None and rec.mismatch is not None
    known = rec is not None and not foreign  # a record of this very step
    running = rec is not None and rec.status == "RUNNING"
    return StepStatus(
        name=name,
        status=rec.status if rec and known else "NONE",
        output_path=path,
        duration=rec.duration if rec and known else None,
        time=(rec.time or None) if rec and known else None,
        error=f"its output path holds the {rec.mismatch}" if rec and foreign else rec.error if rec else None,
        lease={"owner": str(lease.owner), "since": lease.acquired, "renewed": lease.renewed} if lease else None,
        retries=notes["retries"].get(path) if known else None,
        progress=_progress(notes["progress"].get(path)) if running else None,
        provisioning=notes["provisioning"].get(path) if running else None,
        slurm=notes["slurm"].get(path) if running else None,
        outside_writes=notes["outside"].get(path) if known else None,
    )


def _running_retries(storage: Any, running: list[str], leases: dict[str, Any]) -> dict[str, Any]:
    """Retries by cause of the runs under way (live leases only), while they are few; see :data:`_RUNNING_LEDGERS`."""
    since = {p: leases[p].acquired for p in running if leases.get(p) is not None and leases[p].acquired}
    if not since or len(since) > _RUNNING_LEDGERS:
        return {}
    from marinbuild.store.attempt_ledger import read_current_retries
    from marinbuild.store.retry_counts import decode_retries, encode_retries

    found = read_current_retries(storage, since)
    # Through the marker's code and back: a hand-edited ledger shows as unknown, never raw.
    return {p: decode_retries(encode_retries(r)) for p, r in found.items()}


def _on_tpu(step: Any) -> bool:
    from marinbuild.resources import as_request

    return as_request(step.resources).slices is not None


def _progress(note: dict[str, Any] | None) -> dict[str, Any] | None:
    """A running step's last sign of progress, for steps whose hangs are watched: ``last_moved``, ``timeout_s``."""
    if note is None:
        return None
    return {"attempt": note.get("attempt"), "last_moved": note["last_moved"], "timeout_s": note.get("timeout_s")}
