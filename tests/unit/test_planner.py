"""Unit tests of marinbuild.planner: selecting targets, the closure, and the decisions of a plan."""

from __future__ import annotations

import pytest

from marinbuild.errors import TargetError
from marinbuild.graph import StepGraph, build_graph
from marinbuild.planner import RESUMES, closure, descendants, make_plan, select
from marinbuild.staleness import Action
from marinbuild.steps import step
from marinbuild.store.markers import FAILED, SUCCESS, StatusRecord


def _chain() -> StepGraph:
    """a -> b -> c, and d on its own; b and d declared."""
    a = step("a", cmd="true")
    b = step("b", cmd="true", config={"a": a})
    c = step("sweep/c", cmd="true", config={"b": b})
    d = step("sweep/d", cmd="true")
    return build_graph([c, d], "/p")


def _done(graph: StepGraph, *names: str) -> dict[str, StatusRecord]:
    return {graph.nodes[n].output_path: StatusRecord(SUCCESS, 1.0, identity=graph.nodes[n].identity) for n in names}


def test_select_by_name_glob_or_nothing() -> None:
    graph = _chain()
    assert select(graph, []) == ("sweep/c", "sweep/d")
    assert select(graph, ["a"]) == ("a",)
    assert set(select(graph, ["sweep/*"])) == {"sweep/c", "sweep/d"}
    with pytest.raises(TargetError, match=r"no step named 'sweep/x'; did you mean"):
        select(graph, ["sweep/x"])
    with pytest.raises(TargetError, match=r"no step named 'zzz'$"):
        select(graph, ["zzz"])


def test_closure_and_descendants() -> None:
    graph = _chain()
    assert closure(graph, ["b"]) == {"a", "b"}
    assert closure(graph, graph.declared) == set(graph.nodes)
    assert descendants(graph, "a") == {"b", "sweep/c"}


def test_nothing_built_runs_everything_in_order() -> None:
    graph = _chain()
    plan = make_plan(graph, ["sweep/c"], statuses={})
    assert plan.order == ("a", "b", "sweep/c")
    assert plan.to_run() == ["a", "b", "sweep/c"]
    assert plan.counts() == {"run": 3}
    assert list(plan.graph.edges) == [("a", "b"), ("b", "sweep/c")]
    assert plan.node("a").name == "a"


def test_an_up_to_date_step_is_not_descended_into() -> None:
    graph = _chain()
    plan = make_plan(graph, ["sweep/c"], statuses=_done(graph, "b"))
    assert plan.order == ("b", "sweep/c")
    assert plan.decisions["b"].action is Action.SKIP
    assert plan.to_run() == ["sweep/c"]


def test_force_reaches_downstream_within_the_targets() -> None:
    graph = _chain()
    statuses = _done(graph, "a", "b", "sweep/c")
    plan = make_plan(graph, ["sweep/c"], statuses, force=["a"])
    assert plan.decisions["a"].reason == "forced"
    assert plan.decisions["b"].reason == "upstream a forced"
    assert plan.decisions["sweep/c"].reason == "upstream a forced"
    assert make_plan(graph, ["b"], statuses, force_all=True).to_run() == ["a", "b"]


def test_a_failed_step_resumes_unless_fresh_output() -> None:
    graph = _chain()
    node = graph.nodes["a"]
    failed = {node.output_path: StatusRecord(FAILED, 1.0, error="boom", identity=node.identity)}
    assert make_plan(graph, ["a"], failed).decisions["a"].reason == f"failed before: boom; {RESUMES}"
    assert make_plan(graph, ["a"], failed, fresh_output=True).decisions["a"].reason == "failed before: boom"


def test_planning_keeps_the_statuses_it_read() -> None:
    graph = _chain()
    statuses = _done(graph, "a")
    assert make_plan(graph, ["a"], statuses).statuses is statuses


def _read(graph: StepGraph, name: str, **times: float) -> StatusRecord:
    """A SUCCESS of ``name`` whose run read each dependency's SUCCESS of the given time."""
    return StatusRecord(SUCCESS, 1.0, identity=graph.nodes[name].identity, inputs=tuple(times.items()))


def test_readers_of_a_dependency_the_plan_runs_run_after_it_in_the_same_plan() -> None:
    graph = _chain()
    b, c = graph.nodes["b"].output_path, graph.nodes["sweep/c"].output_path
    # a was cleaned away and is asked for: it runs, and b and c (which read its earlier output,
    # and b's) follow it, although the walk from c stopped at c.
    plan = make_plan(graph, ["a", "sweep/c"], statuses={b: _read(graph, "b", a=1.0), c: _read(graph, "sweep/c", b=1.0)})
    assert plan.to_run() == ["a", "b", "sweep/c"]
    assert plan.decisions["b"].reason == "dependency a runs first, rewriting what this step read"
    assert plan.decisions["sweep/c"].reason == "dependency b runs first, rewriting what this step read"
    # A marker that records no inputs (an earlier version's) stays up to date, as it would afterwards.
    plan = make_plan(graph, ["sweep/c"], statuses={**_done(graph, "b"), c: _read(graph, "sweep/c", b=1.0)})
    assert plan.to_run() == []
    # Asked for c alone, up to date: nothing is walked beyond it (a cleaned intermediate is no reason).
    plan = make_plan(graph, ["sweep/c"], statuses={b: _read(graph, "b", a=1.0), c: _read(graph, "sweep/c", b=1.0)})
    assert plan.to_run() == [] and plan.order == ("sweep/c",)
    # The sweep's d, outside what the targets need, is not touched by a's rerun.
    d = graph.nodes["sweep/d"].output_path
    plan = make_plan(graph, ["a"], statuses={b: _read(graph, "b", a=1.0), d: _read(graph, "sweep/d")})
    assert plan.to_run() == ["a"]
