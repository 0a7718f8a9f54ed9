"""Unit tests of marinbuild.cli.plan_notes: drift notes, root changes and cost estimates under a plan."""

from __future__ import annotations

from pathlib import Path

from marinbuild.accounting import Estimate, Usage
from marinbuild.cli import plan_notes
from marinbuild.cli.plan_notes import drift_lines, estimate_lines, estimates, format_hours, why_extras
from marinbuild.cli.plan_view import columns_text
from marinbuild.drift import code_record, drift_digest
from marinbuild.execution.session import load
from marinbuild.planner import make_plan
from marinbuild.steps import step, versioned
from marinbuild.store.markers import SUCCESS, info_path, info_text, read_statuses, write_status


def test_durations_and_hours_read_at_a_glance() -> None:
    assert [plan_notes.rough_duration(s) for s in (4.25, 42.4, 725, 10920)] == ["4.2 s", "42 s", "12m05s", "3h02m"]
    assert [format_hours(h) for h in (0, 0.00123, 1.254, 320.4)] == ["0", "0.0012", "1.25", "320"]


def test_estimate_lines() -> None:
    assert estimate_lines({}, columns_text) == []
    assert estimate_lines({"a": None}, columns_text) == [
        "estimates: no history (no step to run has run before under this prefix)"]
    lines = estimate_lines({"a": Estimate(3, 3600.0, Usage(1.0, 2.0, 0.0, 8.0)), "b": None}, columns_text)
    assert lines[0].startswith("estimates from earlier runs")
    assert lines[2].split() == ["a", "1h00m", "8.00", "2.00", "3"]
    assert lines[3].split() == ["b", "no", "history"]
    assert lines[4].split() == ["total", "1h00m", "8.00", "2.00", "1", "without", "history"]


def test_drift_lines_note_what_changed_outside_the_identity(tmp_path: Path) -> None:
    old = step("s", cmd="echo {x}", config={"x": 1})
    project = load(steps=[step("s", cmd="echo {x}", config={"x": 2})], prefix=str(tmp_path))
    node = project.graph.nodes["s"]
    project.storage.write_atomic(info_path(node.output_path), info_text(code_record(old)))
    write_status(project.storage, node.output_path, SUCCESS, name="s", identity=node.identity,
                 drift=drift_digest(code_record(old)))
    statuses = read_statuses(project.storage, [node.output_path])
    plan = make_plan(project.graph, ["s"], statuses)
    assert drift_lines(project, plan) == [
        "s: note: plain field x changed since the stored run (1 -> 2); not part of the identity: --force it or make it versioned"]


def test_why_extras(tmp_path: Path) -> None:
    old = load(steps=[step("b", cmd="true", config={"a": step("a", cmd="true", config={"n": versioned(1)})})],
               prefix=str(tmp_path))
    for node in old.graph.nodes.values():
        old.storage.write_atomic(info_path(node.output_path), info_text({"identity_payload": node.payload}))
    new = load(steps=[step("b", cmd="true", config={"a": step("a", cmd="true", config={"n": versioned(2)})})],
               prefix=str(tmp_path))
    info = {"identity_payload": old.graph.nodes["b"].payload}
    assert why_extras(new, "b", info, own=False) == ["root change upstream: a: n 1 -> 2"]
    assert why_extras(new, "b", None, own=False) == []
    assert why_extras(new, "b", {**code_record(new.graph.nodes["b"].step)}, own=True) == []


def test_estimates_of_steps_never_run_are_none(tmp_path: Path) -> None:
    project = load(steps=[step("s", cmd="true")], prefix=str(tmp_path))
    assert estimates(project, make_plan(project.graph, ["s"], {})) == {"s": None}
