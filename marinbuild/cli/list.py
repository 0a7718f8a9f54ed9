"""``marinbuild list``: the step names the targets select, one a line (``run --list`` and ``plan --list`` too)."""

from __future__ import annotations

import sys

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, TargetsArg, VerboseOpt, step_targets
from marinbuild.cli.printing import terminal_safe

__all__ = ["list_steps_command", "print_step_names"]


@handles_errors
def list_steps_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print step names, one a line: those the targets name (globs as usual), else every step."""
    print_step_names(file, prefix, targets)


def print_step_names(file: str, prefix: str | None, targets: list[str] | None) -> None:
    """The names ``targets`` select in the Marinfile, one a line, in the graph's order; every step without targets.

    Nothing under the prefix is read: listing is as cheap as loading the Marinfile.
    """
    from marinbuild.cli.startup import opened_project
    from marinbuild.planner import select

    project = opened_project(file, prefix)
    graph = project.graph
    chosen = set(select(graph, step_targets(project, targets))) if targets else None
    names = [n for n in graph.order if chosen is None or n in chosen]
    sys.stdout.write("".join(terminal_safe(n) + "\n" for n in names))
