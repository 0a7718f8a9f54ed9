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
from marinbuild.cli.startup import opened_project

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
    from marinbuild.report.status import status_rows

    project = opened_project(file, prefix)
    report = status_rows(project, step_targets(project, targets))
    for line in report.warnings:
        err.print(f"marinbuild: warning: {line}", markup=False)
    rows = report.to_json()
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    _print_status(rows, report.prefix, wide)


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
