"""The step graph: every declared or referenced step, its identity and output path.

Building it is pure: it reads the steps and writes nothing. Steps are discovered through
config references without recursion (a 10,000-step chain is fine), identities are computed
once per step in topological order (linear in the number of steps), and two steps with the
same name and identity are merged into one node.
"""

from __future__ import annotations

import functools
import heapq
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marinbuild.errors import CycleError, StepDefinitionError
from marinbuild.identity import hash_payload, identity_payload
from marinbuild.steps import ConfigScan, Step, is_dataclass_instance, scan_config
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    import networkx as nx

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
    """All steps by name, the declared ones in order (and all in topological order)."""

    nodes: Mapping[str, Node]
    declared: tuple[str, ...]
    order: tuple[str, ...]
    prefix: str

    @functools.cached_property
    def dag(self) -> nx.DiGraph:
        """The graph as a networkx DiGraph, edges from dependency to dependant.

        Built on first use: the everyday paths (load, hash, probe, no-op run) need only
        the topological order, and importing networkx costs more than planning 10,000 steps.
        """
        import networkx as nx

        dag = nx.DiGraph()
        dag.add_nodes_from(self.nodes)
        dag.add_edges_from((d, n.name) for n in self.nodes.values() for d in n.deps)
        return dag


def build_graph(declared: Iterable[Step], prefix: str) -> StepGraph:
    """Discover, order, hash and merge the steps reachable from ``declared``."""
    declared = list(declared)
    under_prefix = Storage.join(prefix, "")  # what Storage.join(prefix, name) puts before name
    scans, objects = _discover(declared)
    order = _topological(objects)
    # Merged steps share their name and identity, so a step's own name and the ref made
    # for it serve whichever node it was merged into. Every dependency's ref is known
    # before its dependants are hashed (topological order).
    ref_of: dict[Step, str] = {}
    nodes: dict[str, Node] = {}
    for s in order:
        payload = identity_payload(s.name, s.config, ref_of, scans[s])
        identity = hash_payload(payload)
        ref_of[s] = f"{s.name}-{identity}"
        existing = nodes.get(s.name)
        if existing is not None:
            if existing.identity != identity:
                raise StepDefinitionError(
                    f"two different steps are named {s.name!r} (identities {existing.identity} and "
                    f"{identity}); give them different names"
                )
            continue
        _check_template(s)
        dep_steps = objects[s]
        if len(dep_steps) > 1:
            deps = tuple(dict.fromkeys(d.name for d in dep_steps))
        else:
            deps = tuple(d.name for d in dep_steps)
        if s.override_output_path:
            output_path = _override_path(prefix, s.override_output_path)
        else:
            output_path = f"{under_prefix}{s.name}-{identity}"  # a name is never absolute
        nodes[s.name] = Node(s, identity, payload, deps, output_path)
    names = tuple(dict.fromkeys(s.name for s in declared))
    topo = tuple(dict.fromkeys(s.name for s in order))
    return StepGraph(nodes=nodes, declared=names, order=topo, prefix=prefix)


def _discover(declared: list[Step]) -> tuple[dict[Step, ConfigScan], dict[Step, list[Step]]]:
    """Every step reachable from ``declared``: one scan of its config, its distinct dependencies."""
    scans: dict[Step, ConfigScan] = {}
    objects: dict[Step, list[Step]] = {}
    queue = list(dict.fromkeys(declared))
    seen = set(queue)
    # Breadth-first and in declaration order, so that the order of these dicts (which
    # breaks ties in the topological sort) follows the Marinfile.
    for s in queue:
        scan = scans[s] = scan_config(s.config)
        refs = scan.refs
        deps = objects[s] = [refs[0][1]] if len(refs) == 1 else list(dict.fromkeys(r for _, r, _ in refs))
        for r in deps:
            if r not in seen:
                seen.add(r)
                queue.append(r)
    return scans, objects


def _topological(objects: dict[Step, list[Step]]) -> list[Step]:
    """Kahn's algorithm, ties broken by discovery order; linear and without recursion.

    ``objects`` maps each step to its distinct dependencies.
    """
    rank = {s: i for i, s in enumerate(objects)}
    by_rank = list(objects)
    # A config can only refer to steps that already exist, so the discovery order of a
    # Marinfile's steps is nearly always topological already; Kahn's algorithm, whose ties
    # go to the lowest rank, would return it unchanged.
    if all(rank[d] < i for i, ds in enumerate(objects.values()) for d in ds):
        return by_rank
    indegree = [len(objects[s]) for s in by_rank]
    dependants: list[list[int]] = [[] for _ in by_rank]
    for i, ds in enumerate(objects.values()):
        for d in ds:
            dependants[rank[d]].append(i)
    ready = [i for i, n in enumerate(indegree) if n == 0]
    heapq.heapify(ready)
    order: list[Step] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(by_rank[i])
        for j in dependants[i]:
            indegree[j] -= 1
            if indegree[j] == 0:
                heapq.heappush(ready, j)
    if len(order) < len(by_rank):
        _raise_cycle(objects)
    return order


def _raise_cycle(objects: dict[Step, list[Step]]) -> None:
    import networkx as nx

    g = nx.DiGraph()
    g.add_edges_from((d, s) for s, ds in objects.items() for d in ds)
    cycle = nx.find_cycle(g)
    names = " -> ".join([a.name for a, _ in cycle] + [cycle[0][0].name])
    raise CycleError(f"the steps form a cycle: {names}")


def _override_path(prefix: str, override: str) -> str:
    """Where ``override_output_path`` puts a step: absolute or a URL as given, else under the prefix."""
    if "://" in override or override.startswith("/"):
        return override.rstrip("/")
    return Storage.join(prefix, override)


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


@functools.lru_cache(maxsize=4096)
def _template_fields(template: str) -> tuple[str, ...] | str:
    """The top-level names a template uses, or the parse error's text."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        return str(e)
    return tuple(f.split(".", 1)[0].split("[", 1)[0] for f in fields)


def _check_template(s: Step) -> None:
    if s.cmd is None:
        return
    config = s.config
    if isinstance(config, dict):
        names: Any = config
    elif config is None:
        names = ()
    else:
        names = template_keys(s)  # a dataclass's fields, or the error for any other config
    fields = _template_fields(s.cmd)
    if isinstance(fields, str):
        raise StepDefinitionError(f"step {s.name!r}: bad command template: {fields}")
    for head in fields:
        if head == "" or head.isdigit():
            raise StepDefinitionError(f"step {s.name!r}: command template fields must be named, not {{{head}}}")
        if head in names or head == "output":
            continue
        keys = template_keys(s)
        if head not in keys:
            known = ", ".join(sorted(keys))
            raise StepDefinitionError(
                f"step {s.name!r}: command template names {{{head}}}, which is not in its config (has: {known})"
            )
