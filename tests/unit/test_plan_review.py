"""Unit tests of marinbuild.plan_review: a reviewed plan file, read back and compared with a new plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.errors import UserError
from marinbuild.graph import StepGraph, build_graph
from marinbuild.plan_review import (
    FORMAT,
    differences,
    finished_meanwhile,
    plan_document,
    read_plan_file,
    write_plan_file,
)
from marinbuild.planner import make_plan
from marinbuild.steps import step, versioned
from marinbuild.store.markers import SUCCESS, StatusRecord


def _graph(n: int = 1) -> StepGraph:
    a = step("a", cmd="true", config={"n": versioned(n)})
    return build_graph([step("b", cmd="true", config={"a": a})], "/p")


def _written(tmp_path: Path, graph: StepGraph, statuses: dict | None = None) -> Path:
    plan = make_plan(graph, ["b"], statuses or {})
    path = tmp_path / "plan.json"
    write_plan_file(str(path), plan_document(plan, "/p", force=["a"], marinfile="/m/Marinfile.py"))
    return path


def test_document_round_trips(tmp_path: Path) -> None:
    graph = _graph()
    path = _written(tmp_path, graph)
    doc = json.loads(path.read_text())
    assert doc["format"] == FORMAT and doc["marinfile"] == "/m/Marinfile.py"
    assert [s["name"] for s in doc["steps"]] == ["a", "b"]
    reviewed = read_plan_file(str(path))
    assert reviewed.targets == ("b",) and reviewed.force == ("a",) and not reviewed.force_all
    assert reviewed.prefix == "/p"
    assert reviewed.steps["a"]["identity"] == graph.nodes["a"].identity
    assert [p.name for p in tmp_path.iterdir()] == ["plan.json"]  # no temporary left


def test_the_same_plan_has_no_differences(tmp_path: Path) -> None:
    graph = _graph()
    reviewed = read_plan_file(str(_written(tmp_path, graph)))
    assert differences(reviewed, make_plan(graph, ["b"], {}), graph) == []


def test_a_changed_identity_is_a_difference_naming_the_field(tmp_path: Path) -> None:
    reviewed = read_plan_file(str(_written(tmp_path, _graph(1))))
    graph = _graph(2)
    found = differences(reviewed, make_plan(graph, ["b"], {}), graph)
    assert any(line.startswith("a: identity ") and "n: 1 -> 2" in line for line in found)


def test_a_step_that_would_run_but_was_listed_up_to_date(tmp_path: Path) -> None:
    graph = _graph()
    a = graph.nodes["a"]
    done = {a.output_path: StatusRecord(SUCCESS, 1.0, identity=a.identity)}
    reviewed = read_plan_file(str(_written(tmp_path, graph, done)))
    found = differences(reviewed, make_plan(graph, ["b"], {}), graph)
    assert found == ["a: would run (new), but the plan listed it as up to date"]


def test_steps_finished_meanwhile_are_skipped_not_refused(tmp_path: Path) -> None:
    graph = _graph()
    reviewed = read_plan_file(str(_written(tmp_path, graph)))
    a = graph.nodes["a"]
    now = make_plan(graph, ["b"], {a.output_path: StatusRecord(SUCCESS, 1.0, identity=a.identity)})
    assert finished_meanwhile(reviewed, now) == ["a"]
    assert differences(reviewed, now, graph) == []


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("not json", "is not a plan file"),
        ('{"format": "other", "steps": []}', "is not a plan written by"),
        ('{"format": "marinbuild-plan/1", "steps": [{"name": "a"}]}', "lacks its name, identity or action"),
        ('{"format": "marinbuild-plan/1", "steps": [{"name": "a", "identity": "x", "action": "run"}]}',
         "has no identity payload"),
        ('{"format": "marinbuild-plan/1", "steps": [{"name": "a", "identity": "x", "action": "run", "payload": {}}]}',
         "the file was edited"),
        ('{"format": "marinbuild-plan/1", "steps": [], "targets": [1]}', "targets and force must be lists"),
    ],
)
def test_anything_else_is_one_clear_error(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "plan.json"
    path.write_text(content)
    with pytest.raises(UserError, match=problem):
        read_plan_file(str(path))


def test_a_missing_file_and_an_unwritable_folder(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no plan file"):
        read_plan_file(str(tmp_path / "absent.json"))
    with pytest.raises(UserError, match="cannot write the plan"):
        write_plan_file(str(tmp_path / "no" / "such" / "plan.json"), {"format": FORMAT})
