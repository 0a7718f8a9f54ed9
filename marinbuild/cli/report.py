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
    best: Annotated[list[str] | None, typer.Option("--best", help="METRIC=min or METRIC=max: the direction a metric is better in, to mark its winner (beside the Marinfile's BEST; loss, error, perplexity are min and accuracy, f1, auc, score, reward max by default); repeatable.")] = None,
    curves: Annotated[str | None, typer.Option("--curves", help="A JSON-lines file each step writes inside its output ({\"step\": 100, \"loss\": 0.7} a line): a plot per key, a line per run.")] = None,
    history: Annotated[bool, typer.Option("--history", help="Add the earlier identities of the steps found under the prefix to the sweep, marked earlier.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Write an HTML report of the targets and what they need: the sweep's table and metric plots, DAG by status,
    timeline of attempts, hours held, provenance and failed steps' logs."""
    from marinbuild.cli.startup import opened_project
    from marinbuild.planner import closure, select
    from marinbuild.report.html import render_report
    from marinbuild.report.records import collect

    project = opened_project(file, prefix)
    graph = project.graph
    needed = closure(graph, select(graph, step_targets(project, targets)))
    names = [n for n in graph.order if n in needed]
    metrics_file = metrics if metrics is not None else metrics_of(project)
    from marinbuild.report.winner import parse_best, read_best

    directions = {**read_best(project.marinfile.default("BEST")), **parse_best(best or [])}
    if curves is not None and (not curves or curves.startswith("/") or ".." in curves.split("/")):
        raise UserError(f"--curves must name a file inside each output, like 'train_log.jsonl', not {curves!r}")
    records = collect(project, names, metrics_file, log_tails=True)
    if history:
        from marinbuild.report.records import collect_earlier, with_earlier

        records = with_earlier(records, collect_earlier(project, names, metrics_file))
    drawn = ""
    if curves is not None:
        from marinbuild.report.curves import curves_html, read_curves

        drawn = curves_html(records, read_curves(project.storage, records, curves))
    title = f"marinbuild report: {os.path.basename(os.path.dirname(project.marinfile.path)) or 'steps'}"
    text = render_report(records, title, graph.prefix, directions, drawn)
    attempts = sum(len(r.attempts) for r in records)
    if output == "-":  # as for curl -o - and most tools: the page on stdout, no file named "-"
        sys.stdout.write(text)
        sys.stdout.flush()
        err.print(f"marinbuild: wrote the report to standard output ({_counted(len(records), 'step')}, {_counted(attempts, 'attempt')})", markup=False)
        return
    _write_whole(output, text)
    err.print(f"marinbuild: wrote {output} ({_counted(len(records), 'step')}, {_counted(attempts, 'attempt')})", markup=False)


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


def _counted(n: int, word: str) -> str:
    """``1 step``, ``2 steps``."""
    return f"{n} {word}{'' if n == 1 else 's'}"
