"""The plan: which steps a run covers, in what order, and what happens to each.

Planning is pure. It takes the step graph, the targets and a snapshot of stored statuses,
and returns decisions; it never touches storage. A step that is up to date is not
descended into: its identity already covers its ancestors, whose outputs may be gone.

The plan is a ``networkx.DiGraph`` (:attr:`Plan.graph`): its nodes are the planned steps'
names carrying their :class:`~marinbuild.graph.StepNode` as ``"node"``, its edges run from a
dependency to its dependant, and :attr:`Plan.order` is a topological order of it.
Selection by pattern, the closure of chosen targets and the descendants of a forced step
are networkx queries on the step graph. networkx is imported only when one is asked: a dry
run of every declared step needs none (the closure of every declared step is every step).

>>> from marinbuild.graph import build_graph
>>> from marinbuild.steps import step
>>> a = step("a", cmd="true")
>>> b = step("b", cmd="true", config={"a": a})
>>> plan = make_plan(build_graph([a, b], "/p"), ["b"], statuses={})
>>> plan.order, list(plan.graph.edges)
(('a', 'b'), [('a', 'b')])
"""

from __future__ import annotations

import difflib
import fnmatch
import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from marinbuild.errors import TargetError
from marinbuild.graph import StepGraph, StepNode
from marinbuild.staleness import Action, Decision, decide
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["RESUMES", "Plan", "closure", "descendants", "make_plan", "select"]


@dataclass(frozen=True)
class Plan:
    """Decisions for every step the targets need, in topological order.

    ``steps`` is the whole step graph the plan was made from; :attr:`graph` the planned
    steps' own ``networkx.DiGraph``, of which ``order`` is a topological order.
    """

    steps: StepGraph
    targets: tuple[str, ...]
    order: tuple[str, ...]
    decisions: Mapping[str, Decision]
    statuses: Mapping[str, StatusRecord] = field(default_factory=dict, repr=False, compare=False)
    """The stored status the plan was decided from, by output path (absent: none found)."""

    @functools.cached_property
    def graph(self) -> nx.DiGraph:
        """The planned steps as a read-only ``networkx.DiGraph``, edges from a dependency to its dependant.

        Nodes are step names carrying their :class:`~marinbuild.graph.StepNode` as ``"node"``,
        inserted in plan order. Built on first use (networkx is imported then).
        """
        if len(self.order) == len(self.steps.nodes):
            return self.steps.dag
        import networkx as nx

        nodes = self.steps.nodes
        members = set(self.order)
        sub = nx.DiGraph()
        sub.add_nodes_from(self.order)
        nx.set_node_attributes(sub, {n: nodes[n] for n in self.order}, "node")
        sub.add_edges_from((d, n) for n in self.order for d in nodes[n].deps if d in members)
        return nx.freeze(sub)

    def node(self, name: str) -> StepNode:
        """The step ``name``'s graph node (identity, output path, dependencies)."""
        return self.steps.nodes[name]

    def to_run(self) -> list[str]:
        """The steps that will run (or are waited for), in order."""
        return list(self._to_run)

    @functools.cached_property
    def _to_run(self) -> tuple[str, ...]:
        # Asked for by every stage of a plan and of a run: the 10,000 lookups once.
        decisions, skip = self.decisions, Action.SKIP
        return tuple([n for n in self.order if decisions[n].action is not skip])

    def counts(self) -> dict[str, int]:
        """How many steps get each action."""
        out: dict[str, int] = {}
        for d in self.decisions.values():
            action = str(d.action)
            out[action] = out.get(action, 0) + 1
        return out


RESUMES = "resumes from partial output; --fresh-output to start over"
"""Said of a failed or interrupted step that will continue in its output folder."""

_PARTIAL = frozenset({FAILED, RUNNING})


def select(graph: StepGraph, patterns: Sequence[str]) -> tuple[str, ...]:
    """Step names matching ``patterns`` (names or globs); none means every declared step."""
    if not patterns:
        return graph.declared
    dag = graph.dag
    chosen: dict[str, None] = {}
    for pattern in patterns:
        if pattern in dag:
            chosen[pattern] = None
            continue
        matches = fnmatch.filter(dag, pattern) if any(c in pattern for c in "*?[") else []
        if not matches:
            close = difflib.get_close_matches(pattern, list(dag), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise TargetError(f"no step named {pattern!r}{hint}")
        chosen.update(dict.fromkeys(matches))
    return tuple(chosen)


def closure(graph: StepGraph, targets: Iterable[str]) -> set[str]:
    """The targets and all their ancestors."""
    wanted = set(targets)
    if wanted.issuperset(graph.declared):
        # Every step in the graph was discovered from a declared one: all of them.
        return set(graph.nodes)
    import networkx as nx

    out: set[str] = set()
    index = graph.index
    for target in sorted(wanted, key=index.__getitem__, reverse=True):  # dependants first: they cover more
        if target not in out:
            out.add(target)
            out |= nx.ancestors(graph.dag, target)
    return out


def descendants(graph: StepGraph, name: str) -> set[str]:
    """Every step downstream of ``name``."""
    import networkx as nx

    return set(nx.descendants(graph.dag, name))


def make_plan(
    graph: StepGraph,
    targets: Sequence[str],
    statuses: Mapping[str, StatusRecord],
    force: Sequence[str] = (),
    force_all: bool = False,
    rerun_inputs: Mapping[str, str] | None = None,
    fresh_output: bool = False,
) -> Plan:
    """Decide every step the targets need; ``statuses`` maps output paths to stored status.

    ``rerun_inputs`` maps a finished step whose dependency was rerun since it ran to the
    reason (:func:`marinbuild.input_times.rerun_inputs`): it runs again. A failed or
    interrupted step continues from its partial output, and its reason says so, unless
    ``fresh_output`` (``run --fresh-output``) or the step's own ``fresh_output=True``.

    The walk from the targets up is the plan's own: it stops at a step that is up to date,
    which no networkx traversal does.
    """
    forced = _forced_reasons(graph, targets, force, force_all)
    rerun = rerun_inputs or {}
    nodes = graph.nodes
    skip = Action.SKIP
    decisions: dict[str, Decision] = {}
    rebuilt: set[str] = set()  # readers run because a dependency is rebuilt (below)
    stack = list(targets)
    while stack:
        while stack:
            name = stack.pop()
            if name in decisions:
                continue
            node = nodes[name]
            record = statuses.get(node.output_path)
            decision = decide(record, forced.get(name), rerun.get(name))
            if record is not None and record.status in _PARTIAL and decision.action is Action.RUN and not (
                decision.forced or record.mismatch or record.starting_over or node.step.fresh_output or fresh_output
            ):
                decision = Decision(decision.action, f"{decision.reason}; {RESUMES}")
            decisions[name] = decision
            if decision.action is not skip:
                stack.extend(node.deps)
        for name in _run_readers_of_rebuilt(graph, targets, statuses, decisions, rebuilt):
            stack.extend(nodes[name].deps)  # what it needs, not walked while it was up to date
    order = graph.order if len(decisions) == len(nodes) else tuple(n for n in graph.order if n in decisions)
    return Plan(steps=graph, targets=tuple(targets), order=order, decisions=decisions, statuses=statuses)


def _run_readers_of_rebuilt(
    graph: StepGraph,
    targets: Sequence[str],
    statuses: Mapping[str, StatusRecord],
    decisions: dict[str, Decision],
    rebuilt: set[str],
) -> list[str]:
    """Turn to ``run`` each up-to-date step that read a dependency this plan rebuilds from nothing; their names.

    A dependency cleaned away has no status, which by itself changes nothing: the reader's
    identity covers it. But once the plan runs it (it was asked for), its new ``SUCCESS``
    makes the reader stale (:mod:`marinbuild.input_times`): make's newer prerequisite. Run
    in the same plan, a run leaves nothing stale behind it. The reader's own readers follow
    (``rebuilt``). Other reasons to run a dependency reach its readers already (forced:
    ``upstream X forced``; a rerun begun: ``dependency X rerun since``); a damaged marker
    of the dependency spoils nothing else. Steps whose marker records no inputs (written
    before runs recorded them) stay up to date, as they would afterwards. A step the walk did
    not reach (below an up-to-date one) but that the targets need counts too. Walked in
    topological order, so that a whole chain of readers turns in one pass.
    """
    run = Action.RUN
    if not statuses or not any(d.action is run for d in decisions.values()):
        return []  # nothing ran before (no reader to turn), or a no-op plan: nothing to look at
    nodes = graph.nodes
    scope = closure(graph, targets)

    def rebuilds(dep: str) -> bool:
        decided = decisions.get(dep)
        if decided is None or decided.action is not run:
            return False
        return dep in rebuilt or statuses.get(nodes[dep].output_path) is None

    turned: list[str] = []
    for name in graph.order:
        decision = decisions.get(name)
        if name not in scope if decision is None else decision.action is not Action.SKIP:
            continue  # not needed by the targets, or deciding to run or wait already
        record = statuses.get(nodes[name].output_path)
        if record is None or record.status != SUCCESS or record.mismatch:
            continue
        if record.inputs is None and record.inputs_digest is None:
            continue
        dep = next((d for d in nodes[name].deps if rebuilds(d)), None)
        if dep is not None:
            decisions[name] = Decision(run, f"dependency {dep} runs first, rewriting what this step read")
            rebuilt.add(name)
            turned.append(name)
    return turned


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
        for below in descendants(graph, name) & scope:
            reasons.setdefault(below, f"upstream {name} forced")
    return reasons
