"""Unit tests of marinbuild.input_times: finished steps whose dependency was rerun since they ran."""

from __future__ import annotations

from marinbuild.graph import StepGraph, build_graph
from marinbuild.input_times import rerun_inputs
from marinbuild.steps import step
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, UNREADABLE, StatusRecord, inputs_digest


def _chain() -> StepGraph:
    a = step("a", cmd="true")
    b = step("b", cmd="true", config={"a": a})
    c = step("c", cmd="true", config={"b": b})
    return build_graph([c], "/p")


def _statuses(graph: StepGraph, **records: StatusRecord | None) -> dict[str, StatusRecord]:
    return {graph.nodes[n].output_path: r for n, r in records.items() if r is not None}


def _done(time: float, **inputs: float) -> StatusRecord:
    return StatusRecord(SUCCESS, time, inputs=tuple(sorted(inputs.items())) if inputs else None)


def test_unchanged_dependencies_keep_every_step_up_to_date() -> None:
    g = _chain()
    statuses = _statuses(g, a=_done(1.0), b=_done(2.0, a=1.0), c=_done(3.0, b=2.0))
    assert rerun_inputs(g, g.nodes, statuses) == ({}, [])


def test_a_rerun_dependency_makes_its_reader_and_everything_below_stale() -> None:
    g = _chain()
    statuses = _statuses(g, a=_done(5.0), b=_done(2.0, a=1.0), c=_done(3.0, b=2.0))
    stale, unsure = rerun_inputs(g, g.nodes, statuses)
    assert stale == {"b": "dependency a rerun since this step ran", "c": "upstream a rerun since this step ran"}
    assert unsure == []


def test_a_rerun_that_failed_or_was_interrupted_counts_as_rewritten() -> None:
    g = _chain()
    for status in (FAILED, RUNNING):
        statuses = _statuses(g, a=StatusRecord(status, 5.0), b=_done(2.0, a=1.0), c=_done(3.0, b=2.0))
        assert set(rerun_inputs(g, g.nodes, statuses)[0]) == {"b", "c"}


def test_no_status_an_unreadable_one_or_no_record_changes_nothing() -> None:
    g = _chain()
    cleaned = _statuses(g, b=_done(2.0, a=1.0), c=_done(3.0, b=2.0))
    assert rerun_inputs(g, g.nodes, cleaned) == ({}, [])
    unreadable = _statuses(g, a=StatusRecord(UNREADABLE, 0.0, error="x"), b=_done(2.0, a=1.0))
    assert rerun_inputs(g, g.nodes, unreadable) == ({}, [])
    old = _statuses(g, a=_done(5.0), b=_done(2.0), c=_done(3.0))  # markers of an earlier version
    assert rerun_inputs(g, g.nodes, old) == ({}, [])


def test_a_summary_digest_is_believed_when_it_matches_and_asks_for_the_marker_otherwise() -> None:
    g = _chain()
    summary_b = StatusRecord(SUCCESS, 2.0, inputs_digest=inputs_digest([("a", 1.0)]))
    assert rerun_inputs(g, g.nodes, _statuses(g, a=_done(1.0), b=summary_b)) == ({}, [])
    stale, unsure = rerun_inputs(g, g.nodes, _statuses(g, a=_done(5.0), b=summary_b))
    assert stale == {} and unsure == [g.nodes["b"].output_path]
    # A rerun that began is told without the marker.
    stale, unsure = rerun_inputs(g, g.nodes, _statuses(g, a=StatusRecord(FAILED, 5.0), b=summary_b))
    assert stale == {"b": "dependency a rerun since this step ran"} and unsure == []


def test_only_the_named_steps_are_judged() -> None:
    g = _chain()
    statuses = _statuses(g, a=_done(5.0), b=_done(2.0, a=1.0), c=_done(3.0, b=2.0))
    assert rerun_inputs(g, ["c"], statuses) == ({}, [])
