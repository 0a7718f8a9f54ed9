"""Unit tests of marinbuild.graph: discovery, order, identities, merging, output paths."""

from __future__ import annotations

import pytest

from marinbuild.errors import CycleError, StepDefinitionError
from marinbuild.graph import build_graph, override_path, template_keys
from marinbuild.steps import output_path_of, step, this_output_path, versioned


def _fn(cfg: object) -> None:
    pass


def test_dependencies_are_discovered_and_ordered_before_dependants() -> None:
    a = step("a", _fn, {"n": versioned(1)})
    b = step("b", _fn, {"a": a})
    c = step("c", _fn, {"a": output_path_of(a, "x"), "b": b})
    graph = build_graph([c], "/p")
    assert graph.declared == ("c",)
    assert set(graph.nodes) == {"a", "b", "c"}
    assert graph.order.index("a") < graph.order.index("b") < graph.order.index("c")
    assert set(graph.nodes["c"].deps) == {"a", "b"}
    assert graph.nodes["a"].deps == ()
    assert graph.index["c"] == graph.order.index("c")


def test_output_path_is_prefix_name_identity() -> None:
    a = step("a", _fn, {"n": versioned(1)})
    node = build_graph([a], "/p").nodes["a"]
    assert node.output_path == f"/p/a-{node.identity}"
    assert node.ref == f"a-{node.identity}"
    assert node.name == "a"


def test_identity_follows_versioned_values_and_dependencies() -> None:
    def graph_for(n: int) -> tuple[str, str]:
        a = step("a", _fn, {"n": versioned(n), "plain": "ignored"})
        b = step("b", _fn, {"a": a})
        nodes = build_graph([b], "/p").nodes
        return nodes["a"].identity, nodes["b"].identity

    a1, b1 = graph_for(1)
    assert graph_for(1) == (a1, b1)
    a2, b2 = graph_for(2)
    assert a2 != a1
    assert b2 != b1  # a dependency's identity enters its dependant's


def test_plain_values_do_not_change_identity() -> None:
    one = build_graph([step("a", _fn, {"plain": 1})], "/p").nodes["a"].identity
    two = build_graph([step("a", _fn, {"plain": 2})], "/p").nodes["a"].identity
    assert one == two


def test_identical_steps_with_one_name_merge() -> None:
    a1 = step("a", _fn, {"n": versioned(1)})
    a2 = step("a", _fn, {"n": versioned(1)})
    graph = build_graph([step("b", _fn, {"x": a1, "y": a2})], "/p")
    assert list(graph.nodes) == ["a", "b"]
    assert graph.nodes["b"].deps == ("a",)


def test_different_steps_with_one_name_are_an_error() -> None:
    a1 = step("a", _fn, {"n": versioned(1)})
    a2 = step("a", _fn, {"n": versioned(2)})
    with pytest.raises(StepDefinitionError, match="two different steps are named 'a'"):
        build_graph([a1, a2], "/p")


def test_one_name_and_identity_running_two_programs_is_an_error_but_one_step_made_twice_is_one() -> None:
    def other(cfg: object) -> None:
        print("another program")

    with pytest.raises(StepDefinitionError, match="named 'a' with the same identity but a different command"):
        build_graph([step("a", cmd="echo one", config={"n": 1}), step("a", cmd="echo two", config={"n": 2})], "/p")
    with pytest.raises(StepDefinitionError, match="named 'a' with the same identity but a different function"):
        build_graph([step("a", _fn, {}), step("a", other, {})], "/p")
    # Made twice (a function called by two dependants), or differing in plain config only: one step.
    twice = build_graph([step("b", _fn, {"a": step("a", cmd="echo {n}", config={"n": 1})}),
                         step("c", _fn, {"a": step("a", cmd="echo {n}", config={"n": 2})})], "/p")
    assert list(twice.nodes) == ["a", "b", "c"]


def test_a_cycle_is_reported_with_its_steps() -> None:
    a = step("a", _fn, {})
    b = step("b", _fn, {"a": a})
    a.config["b"] = b  # only a mutated config can close a cycle
    with pytest.raises(CycleError, match="cycle"):
        build_graph([b], "/p")


def test_dag_edges_run_from_dependency_to_dependant() -> None:
    a = step("a", _fn, {})
    b = step("b", _fn, {"a": a})
    dag = build_graph([b], "/p").dag
    assert list(dag.edges) == [("a", "b")]
    assert dag.nodes["b"]["node"].name == "b"


def test_declared_order_breaks_ties() -> None:
    steps = [step(n, _fn, {}) for n in ("z", "m", "a")]
    assert build_graph(steps, "/p").order == ("z", "m", "a")


def test_override_path_inside_prefix() -> None:
    assert override_path("/p", "fixed/place") == "/p/fixed/place"
    assert override_path("gs://b/p", "gs://b/p/x/") == "gs://b/p/x"
    assert override_path("/p", "/p/inside") == "/p/inside"


def test_an_absolute_override_outside_the_prefix_is_used_verbatim() -> None:
    assert override_path("/p", "/elsewhere/pinned/") == "/elsewhere/pinned"
    assert override_path("/p", "file:///elsewhere/pinned") == "/elsewhere/pinned"
    assert override_path("gs://b/p", "gs://other/tokenized") == "gs://other/tokenized"


@pytest.mark.parametrize("bad", ["../x", "/p", "/", "//", "/p/../q", "/elsewhere/../p/x", "a\0b", "gs://b/p/y",
                                 "/p/", "sub/..", "."])
def test_override_path_escaping_or_holding_the_prefix_is_refused(bad: str) -> None:
    with pytest.raises(StepDefinitionError):
        override_path("/p", bad, "s")


@pytest.mark.parametrize("bad", ["gs://b", "gs://other", "gs://b/p", "gs://b/", "/local/x", "gs://o/../b/p"])
def test_override_path_on_gcs_never_names_a_bucket_the_prefix_or_another_store(bad: str) -> None:
    with pytest.raises(StepDefinitionError):
        override_path("gs://b/p", bad, "s")


def test_two_steps_with_one_output_are_refused() -> None:
    a = step("a", _fn, {}, override_output_path="same")
    b = step("b", _fn, {}, override_output_path="same")
    with pytest.raises(StepDefinitionError, match="both write to"):
        build_graph([a, b], "/p")


def test_one_output_inside_another_is_refused() -> None:
    a = step("a", _fn, {}, override_output_path="outer")
    b = step("b", _fn, {}, override_output_path="outer/inner")
    with pytest.raises(StepDefinitionError, match="writes inside the output"):
        build_graph([a, b], "/p")


def test_template_keys_are_config_keys_and_output() -> None:
    s = step("s", cmd="echo {x} > {output}/f", config={"x": 1, "out": this_output_path()})
    assert template_keys(s) == {"x", "out", "output"}
    with pytest.raises(StepDefinitionError, match="must be a dict"):
        template_keys(step("t", cmd="echo", config=[1, 2]))


def test_a_template_naming_an_unknown_key_fails_the_build() -> None:
    s = step("s", cmd="echo {missing}", config={"x": 1})
    with pytest.raises(StepDefinitionError):
        build_graph([s], "/p")


def test_building_writes_nothing(tmp_path) -> None:
    a = step("a", _fn, {"n": versioned(1)})
    build_graph([step("b", _fn, {"a": a})], str(tmp_path / "prefix"))
    assert list(tmp_path.iterdir()) == []
