"""The plan: which steps a run covers, in what order, and what happens to each.

Planning is pure. It takes the graph, the targets and a snapshot of stored statuses, and
returns decisions; it never touches storage. A step that is up to date is not descended
into: its identity already covers its ancestors, whose outputs may be gone.

>>> # plan = make_plan(graph, ["train/*"], statuses={}, force=[], force_all=False)
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from marinbuild.errors import TargetError
from marinbuild.graph import Node, StepGraph
from marinbuild.staleness import Action, Decision, decide
from marinbuild.store.markers import StatusRecord

__all__ = ["Plan", "closure", "make_plan", "select"]


@dataclass(frozen=True)
class Plan:
    """Decisions for every step the targets need, in topological order."""

    graph: StepGraph
    targets: tuple[str, ...]
    order: tuple[str, ...]
    decisions: Mapping[str, Decision]

    def node(self, name: str) -> Node:
        return self.graph.nodes[name]

    def to_run(self) -> list[str]:
        return [n for n in self.order if self.decisions[n].action is not Action.SKIP]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in self.decisions.values():
            action = str(d.action)
            out[action] = out.get(action, 0) + 1
        return out


def select(graph: StepGraph, patterns: Sequence[str]) -> tuple[str, ...]:
    """Step names matching ``patterns`` (names or globs); none means every declared step."""
    if not patterns:
        return graph.declared
    chosen: dict[str, None] = {}
    for pattern in patterns:
        if pattern in graph.nodes:
            chosen[pattern] = None
            continue
        matches = fnmatch.filter(graph.order, pattern) if any(c in pattern for c in "*?[") else []
        if not matches:
            close = difflib.get_close_matches(pattern, list(graph.nodes), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TargetError(f"no step named {pattern!r}{hint}")
        chosen.update(dict.fromkeys(matches))
    return tuple(chosen)


def closure(graph: StepGraph, targets: Iterable[str]) -> set[str]:
    """The targets and all their ancestors."""
    out = set(targets)
    stack = list(out)
    while stack:
        for dep in graph.nodes[stack.pop()].deps:
            if dep not in out:
                out.add(dep)
                stack.append(dep)
    return out


def make_plan(
    graph: StepGraph,
    targets: Sequence[str],
    statuses: Mapping[str, StatusRecord],
    force: Sequence[str] = (),
    force_all: bool = False,
) -> Plan:
    """Decide every step the targets need; ``statuses`` maps output paths to stored status."""
    forced = _forced_reasons(graph, targets, force, force_all)
    nodes = graph.nodes
    skip = Action.SKIP
    decisions: dict[str, Decision] = {}
    stack = list(targets)
    while stack:
        name = stack.pop()
        if name in decisions:
            continue
        node = nodes[name]
        decision = decide(statuses.get(node.output_path), forced.get(name))
        decisions[name] = decision
        if decision.action is not skip:
            stack.extend(node.deps)
    order = tuple(n for n in graph.order if n in decisions)
    return Plan(graph=graph, targets=tuple(targets), order=order, decisions=decisions)


def _forced_reasons(
    graph: StepGraph, targets: Sequence[str], force: Sequence[str], force_all: bool
) -> dict[str, str]:
    if not force_all and not force:
        return {}
    scope = closure(graph, targets)
    if force_all:
        return dict.fromkeys(scope, "forced")
    chosen = select(graph, force)
    reasons: dict[str, str] = {}
    for name in chosen:
        if name not in scope:
            continue
        reasons[name] = "forced"
        for below in _descendants(graph, name) & scope:
            reasons.setdefault(below, f"upstream {name} forced")
    return reasons


def _descendants(graph: StepGraph, name: str) -> set[str]:
    import networkx as nx

    return set(nx.descendants(graph.dag, name))
