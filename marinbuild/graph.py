"""The step graph: every declared or referenced step, its identity and output path.

Building it is pure: it reads the steps and writes nothing. Steps are discovered through
config references without recursion (a 10,000-step chain is fine), identities are computed
once per step in topological order (linear in the number of steps), and two steps with the
same name and identity are merged into one node. Planning queries the steps as a frozen
``networkx.DiGraph`` (:attr:`StepGraph.dag`): a cycle's steps, ancestors and descendants.
The topological order is networkx's lexicographical sort by discovery order, found in one
pass when the discovery order already is one (nearly always: a config can only refer to
steps that exist).

Output paths are checked here too: a relative ``override_output_path`` stays strictly inside
the prefix, an absolute one is used verbatim (never the prefix, a folder holding it, or a
root), and no two steps write to one output (nor one inside another's).
"""

from __future__ import annotations

import functools
import posixpath
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marinbuild.config_walk import named_values
from marinbuild.errors import CycleError, StepDefinitionError
from marinbuild.identity import code_digest, hash_payload, identity_payload, source_digest
from marinbuild.resolve import check_template
from marinbuild.steps import ConfigScan, Step, scan_config
from marinbuild.store.frozen_fill import frozen_filled
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["StepGraph", "StepNode", "build_graph"]


@dataclass(frozen=True)
class StepNode:
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
    """All steps by name, the declared ones in order, and the graph networkx plans with.

    ``order`` is a topological order that follows the Marinfile. ``dag`` is the steps as a
    frozen ``networkx.DiGraph``: nodes are step names carrying their :class:`StepNode` as
    ``"node"``, edges run from a dependency to its dependant, nodes are inserted in
    ``order``.
    """

    nodes: Mapping[str, StepNode]
    declared: tuple[str, ...]
    order: tuple[str, ...]
    prefix: str

    @functools.cached_property
    def dag(self) -> nx.DiGraph:
        """The steps as a frozen ``networkx.DiGraph``, built on first use.

        Importing networkx costs more than planning 10,000 steps does, and a plain dry run
        of every declared step asks no question only a graph answers (see
        docs/benchmarks.md); selecting by pattern, forcing, a cycle and running do.
        """
        import networkx as nx

        nodes = self.nodes
        dag = nx.DiGraph()
        dag.add_nodes_from(nodes)
        nx.set_node_attributes(dag, nodes, "node")
        dag.add_edges_from((d, name) for name, node in nodes.items() for d in node.deps)
        return nx.freeze(dag)

    @functools.cached_property
    def index(self) -> Mapping[str, int]:
        """Each step's position in ``order``."""
        return {n: i for i, n in enumerate(self.order)}


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
    nodes: dict[str, StepNode] = {}
    overridden = False
    for s in order:
        if s.hash_code:
            payload = identity_payload(s.name, s.config, ref_of, scans[s], code_digest(s))
        else:
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
            differs = _what_differs(existing.step, s)
            if differs:
                # One of the two would silently never run: the first one declared wins the merge.
                raise StepDefinitionError(
                    f"two steps are named {s.name!r} with the same identity but a different {differs}; "
                    "give them different names"
                )
            continue
        check_template(s)
        dep_steps = objects[s]
        if len(dep_steps) == 1:  # nearly every step: no generator made for it
            deps: tuple[str, ...] = (dep_steps[0].name,)
        elif dep_steps:
            deps = tuple(dict.fromkeys([d.name for d in dep_steps]))
        else:
            deps = ()
        if s.override_output_path:
            overridden = True
            output_path = override_path(prefix, s.override_output_path, s.name)
        else:
            output_path = f"{under_prefix}{s.name}-{identity}"  # a name is never absolute
        nodes[s.name] = _node(s, identity, payload, deps, output_path)
    if overridden:
        _check_output_paths(nodes)
    names = tuple(dict.fromkeys([s.name for s in declared]))
    return StepGraph(nodes=nodes, declared=names, order=tuple(nodes), prefix=prefix)


def _what_differs(first: Step, second: Step) -> str | None:
    """What two steps merged by name and identity run differently (``command``, ``function``);
    None when they run the same (a diamond's parent made twice).

    Plain config may differ, as it may between runs: it is not the step's identity.
    """
    if first is second:
        return None
    if first.cmd != second.cmd:
        return "command"
    if first.fn is not second.fn and (
        first.fn is None or second.fn is None or _program(first.fn) != _program(second.fn)
    ):
        return "function"
    return None


def _program(fn: Callable[..., Any]) -> tuple[str | None, ...]:
    """What a step function runs: its source, and a ``functools.partial``'s bound arguments too."""
    if isinstance(fn, functools.partial):
        return (*_program(fn.func), repr(fn.args), repr(sorted(fn.keywords.items())))
    return (source_digest(fn),)


def _node(step: Step, identity: str, payload: Mapping[str, Any], deps: tuple[str, ...], output_path: str) -> StepNode:
    # Once per step on every plan: see marinbuild.store.frozen_fill.
    return frozen_filled(StepNode, {"step": step, "identity": identity, "payload": payload, "deps": deps,
                                    "output_path": output_path})


def _discover(declared: list[Step]) -> tuple[dict[Step, ConfigScan], dict[Step, list[Step]]]:
    """Every step reachable from ``declared``: one scan of its config, its distinct dependencies."""
    scans: dict[Step, ConfigScan] = {}
    objects: dict[Step, list[Step]] = {}
    queue = list(dict.fromkeys(declared))
    seen = set(queue)
    # Breadth-first and in declaration order, so that the order of these dicts (which
    # breaks ties in the topological sort) follows the Marinfile.
    for s in queue:
        try:
            scan = scans[s] = scan_config(s.config)
        except StepDefinitionError as e:
            raise StepDefinitionError(f"step {s.name!r}: {e}") from None
        refs = scan.refs
        if len(refs) == 1:
            deps = objects[s] = [refs[0][1]]
        else:
            deps = objects[s] = list(dict.fromkeys([r for _, r, _ in refs])) if refs else []
        for r in deps:
            if r not in seen:
                seen.add(r)
                queue.append(r)
    return scans, objects


def _topological(objects: dict[Step, list[Step]]) -> list[Step]:
    """The steps in topological order, ties broken by discovery order; a cycle is an error.

    ``objects`` maps each step to its distinct dependencies.
    """
    rank = {s: i for i, s in enumerate(objects)}
    # A config can only refer to steps that already exist, so the discovery order of a
    # Marinfile's steps is nearly always topological already: it is then what networkx's
    # lexicographical sort (ties to the lowest rank) would return, found in one pass.
    if all(rank[d] < i for i, ds in enumerate(objects.values()) for d in ds):
        return list(objects)
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(objects)
    g.add_edges_from((d, s) for s, ds in objects.items() for d in ds)
    try:
        return list(nx.lexicographical_topological_sort(g, key=rank.__getitem__))
    except nx.NetworkXUnfeasible:
        cycle = nx.find_cycle(g)
        names = " -> ".join([a.name for a, _ in cycle] + [cycle[0][0].name])
        raise CycleError(f"the steps form a cycle: {names}") from None


def override_path(prefix: str, override: str, name: str = "") -> str:
    """Where ``override_output_path`` puts a step.

    A relative override is joined to the prefix and must stay strictly inside it (no
    ``..``). An absolute path or URL is used verbatim, inside the prefix or not (as in
    Marin: a tokenized dataset pinned in another bucket), but it must hold no ``..``, be on
    the prefix's kind of store, name no filesystem root or bucket, and neither be the prefix
    nor hold it: a step's output may be cleared. ``clean`` leaves an output outside the
    prefix alone unless its step is named with ``--outside-prefix``.

    >>> override_path("/p", "fixed/place")
    '/p/fixed/place'
    >>> override_path("/p", "/shared/tokenized/")
    '/shared/tokenized'
    >>> override_path("/p", "../x", "s")
    Traceback (most recent call last):
    ...
    marinbuild.errors.StepDefinitionError: step 's': override_output_path '../x' must stay inside the prefix (no '..')
    """
    who = f"step {name!r}: " if name else ""
    if "\0" in override:
        raise StepDefinitionError(f"{who}override_output_path {override!r} holds a NUL byte")
    absolute = "://" in override or override.startswith("/")
    rest = override.split("://", 1)[-1]
    if ".." in rest.split("/"):
        where = "not hold '..'" if absolute else "stay inside the prefix (no '..')"
        raise StepDefinitionError(f"{who}override_output_path {override!r} must {where}")
    if not absolute:
        path = Storage.join(prefix, posixpath.normpath(override))
        if not _strictly_inside(path, prefix):
            raise StepDefinitionError(
                f"{who}override_output_path {override!r} must be a folder strictly inside the prefix {prefix!r}"
            )
        return path
    path = override.rstrip("/")
    if path.startswith("file://") and "://" not in prefix:
        path = path[len("file://"):]  # a local store's paths are plain paths
    if _strictly_inside(path, prefix):
        return path
    scheme, body = _split_scheme(path)
    if scheme != _split_scheme(prefix)[0]:
        raise StepDefinitionError(
            f"{who}override_output_path {override!r} is on another kind of store than the prefix {prefix!r}"
        )
    norm = posixpath.normpath(body)
    if norm in ("/", ".", "") or (scheme != "file" and "/" not in norm.strip("/")):
        raise StepDefinitionError(f"{who}override_output_path {override!r} names a filesystem root or a bucket")
    if _strictly_inside(prefix, path) or posixpath.normpath(_split_scheme(prefix)[1]) == norm:
        raise StepDefinitionError(
            f"{who}override_output_path {override!r} is the prefix {prefix!r} or holds it: its output would be cleared"
        )
    return path


def _split_scheme(path: str) -> tuple[str, str]:
    scheme, sep, rest = path.partition("://")
    if not sep:
        return "file", path
    return ("file" if scheme in ("file", "local") else scheme), rest


def _strictly_inside(path: str, prefix: str) -> bool:
    scheme, rest = _split_scheme(path)
    pscheme, prest = _split_scheme(prefix)
    if scheme != pscheme:
        return False
    base = posixpath.normpath(prest).rstrip("/") + "/"
    return posixpath.normpath(rest).startswith(base) and posixpath.normpath(rest) + "/" != base


def _check_output_paths(nodes: Mapping[str, StepNode]) -> None:
    """Two steps never share an output, nor does one lie inside another's (which it would clear)."""
    owner: dict[str, str] = {}
    for name, node in nodes.items():
        path = posixpath.normpath(_split_scheme(node.output_path)[1])
        other = owner.setdefault(path, name)
        if other != name:
            raise StepDefinitionError(
                f"steps {other!r} and {name!r} both write to {node.output_path}; give one another override_output_path"
            )
    for path, name in owner.items():
        parent = posixpath.dirname(path)
        while parent not in ("/", "", "."):
            outer = owner.get(parent)
            if outer is not None:
                raise StepDefinitionError(
                    f"step {name!r} writes inside the output of step {outer!r} ({nodes[outer].output_path}); "
                    "give it an override_output_path of its own"
                )
            parent = posixpath.dirname(parent)


def template_keys(s: Step) -> set[str]:
    """The config keys a step's command template may name (``output`` is always there)."""
    named = named_values(s.config)
    if named is None:
        raise StepDefinitionError(
            f"step {s.name!r}: a shell step's config must be a dict, a dataclass or a NamedTuple, "
            f"got {type(s.config).__name__}"
        )
    return set(named) | {"output"}
