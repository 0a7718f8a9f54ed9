"""``marinbuild slurm list`` and ``marinbuild slurm down``: the Slurm jobs marinbuild submitted.

Both look only at the jobs of steps under the run's prefix (``--prefix``, ``MARIN_PREFIX``, the
Marinfile's default), as ``run`` resolves it, and say who holds each step's lease: a job no live
runner holds was left by a runner that was killed.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, VerboseOpt
from marinbuild.cli.printing import err, out
from marinbuild.errors import UserError

if TYPE_CHECKING:
    from marinbuild.backends.slurm.kind import LeftJob
    from marinbuild.store.storage import Storage

__all__ = ["slurm_app"]

slurm_app = typer.Typer(help="Slurm jobs marinbuild submitted for steps under the prefix.", no_args_is_help=True)


def _slurm_prefix(file: str, prefix: str | None) -> tuple[str, Storage]:
    from marinbuild.store.storage import Storage, resolve_prefix

    if os.path.exists(file):
        from marinbuild.execution.session import load

        project = load(file, prefix=prefix)
        return project.graph.prefix, project.storage
    resolved = resolve_prefix(prefix)
    return resolved, Storage.for_prefix(resolved)


def _job_row(j: LeftJob, now: float) -> dict[str, object]:
    job = j.job
    name = job.name[3:] if job.name.startswith("mb:") else job.name
    step, _, attempt = name.rpartition(":")
    return {
        "job_id": job.job_id,
        "step": step or name,
        "attempt": int(attempt) if attempt.isdigit() else None,
        "state": job.state,
        "reason": job.reason,
        "nodes": job.nodes,
        "output_path": job.output_path,
        "age_s": None if job.start is None else round(now - job.start, 1),
        "held_by": j.holder,
    }


@slurm_app.command("list")
@handles_errors
def slurm_list_command(
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """The jobs marinbuild submitted for steps under the prefix: id, step, state, nodes, who holds it."""
    from marinbuild.backends.slurm.kind import find_left

    resolved, storage = _slurm_prefix(file, prefix)
    now = time.time()
    rows = [_job_row(j, now) for j in sorted(find_left(resolved, storage), key=lambda j: j.job.job_id)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        err.print(f"marinbuild: no Slurm job of a step under {resolved}", markup=False)
        return
    header = ("JOB", "STEP", "STATE", "REASON", "NODES", "HELD BY")
    table = [header] + [(str(r["job_id"]), str(r["step"]), str(r["state"]), str(r["reason"] or "-"),
                         str(r["nodes"] or "-"), str(r["held_by"] or "-")) for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), markup=False)


@slurm_app.command("down")
@handles_errors
def slurm_down_command(
    jobs: Annotated[list[int] | None, typer.Argument(help="Job ids to cancel (default: those no live runner holds).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Cancel every job of a step under the prefix, held or not.")] = False,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Cancel jobs marinbuild submitted: bare, those no live runner holds; JOB… or --all as asked."""
    from marinbuild.backends.slurm.kind import cancel_unheld, find_left

    if jobs and all_:
        raise UserError("give job ids or --all, not both")
    resolved, storage = _slurm_prefix(file, prefix)
    left = find_left(resolved, storage)
    if jobs:
        known = {j.job.job_id: j for j in left}
        unknown = [str(i) for i in jobs if i not in known]
        if unknown:
            raise UserError(f"no running or pending marinbuild job of a step under {resolved} has id {', '.join(unknown)}")
        left = [known[i] for i in jobs]
    else:
        for j in left:
            if j.holder is not None and not all_:
                err.print(f"marinbuild: kept job {j.job.job_id} ({j.job.name}): held by {j.holder}", markup=False)
    cancelled = cancel_unheld(left, say=lambda line: out.print(line, markup=False), held_too=bool(jobs) or all_)
    if not cancelled:
        err.print("marinbuild: nothing to cancel", markup=False)
