"""``marinbuild tpu list`` and ``marinbuild tpu down``: the queued resources marinbuild made.

Both read the cluster file's ``[gcp]`` table (``--cluster``, else the Marinfile's
``DEFAULT_CLUSTER``) and look only at what marinbuild made under the run's prefix (``--prefix``,
``MARIN_PREFIX``, the default), as ``run`` resolves them.
"""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import ClusterOpt, FileOpt, PrefixOpt, VerboseOpt
from marinbuild.cli.printing import err, out
from marinbuild.cli.startup import about_to_delete
from marinbuild.errors import UserError

if TYPE_CHECKING:
    from marinbuild.backends.tpu.cluster import GcpSettings
    from marinbuild.backends.tpu.leftovers import MadeResource
    from marinbuild.store.storage import Storage

__all__ = ["tpu_app"]

tpu_app = typer.Typer(help="TPU slices marinbuild created from the cluster file's [gcp] table.", no_args_is_help=True)


def _context(file: str, prefix: str | None, cluster: str | None) -> tuple[GcpSettings, str, Storage]:
    """The [gcp] table, the resolved prefix and its storage, as ``run`` would find them."""
    from marinbuild.backends.tpu.cluster import load_cluster
    from marinbuild.store.storage import Storage, resolve_prefix

    chosen = cluster
    if os.path.exists(file):
        from marinbuild.backends.tpu.kind import project_cluster
        from marinbuild.execution.session import load

        project = load(file, prefix=prefix)
        loaded = project_cluster(project, cluster)
        resolved, storage = project.graph.prefix, project.storage
    else:
        if chosen is None:
            raise UserError(f"no Marinfile at {file!r} to name a default cluster: pass --cluster FILE")
        loaded = load_cluster(chosen)
        resolved = resolve_prefix(prefix)
        storage = Storage.for_prefix(resolved)
    if loaded is None:
        raise UserError("no cluster file: pass --cluster FILE (or set DEFAULT_CLUSTER in the Marinfile)")
    if loaded.gcp is None:
        raise UserError(f"{loaded.source}: has no [gcp] table, so marinbuild creates no TPU slices from it")
    return loaded.gcp, resolved, storage


def _row(m: MadeResource, now: float) -> dict[str, object]:
    info = m.info
    return {
        "name": info.name,
        "type": f"{len(info.node_names)} x {info.tpu_type}",
        "tpu_type": info.tpu_type,
        "slices": len(info.node_names),
        "state": info.state,
        "step": m.step,
        "output_path": m.output_path,
        "created": info.created,
        "age_s": None if info.created is None else round(now - info.created, 1),
        "age": _age(None if info.created is None else now - info.created),
        "hours_held": round(m.hours_held(now), 4),
        "held_by": m.holder,
    }


def _age(seconds: object) -> str:
    if not isinstance(seconds, int | float):
        return "?"
    s = int(seconds)
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


@tpu_app.command("list")
@handles_errors
def list_command(
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """The queued resources marinbuild made under the prefix: name, type, state, step, age, hours held."""
    from marinbuild.backends.tpu.leftovers import find_made
    from marinbuild.backends.tpu.tpu_api import TpuApi

    gcp, resolved, storage = _context(file, prefix, cluster)
    with TpuApi(gcp) as api:
        made = find_made(api, resolved, storage)
    now = time.time()
    rows = [_row(m, now) for m in sorted(made, key=lambda m: m.info.created or 0)]
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        err.print(f"marinbuild: no queued resource made under {resolved} in {gcp.project}/{gcp.zone}", markup=False)
        return
    header = ("NAME", "TYPE", "STATE", "STEP", "AGE", "HOURS HELD", "HELD BY")
    table = [header] + [
        (str(r["name"]), f"{r['slices']} x {r['tpu_type']}", str(r["state"]), str(r["step"]), _age(r["age_s"]),
         f"{r['hours_held']:.2f}", str(r["held_by"] or "-"))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    for row in table:
        out.print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip(), markup=False)


@tpu_app.command("down")
@handles_errors
def down_command(
    names: Annotated[list[str] | None, typer.Argument(help="Queued resources to delete (default: those no live runner holds).")] = None,
    all_: Annotated[bool, typer.Option("--all", help="Delete every one marinbuild made under the prefix, held or not.")] = False,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    cluster: ClusterOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Delete queued resources marinbuild made: bare, those no live runner holds; NAME… or --all as asked."""

    from marinbuild.backends.tpu.leftovers import delete_unheld, find_made
    from marinbuild.backends.tpu.tpu_api import TpuApi

    if names and all_:
        raise UserError("give queued resource names or --all, not both")
    gcp, resolved, storage = _context(file, prefix, cluster)
    with TpuApi(gcp) as api:
        made = find_made(api, resolved, storage)
        if names:
            known = {m.info.name: m for m in made}
            unknown = [n for n in names if n not in known]
            if unknown:
                raise UserError(f"no queued resource made by marinbuild under {resolved} is called {', '.join(unknown)}")
            chosen = [known[n] for n in names]
        elif all_:
            chosen = made
        else:
            chosen = made
            for m in made:
                if m.holder is not None:
                    err.print(f"marinbuild: kept {m.info.name} (step {m.step}): held by {m.holder}", markup=False)
        about_to_delete()
        deleted = delete_unheld(api, chosen, say=lambda line: out.print(line, markup=False),
                                held_too=bool(names) or all_)
    if not deleted:
        err.print("marinbuild: nothing to delete", markup=False)
