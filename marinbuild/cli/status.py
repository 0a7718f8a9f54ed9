"""``marinbuild status``: each step's stored status, output path, last duration, lease and retries by cause."""

from __future__ import annotations

import json
import sys
import time
from typing import Annotated, Any

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, TargetsArg, VerboseOpt, step_targets
from marinbuild.cli.printing import err, print_table
from marinbuild.planner import closure, select
from marinbuild.project import open_project, probe
from marinbuild.store.markers import UNREADABLE

__all__ = ["status_command"]


@handles_errors
def status_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="On a terminal, whole output paths and errors instead of a table within 100 columns.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Each step's stored status, output path and last duration."""
    project = open_project(file, prefix)
    graph = project.graph
    needed = closure(graph, select(graph, step_targets(project, targets)))  # once: per step it made status quadratic
    names = [n for n in graph.order if n in needed]
    leases: dict[str, Any] = {}
    problems: dict[str, str] = {}
    records = probe(project, names, leases, problems)  # the leases of RUNNING steps come with it
    # A marker that cannot be used is named, never fatal: the step is simply planned to run.
    problems.update({p: rec.error or p for p, rec in records.items() if rec.status == UNREADABLE})
    for line in sorted(set(problems.values())):
        err.print(f"marinbuild: warning: {line} (treated as unknown: the step will run)", markup=False)
    if leases:
        from marinbuild.store.lease import owner_alive

        # A lease whose runner exited on this machine is no one's: plan runs the step again.
        leases = {p: lease for p, lease in leases.items() if lease is None or owner_alive(lease.owner) is not False}
    from marinbuild.store.retry_counts import decode_retries

    # What each step's last run used of its budgets, from its final marker or summary entry:
    # a ledger read per step would cost a request each on gs:// (unknown for older markers).
    retries = {p: decode_retries(rec.retries) for p, rec in records.items() if rec.retries}
    from marinbuild.store.attempt_ledger import read_progress_notes

    running = [p for p, rec in records.items() if rec.status == "RUNNING" and rec.mismatch is None]
    retries.update(_running_retries(project.storage, running, leases))
    # Notes exist only for steps whose hangs are watched or that wait for TPU slices: a read
    # per running step of any other kind would cost a request each on gs:// for nothing.
    kinds = {graph.nodes[n].output_path: graph.nodes[n].step for n in names}
    watched = [p for p in running if p in kinds and (kinds[p].progress_timeout is not None or _on_tpu(kinds[p]))]
    progress = read_progress_notes(project.storage, watched) if watched else {}  # when each last moved
    from marinbuild.store.provisioning_note import read_provisioning_notes

    # A step whose runner is gone waits for nothing, whatever its last note says.
    on_tpu = [p for p in running if p in kinds and _on_tpu(kinds[p]) and leases.get(p)]
    waiting = read_provisioning_notes(project.storage, on_tpu) if on_tpu else {}  # TPU slices still to come
    from marinbuild.backends.slurm.backend import read_slurm_markers

    # Where a running step's Slurm job stands (its id and why it pends), for the few that run.
    held = [p for p in running if leases.get(p)][:_RUNNING_LEDGERS]
    queued = read_slurm_markers(project.storage, held) if held else {}
    from marinbuild.report.records import outside_writes_of

    # What a step wrote outside its output, noted beside it by the run (local prefixes only).
    outside = outside_writes_of(project.storage, [p for p, rec in records.items() if rec.status in ("SUCCESS", "FAILED")])
    rows: list[dict[str, Any]] = []
    for n in names:
        node = graph.nodes[n]
        rec = records.get(node.output_path)
        lease = leases.get(node.output_path)
        foreign = rec is not None and rec.mismatch is not None
        rows.append(
            {
                "name": n,
                "status": rec.status if rec and not foreign else "NONE",
                "output_path": node.output_path,
                "duration": rec.duration if rec and not foreign else None,
                "time": (rec.time or None) if rec and not foreign else None,
                "error": f"its output path holds the {rec.mismatch}" if rec and foreign else rec.error if rec else None,
                "lease": {"owner": str(lease.owner), "since": lease.acquired, "renewed": lease.renewed} if lease else None,
                "retries": retries.get(node.output_path) if rec and not foreign else None,
                "progress": _progress(progress.get(node.output_path)) if rec and rec.status == "RUNNING" else None,
                "provisioning": waiting.get(node.output_path) if rec and rec.status == "RUNNING" else None,
                "slurm": queued.get(node.output_path) if rec and rec.status == "RUNNING" else None,
                "outside_writes": outside.get(node.output_path) if rec and not foreign else None,
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    _print_status(rows, graph.prefix, wide)


def _print_status(rows: list[dict[str, Any]], prefix: str = "", wide: bool = True) -> None:
    """Plain columns into a pipe or a file (never wrapped: `status | grep` sees whole paths); a table on a terminal,
    within 100 columns unless ``wide`` (output paths relative to the prefix, errors cut)."""
    with_lease = any(r["status"] == "RUNNING" for r in rows)
    with_error = any(r["error"] for r in rows)
    with_note = any(r.get("outside_writes") for r in rows)
    # Retries by cause get a column once any step used one (``--json`` always carries them).
    with_retries = any(any(v.get("used") for v in (r.get("retries") or {}).values()) for r in rows)
    columns = ("step", "status", "duration", "finished", "output") + (("lease",) if with_lease else ()) + (
        ("retries",) if with_retries else ()) + (("error",) if with_error else ()) + (("note",) if with_note else ()
    )
    cells: list[tuple[str, ...]] = []
    for r in rows:
        dur = f"{r['duration']:.1f} s" if r["duration"] is not None else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])) if r["time"] else ""
        row = [r["name"], r["status"], dur, when, r["output_path"]]
        if with_lease:
            row.append(_lease_text(r["lease"]) + _moved_text(r.get("progress")) + _waiting_text(r.get("provisioning"))
                       + _slurm_text(r.get("slurm"))
                       if r["status"] == "RUNNING" else "")
        if with_retries:
            from marinbuild.report.records import describe_retries

            unknown = r["status"] in ("SUCCESS", "FAILED") and not r.get("retries")
            row.append("unknown" if unknown else describe_retries(r.get("retries")))
        if with_error:
            row.append((r["error"] or "").splitlines()[0] if r["error"] else "")
        if with_note:
            from marinbuild.execution.stray_writes import describe

            row.append(describe("it", r["outside_writes"]).removeprefix("it ") if r.get("outside_writes") else "")
        cells.append(tuple(row))
    if not sys.stdout.isatty():
        from marinbuild.cli.plan_view import columns_text

        sys.stdout.write("".join(line + "\n" for line in columns_text([columns, *cells])))
        return
    print_table(_status_table(columns, cells, prefix, wide), wide)


def _status_table(columns: tuple[str, ...], cells: list[tuple[str, ...]], prefix: str, wide: bool) -> Any:
    """The rich table of ``status``; unless ``wide``, fitted to the terminal with each step and its status whole."""
    from rich.text import Text

    from marinbuild.cli.console import FittedTable, terminal_table
    from marinbuild.cli.plan_view import under_prefix

    if not wide:
        where, last = columns.index("output"), columns.index("error") if "error" in columns else None
        cells = [
            tuple(
                under_prefix(c, prefix) if i == where else _cut(c) if i == last else c for i, c in enumerate(row)
            )
            for row in cells
        ]
    colors = {"SUCCESS": "green", "FAILED": "red", "RUNNING": "cyan", "NONE": "dim"}
    rows: list[list[Text]] = []
    for shown in cells:
        styled = [Text(c) for c in shown]
        styled[1].stylize(colors.get(shown[1], "white"))
        rows.append(styled)
    # Narrower than the table, each step still shows its status: the dates go first, the error
    # (why a step failed) last; a path relative to the prefix is shown whole, to copy, or not at all.
    fit = FittedTable(columns, rows, keys=("step", "status"), cut=("lease", "error", "note"),
                      drop=("retries", "finished", "duration", "lease", "output", "note", "error"))
    return terminal_table(fit, wide)


def _cut(error: str) -> str:
    from marinbuild.cli.plan_view import REASON_WIDTH

    return error if len(error) <= REASON_WIDTH else f"{error[:REASON_WIDTH - 14].rstrip()}… (--json)"


_RUNNING_LEDGERS = 50
"""Running steps whose ledger ``status`` reads for the retries of their run so far; beyond,
their ``retries`` stay unknown until the run ends (a request per step on gs:// otherwise)."""


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


def _moved_text(progress: dict[str, Any] | None) -> str:
    if not progress:
        return ""
    moved = time.strftime("%H:%M:%S", time.localtime(progress["last_moved"]))
    return f"; last moved {moved} ({time.time() - progress['last_moved']:.0f} s ago)"


def _waiting_text(note: dict[str, Any] | None) -> str:
    """``; waiting for capacity since 12:03:10 (95 s, QUEUED_RESOURCE)`` for a step whose TPU slices are not there yet."""
    if not note:
        return ""
    since = time.strftime("%H:%M:%S", time.localtime(note["since"]))
    return f"; {note['phase']} since {since} ({time.time() - note['since']:.0f} s, {note.get('queued_resource', '?')})"


def _slurm_text(record: dict[str, Any] | None) -> str:
    from marinbuild.backends.slurm.backend import slurm_wait_text

    text = slurm_wait_text(record)
    return f"; {text}" if text else ""


def _lease_text(lease: dict[str, Any] | None) -> str:
    if lease is None:
        return "none: its runner is gone (the next run redoes it)"
    since = time.strftime("%H:%M:%S", time.localtime(lease["since"])) if lease["since"] else "?"
    renewed = time.strftime("%H:%M:%S", time.localtime(lease["renewed"])) if lease["renewed"] else "?"
    return f"{lease['owner']} since {since}, renewed {renewed}"
