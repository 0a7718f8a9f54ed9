"""``marinbuild why``: why steps would (or would not) run, as a field-level diff against each one's last run."""

from __future__ import annotations

from typing import Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, VerboseOpt, complete_steps, step_targets
from marinbuild.cli.printing import out, terminal_safe
from marinbuild.cli.startup import opened_project
from marinbuild.history import RunIndex, earlier_info
from marinbuild.planner import select
from marinbuild.project import Project, plan_targets
from marinbuild.staleness import Action, Decision, diff_payloads
from marinbuild.store.markers import read_info

__all__ = ["why_command"]


@handles_errors
def why_command(
    targets: Annotated[list[str], typer.Argument(help="The steps to explain: names, globs or output paths.", autocompletion=complete_steps)],
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Why steps would (or would not) run: a field-level diff against each one's last run."""
    project = opened_project(file, prefix)
    names = select(project.graph, step_targets(project, targets))
    the_plan = plan_targets(project, list(names))
    index = RunIndex(project.storage, project.graph, list(names))
    for i, name in enumerate(names):
        if i:
            _say("")
        _explain(project, name, the_plan.decisions[name], index)


def _say(line: str) -> None:
    """One line of ``why``, its config values defused (no escape sequence, no line break reaches the terminal)."""
    out.print(terminal_safe(line), markup=False)


def _headline(name: str, action: Action, reason: str) -> str:
    """The first line of `why`: the verdict, and the reason when it adds something.

    >>> _headline("a", Action.SKIP, "up to date"), _headline("b", Action.WAIT, "waiting: leased by h:1")
    ('a is up to date', 'b waits: leased by h:1')
    """
    if action is Action.SKIP:
        return f"{name} is up to date" + ("" if reason == "up to date" else f": {reason}")
    if action is Action.WAIT:
        return f"{name} waits: {reason.removeprefix('waiting: ')}"
    return f"{name} would run: {reason}"


def _explain(project: Project, name: str, decision: Decision, index: RunIndex) -> None:
    graph = project.graph
    node = graph.nodes[name]
    _say(_headline(name, decision.action, decision.reason))
    _say(f"  identity {node.identity}  output {node.output_path}")
    own = read_info(project.storage, node.output_path)
    from marinbuild.cli.plan_notes import why_extras

    if own is not None:
        _say("  this identity ran before (same versioned values and dependencies)")
        for line in why_extras(project, name, own, own=True):
            _say(f"  {line}")
        return
    info = earlier_info(project.storage, node, index)
    if info is None or not isinstance(info.get("identity_payload"), dict):
        _say("  no earlier run of this step under the prefix")
        return
    _say(f"  compared with the earlier run at {info.get('output_path')}:")
    changes = diff_payloads(info["identity_payload"], node.payload)
    for c in changes:
        _say(f"  {c.line()}")
    if not changes:
        _say("  no field differs")
    for line in why_extras(project, name, info, own=False):
        _say(f"  {line}")
