"""The step graph: every declared or referenced step, its identity and output path.

Building it is pure: it reads the steps and writes nothing. Steps are discovered through
config references without recursion (a 10,000-step chain is fine), identities are computed
once per step in topological order (linear in the number of steps), and two steps with the
same name and identity are merged into one node.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import networkx as nx

from .errors import CycleError, StepDefinitionError
from .identity import hash_payload, identity_payload
from .steps import Step, is_dataclass_instance, iter_references
from .storage import Storage

__all__ = ["Node", "StepGraph", "build_graph"]


@dataclass(frozen=True)
class Node:
    """One step in the graph, with what planning and running need to know about it."""

    step: Step
    identity: str
    payload: Mapping[str, Any]
    deps: tuple[str, ...]
    output_path: str

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def ref(self) -> str:
        """``NAME-IDENTITY``: how dependants and humans refer to this version of the step."""
        return f"{self.step.name}-{self.identity}"


@dataclass(frozen=True)
class StepGraph:
    """All steps by name, the declared ones in order, and the DAG (edges dep → dependant)."""

    nodes: Mapping[str, Node]
    declared: tuple[str, ...]
    order: tuple[str, ...]
    dag: nx.DiGraph
    prefix: str


def build_graph(declared: Iterable[Step], prefix: str) -> StepGraph:
    """Discover, order, hash and merge the steps reachable from ``declared``."""
    declared = list(declared)
    objects = _discover(declared)
    order = _topological(objects)
    node_of: dict[Step, Node] = {}
    nodes: dict[str, Node] = {}
    for s in order:
        dep_steps = objects[s]
        dep_ids = {d: node_of[d].ref for d in dep_steps}
        payload = identity_payload(s.name, s.config, dep_ids)
        identity = hash_payload(payload)
        existing = nodes.get(s.name)
        if existing is not None:
            if existing.identity != identity:
                raise StepDefinitionError(
                    f"two different steps are named {s.name!r} (identities {existing.identity} and "
                    f"{identity}); give them different names"
                )
            node_of[s] = existing
            continue
        _check_template(s)
        deps = tuple(dict.fromkeys(node_of[d].name for d in dep_steps))
        node = Node(s, identity, payload, deps, _output_path(prefix, s, identity))
        nodes[s.name] = node_of[s] = node
    dag = nx.DiGraph()
    dag.add_nodes_from(nodes)
    dag.add_edges_from((d, n.name) for n in nodes.values() for d in n.deps)
    names = tuple(dict.fromkeys(node_of[s].name for s in declared))
    topo = tuple(dict.fromkeys(node_of[s].name for s in order))
    return StepGraph(nodes=nodes, declared=names, order=topo, dag=dag, prefix=prefix)


def _discover(declared: list[Step]) -> dict[Step, list[Step]]:
    """Every step reachable from ``declared``, with the steps its config refers to."""
    deps: dict[Step, list[Step]] = {}
    stack = list(declared)
    while stack:
        s = stack.pop()
        if s in deps:
            continue
        refs = list(dict.fromkeys(ref for _, ref, _ in iter_references(s.config)))
        deps[s] = refs
        stack.extend(r for r in refs if r not in deps)
    return deps


def _topological(objects: dict[Step, list[Step]]) -> list[Step]:
    g = nx.DiGraph()
    g.add_nodes_from(objects)
    g.add_edges_from((d, s) for s, ds in objects.items() for d in ds)
    try:
        return list(nx.topological_sort(g))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        names = " -> ".join([a.name for a, _ in cycle] + [cycle[0][0].name])
        raise CycleError(f"the steps form a cycle: {names}") from None


def _output_path(prefix: str, s: Step, identity: str) -> str:
    if s.override_output_path:
        override = s.override_output_path
        if "://" in override or override.startswith("/"):
            return override.rstrip("/")
        return Storage.join(prefix, override)
    return Storage.join(prefix, f"{s.name}-{identity}")


def template_keys(s: Step) -> set[str]:
    """The config keys a step's command template may name (``output`` is always there)."""
    config = s.config
    if config is None:
        keys: set[str] = set()
    elif isinstance(config, dict):
        keys = {str(k) for k in config}
    elif is_dataclass_instance(config):
        keys = set(config.__dataclass_fields__)
    else:
        raise StepDefinitionError(
            f"step {s.name!r}: a shell step's config must be a dict or a dataclass, got {type(config).__name__}"
        )
    return keys | {"output"}


def _check_template(s: Step) -> None:
    if s.cmd is None:
        return
    keys = template_keys(s)
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(s.cmd) if f is not None]
    except ValueError as e:
        raise StepDefinitionError(f"step {s.name!r}: bad command template: {e}") from None
    for f in fields:
        head = f.split(".", 1)[0].split("[", 1)[0]
        if head == "" or head.isdigit():
            raise StepDefinitionError(f"step {s.name!r}: command template fields must be named, not {{{f}}}")
        if head not in keys:
            known = ", ".join(sorted(keys))
            raise StepDefinitionError(
                f"step {s.name!r}: command template names {{{head}}}, which is not in its config (has: {known})"
            )
