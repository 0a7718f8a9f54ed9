"""``marinbuild plan``: what ``run`` would do, and why, as a table, JSON, or a graph for Graphviz/Mermaid."""

from __future__ import annotations

import enum
import json
import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from marinbuild.cli import dag_text
from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import (
    ClusterOpt,
    CoresOpt,
    FileOpt,
    ForceAllOpt,
    ForceOpt,
    MemOpt,
    PrefixOpt,
    ResourcesOpt,
    TargetsArg,
    TokenOpt,
    VerboseOpt,
    machine_of,
    step_targets,
)
from marinbuild.cli.printing import err, print_notes, print_plan, terminal_safe, with_environments
from marinbuild.execution.admission import describe_request

__all__ = ["DagFormat", "plan_command"]


class DagFormat(enum.StrEnum):
    """Text formats of the step graph."""

    dot = "dot"
    mermaid = "mermaid"


@handles_errors
def plan_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    dry: Annotated[bool, typer.Option("--dry", "-n", "--dry-run", help="Accepted for habit: plan never runs anything.")] = True,
    check: Annotated[bool, typer.Option("--check", "-q", help="Print nothing; exit 1 when anything would run (like make -q).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as a JSON list.")] = False,
    dag: Annotated[DagFormat | None, typer.Option("--dag", case_sensitive=False, help="Print the graph for Graphviz or Mermaid.")] = None,
    force: ForceOpt = None,
    force_all: ForceAllOpt = False,
    cores: CoresOpt = None,
    mem: MemOpt = None,
    resources: ResourcesOpt = None,
    token: TokenOpt = None,
    cluster: ClusterOpt = None,
    allow_cross_region: Annotated[bool, typer.Option("--allow-cross-region", help="Accept TPU steps reading buckets outside the [gcp] zone's region.")] = False,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Also write the plan to this file, for `marinbuild run --plan FILE`.")] = None,
    wide: Annotated[bool, typer.Option("--wide", help="On a terminal, whole output paths and reasons instead of a table within 100 columns.")] = False,
    list_steps: Annotated[bool, typer.Option("--list", help="Print the names of the steps the targets select, one a line (as `marinbuild list`).")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Show what `run` would do, and why, without running or writing anything (but the -o file)."""
    if list_steps:
        from marinbuild.cli.list import print_step_names

        print_step_names(file, prefix, targets)
        return
    from marinbuild.cli.startup import opened_project
    from marinbuild.execution import session

    project = opened_project(file, prefix)
    planned = session.plan_run(
        project,
        step_targets(project, targets),
        force=force or [],
        force_all=force_all,
        machine=machine_of(cores, mem, resources, token),
        cluster=cluster,
        explain=not check,
        allow_cross_region=allow_cross_region,
    )
    print_notes(planned)
    from marinbuild.store.storage import prefix_write_problem

    unwritable = prefix_write_problem(project.storage)
    if unwritable is not None and not check:  # reading another team's outputs is fine; running there is not
        err.print(f"marinbuild: note: `run` could not write there: {unwritable}", markup=False)
    the_plan, requests = planned.plan, planned.requests
    environments = planned.fields.environments if planned.fields is not None else {}
    if output is not None:
        from marinbuild.plan_review import plan_document, write_plan_file

        write_plan_file(output, plan_document(the_plan, project.graph.prefix, force or [], force_all, project.marinfile.path))
    if check:
        raise typer.Exit(1 if the_plan.to_run() else 0)
    from marinbuild.cli import plan_notes

    for line in plan_notes.drift_lines(project, the_plan):
        err.print(f"marinbuild: {terminal_safe(line)}", markup=False)
    estimates = plan_notes.estimates(project, the_plan) if dag is None else {}
    if dag is DagFormat.dot:
        sys.stdout.write(dag_text.to_dot(the_plan))
    elif dag is DagFormat.mermaid:
        sys.stdout.write(dag_text.to_mermaid(the_plan))
    elif as_json:
        sys.stdout.write(json.dumps(_json_rows(the_plan, requests, environments, estimates), indent=1) + "\n")
    else:
        print_plan(the_plan, with_environments(planned), wide)
        _print_estimates(estimates, wide)
    if output is not None:
        err.print(f"marinbuild: plan written to {output}; run exactly it with: marinbuild run --plan {output}", markup=False)


def _json_rows(the_plan: Any, requests: Mapping[str, Any], environments: Mapping[str, Any],
               estimates: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``plan --json``: the plan's rows, each with its dependencies, resources, environment and estimate."""
    from marinbuild.plan_review import plan_rows

    return [
        {
            **row.to_json(),
            "dependencies": list(the_plan.node(row.name).deps),
            "resources": describe_request(requests[row.name]),
            "environment": environments[row.name].to_json() if row.name in environments else None,
            "estimate": _estimate_json(estimates, row.name),
        }
        for row in plan_rows(the_plan)
    ]


def _print_estimates(estimates: Mapping[str, Any], wide: bool) -> None:
    """The estimates below the plan's table, as plain lines: a plan into a pipe never imports rich."""
    from marinbuild.cli import plan_notes
    from marinbuild.cli.plan_view import TERMINAL_WIDTH, columns_text, columns_within

    columns = columns_text
    if sys.stdout.isatty() and not wide:  # within the terminal: a longer line would wrap
        import shutil

        room = min(shutil.get_terminal_size().columns, TERMINAL_WIDTH) - 2  # the lines are indented by two
        columns = lambda rows: columns_text(columns_within(rows, room))  # noqa: E731
    for line in plan_notes.estimate_lines(estimates, columns):
        sys.stdout.write(line + "\n")


def _estimate_json(estimates: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """A step's estimate in `plan --json`: null for a step that would not run or has no history."""
    found = estimates.get(name)
    return found.to_json() if found is not None else None
