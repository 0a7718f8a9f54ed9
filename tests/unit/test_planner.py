"""Unit tests of marinbuild.planner: selecting targets, the closure, and the decisions of a plan."""

from __future__ import annotations

import pytest

from marinbuild import step, versioned
from marinbuild.errors import CycleError, StepDefinitionError, TargetError
from marinbuild.graph import StepGraph, build_graph
from marinbuild.planner import RESUMES, closure, descendants, make_plan, select
from marinbuild.staleness import Action
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


# -- Planning is pure: decisions from a graph, targets and stored statuses.


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
    assert plan.decisions["root"].reason == "failed before: boom; resumes from partial output; --fresh-output to start over"
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


def test_the_plan_is_a_networkx_graph_whose_topological_order_is_the_plans():
    import networkx as nx

    g = diamond()
    plan = make_plan(g, select(g, []), {})
    assert isinstance(plan.graph, nx.DiGraph)
    assert set(plan.graph.edges) == {("root", "train/left"), ("root", "train/right"), ("train/left", "eval"),
                                     ("train/right", "eval")}
    rank = {n: i for i, n in enumerate(g.order)}
    assert tuple(nx.lexicographical_topological_sort(plan.graph, key=rank.__getitem__)) == plan.order
    assert plan.graph.nodes["eval"]["node"] is g.nodes["eval"] and plan.node("eval") is g.nodes["eval"]
    with pytest.raises(nx.NetworkXError):
        plan.graph.add_edge("eval", "root")  # a plan is read-only


def test_a_partial_plan_holds_only_its_steps_and_their_edges_in_order():
    g = diamond()
    statuses = {g.nodes["train/right"].output_path: ok()}
    plan = make_plan(g, ["eval"], statuses)
    assert plan.order == ("root", "train/left", "train/right", "eval")
    left_only = make_plan(g, ["train/left"], {})
    assert list(left_only.graph) == ["root", "train/left"] and list(left_only.graph.edges) == [("root", "train/left")]


def test_closure_and_descendants_come_from_the_graph():
    from marinbuild.planner import closure, descendants

    g = diamond()
    assert closure(g, ["train/left"]) == {"root", "train/left"}
    assert closure(g, g.declared) == set(g.nodes)
    assert descendants(g, "root") == {"train/left", "train/right", "eval"}


def test_a_cycle_through_several_steps_is_named_from_the_graph():
    cfg: dict = {}
    a = step("c/a", cmd="true", config=cfg)
    b = step("c/b", cmd="true", config={"a": a})
    c = step("c/c", cmd="true", config={"b": b})
    cfg["c"] = c
    with pytest.raises(CycleError) as e:
        build_graph([c], "/p")
    message = str(e.value)
    assert message.startswith("the steps form a cycle: ") and all(n in message for n in ("c/a", "c/b", "c/c"))


@pytest.mark.parametrize("override", ["../outside", "sub/../..", "sub/..", ".", "/", "/p", "/p/../q", "/elsewhere/../p/x",
                                      "gs://other/p/x", "a/\0b"])
def test_an_override_that_leaves_the_prefix_is_refused_when_planning(override):
    s = step("o/s", cmd="true", override_output_path=override)
    with pytest.raises(StepDefinitionError) as e:
        build_graph([s], "/p")
    assert str(e.value).startswith("step 'o/s': override_output_path") and "\n" not in str(e.value)


@pytest.mark.parametrize("override, path", [("fixed/place", "/p/fixed/place"), ("/p/abs/x/", "/p/abs/x"),
                                            ("./here", "/p/here"), ("/elsewhere/pinned", "/elsewhere/pinned")])
def test_an_override_inside_the_prefix_or_absolute_is_kept_verbatim(override, path):
    s = step("o/s", cmd="true", override_output_path=override)
    assert build_graph([s], "/p").nodes["o/s"].output_path == path


def test_two_steps_with_one_output_path_are_a_plan_time_error_naming_both():
    a = step("dup/a", cmd="true", override_output_path="shared")
    b = step("dup/b", cmd="true", config={"n": versioned(2)}, override_output_path="/p/shared/")
    with pytest.raises(StepDefinitionError, match=r"steps 'dup/a' and 'dup/b' both write to /p/shared"):
        build_graph([a, b], "/p")


def test_a_step_writing_inside_another_steps_output_is_refused():
    a = step("nest/a", cmd="true", override_output_path="outer")
    b = step("nest/b", cmd="true", override_output_path="outer/inner")
    with pytest.raises(StepDefinitionError, match=r"step 'nest/b' writes inside the output of step 'nest/a'"):
        build_graph([a, b], "/p")
    plain = step("train", cmd="true")
    under = step("nest/c", cmd="true", override_output_path=f"{build_graph([plain], '/p').nodes['train'].ref}/x")
    with pytest.raises(StepDefinitionError, match=r"writes inside the output of step 'train'"):
        build_graph([plain, under], "/p")


@pytest.mark.parametrize(
    "template, message",
    [
        ("echo {v!r}", "{v!r}: conversions (!r, !s, !a) would bypass shell quoting"),
        ("echo {v!s}", "conversions"),
        ("echo {v._value}", "{v._value}: attribute access is not allowed"),
        ("echo {d.keys}", "attribute access is not allowed"),
        ("echo {v:{w}}", "nested fields in a format spec are not allowed"),
        ("echo {0}", "fields must be named"),
        ("echo {}", "fields must be named"),
        ("echo {v", "bad command template"),
        ("echo {missing}", "names {missing}, which is not in its config (has: d, output, v, w)"),
    ],
)
def test_templates_that_would_bypass_quoting_are_refused_when_planning(template, message):
    s = step("tpl/s", cmd=template, config={"v": "x", "w": 3, "d": {"k": "y"}})
    with pytest.raises(StepDefinitionError) as e:
        build_graph([s], "/p")
    assert str(e.value).startswith("step 'tpl/s': ") and message in str(e.value)


def test_plain_fields_keys_and_format_specs_are_accepted_and_quoted():
    from marinbuild.resolve import render_command

    s = step("tpl/ok", cmd="run {v} {d[k]} {n:>4} {lr:.1e} > {output}/x",
             config={"v": "a b", "d": {"k": "$(x)"}, "n": 7, "lr": 0.0003})
    build_graph([s], "/p")
    assert render_command(s.cmd, s.config, "/o") == "run 'a b' '$(x)' '   7' 3.0e-04 > /o/x"


@pytest.mark.parametrize("name", ["nul\0name", "new\nline", "tab\tname", "bell\x07"])
def test_a_step_name_with_a_control_character_is_one_line_error(name):
    with pytest.raises(StepDefinitionError) as e:
        step(name, cmd="true")
    assert "\n" not in str(e.value) and "\0" not in str(e.value)


def test_a_nul_byte_in_a_command_or_env_is_refused_when_declared():
    with pytest.raises(StepDefinitionError, match="NUL byte"):
        step("nul/cmd", cmd="echo \0")
    with pytest.raises(StepDefinitionError, match="not a valid variable"):
        step("nul/env", cmd="true", env={"A": "b\0c"})


def test_networkx_is_imported_only_when_a_graph_question_is_asked(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys
        import marinbuild
        from marinbuild import step
        a = step("a", cmd="true")
        b = step("b", cmd="true", config={{"a": a}})
        plan = marinbuild.plan(steps=[a, b], prefix={str(tmp_path)!r})
        print("networkx" in sys.modules, plan.order)
        print(type(plan.graph).__name__, "networkx" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["False ('a', 'b')", "DiGraph True"]
