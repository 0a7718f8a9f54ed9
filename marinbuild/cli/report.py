"""``marinbuild report``: the run report of some steps as one self-contained HTML file."""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, TargetsArg, VerboseOpt, metrics_of, step_targets
from marinbuild.cli.printing import err
from marinbuild.errors import UserError

__all__ = ["report_command"]


@handles_errors
def report_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    output: Annotated[str, typer.Option("-o", "--output", help="The HTML file to write ('-': standard output, to pipe or mail it).")] = "report.html",
    metrics: Annotated[str | None, typer.Option("--metrics", help="A JSON file inside each output whose keys become columns and plots (default: the Marinfile's METRICS).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Write an HTML report of the targets and what they need: the sweep's table and metric plots, DAG by status,
    timeline of attempts, hours held, provenance and failed steps' logs."""
    from marinbuild.planner import closure, select
    from marinbuild.project import open_project
    from marinbuild.report.html import render_report
    from marinbuild.report.records import collect

    project = open_project(file, prefix)
    graph = project.graph
    needed = closure(graph, select(graph, step_targets(project, targets)))
    names = [n for n in graph.order if n in needed]
    metrics_file = metrics if metrics is not None else metrics_of(project)
    records = collect(project, names, metrics_file, log_tails=True)
    title = f"marinbuild report: {os.path.basename(os.path.dirname(project.marinfile.path)) or 'steps'}"
    text = render_report(records, title, graph.prefix)
    attempts = sum(len(r.attempts) for r in records)
    if output == "-":  # as for curl -o - and most tools: the page on stdout, no file named "-"
        sys.stdout.write(text)
        sys.stdout.flush()
        err.print(f"marinbuild: wrote the report to standard output ({len(records)} steps, {attempts} attempts)", markup=False)
        return
    _write_whole(output, text)
    err.print(f"marinbuild: wrote {output} ({len(records)} steps, {attempts} attempts)", markup=False)


def _write_whole(path: str, text: str) -> None:
    """The report whole or not at all: a temporary file beside it, renamed into place."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UserError(f"cannot write {path}: no folder {folder}")
    tmp = os.path.join(folder, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None
