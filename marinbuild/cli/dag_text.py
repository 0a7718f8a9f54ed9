"""The step graph as text for Graphviz (``dot``) or Mermaid.

>>> # marinbuild plan --dag dot | dot -Tsvg > dag.svg
"""

from __future__ import annotations

import json

from marinbuild.planner import Plan

__all__ = ["to_dot", "to_mermaid"]

_COLORS = {"run": "#f4a261", "skip": "#8ecae6", "wait": "#e9c46a"}


def to_dot(plan: Plan) -> str:
    """Graphviz source: one node per planned step, coloured by action."""
    lines = ["digraph marinbuild {", "  rankdir=LR;", '  node [shape=box, style="rounded,filled"];']
    for name in plan.order:
        action = plan.decisions[name].action.value
        label = json.dumps(f"{name}\n{action}")
        lines.append(f'  {json.dumps(name)} [label={label}, fillcolor="{_COLORS[action]}"];')
    for name in plan.order:
        for dep in plan.node(name).deps:
            if dep in plan.decisions:
                lines.append(f"  {json.dumps(dep)} -> {json.dumps(name)};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def to_mermaid(plan: Plan) -> str:
    """Mermaid flowchart source; step names become labels of generated ids."""
    ids = {name: f"s{i}" for i, name in enumerate(plan.order)}
    lines = ["flowchart LR"]
    for name in plan.order:
        action = plan.decisions[name].action.value
        text = f"{name} ({action})".replace('"', "'")
        lines.append(f'  {ids[name]}["{text}"]:::{action}')
    for name in plan.order:
        for dep in plan.node(name).deps:
            if dep in ids:
                lines.append(f"  {ids[dep]} --> {ids[name]}")
    for action, color in _COLORS.items():
        lines.append(f"  classDef {action} fill:{color}")
    return "\n".join(lines) + "\n"
