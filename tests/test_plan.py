"""Planning is pure: decisions from a graph, targets and stored statuses."""

from __future__ import annotations

import pytest

from marinbuild import step, versioned
from marinbuild.errors import CycleError, TargetError
from marinbuild.graph import build_graph
from marinbuild.planner import make_plan, select
from marinbuild.staleness import Action
from marinbuild.store.markers import StatusRecord


def diamond():
    root = step("root", cmd="true", config={"n": versioned(1)})
    left = step("train/left", cmd="true", config={"r": root})
    right = step("train/right", cmd="true", config={"r": root})
    top = step("eval", cmd="true", config={"l": left, "r": right})
    return build_graph([root, left, right, top], "/p")


def ok():
    return StatusRecord("SUCCESS", 0.0)


def test_fresh_plan_runs_everything_with_reason_new():
    g = diamond()
    plan = make_plan(g, select(g, []), {})
    assert plan.to_run() == list(plan.order)
    assert {d.reason for d in plan.decisions.values()} == {"new"}
    assert plan.order.index("root") < plan.order.index("train/left") < plan.order.index("eval")


def test_success_step_is_not_descended_into():
    g = diamond()
    statuses = {g.nodes["eval"].output_path: ok()}
    plan = make_plan(g, ["eval"], statuses)
    assert list(plan.order) == ["eval"]
    assert plan.decisions["eval"].action is Action.SKIP


def test_failed_and_running_steps_rerun_with_reasons():
    g = diamond()
    statuses = {
        g.nodes["root"].output_path: StatusRecord("FAILED", 0.0, error="boom"),
        g.nodes["train/left"].output_path: StatusRecord("RUNNING", 0.0),
    }
    plan = make_plan(g, ["train/left"], statuses)
    assert plan.decisions["root"].reason == "failed before: boom"
    assert plan.decisions["train/left"].reason.startswith("incomplete")


def test_force_reruns_step_and_its_dependants():
    g = diamond()
    statuses = {n.output_path: ok() for n in g.nodes.values()}
    plan = make_plan(g, ["eval"], statuses, force=["train/left"])
    assert set(plan.to_run()) == {"train/left", "eval"}
    assert plan.decisions["eval"].reason == "upstream train/left forced"
    everything = make_plan(g, ["eval"], statuses, force_all=True)
    assert set(everything.to_run()) == set(g.nodes)


def test_targets_by_glob_and_unknown_target_suggests_names():
    g = diamond()
    assert set(select(g, ["train/*"])) == {"train/left", "train/right"}
    with pytest.raises(TargetError, match="did you mean eval"):
        select(g, ["evl"])


def test_cycle_is_named():
    cfg: dict = {}
    a = step("a", cmd="true", config=cfg)
    b = step("b", cmd="true", config={"a": a})
    cfg["b"] = b
    with pytest.raises(CycleError, match=r"a -> b -> a|b -> a -> b"):
        build_graph([a, b], "/p")


def test_ten_thousand_step_chain_plans_without_recursion():
    prev = step("s0", cmd="true")
    for i in range(1, 10_000):
        prev = step(f"s{i}", cmd="true", config={"d": prev})
    g = build_graph([prev], "/p")
    plan = make_plan(g, [prev.name], {})
    assert len(plan.to_run()) == 10_000
    assert plan.order[0] == "s0" and plan.order[-1] == "s9999"
