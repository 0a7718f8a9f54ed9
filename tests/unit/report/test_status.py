"""Unit tests of marinbuild.report.status: the rows of ``status`` from the markers under a prefix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from marinbuild.project import project_of_steps
from marinbuild.report.status import StepStatus, status_rows
from marinbuild.steps import step, versioned
from marinbuild.store.markers import FAILED, SUCCESS, status_path, write_status
from marinbuild.store.storage import Storage


def _steps() -> list:
    a = step("s/a", cmd="true", config={"n": versioned(1)})
    b = step("s/b", cmd="true", config={"a": a})
    return [a, b]


def test_each_step_has_a_row_in_graph_order_with_what_its_marker_says(tmp_path: Path) -> None:
    project = project_of_steps(_steps(), str(tmp_path))
    a, b = (project.graph.nodes[n] for n in ("s/a", "s/b"))
    write_status(project.storage, a.output_path, SUCCESS, name="s/a", identity=a.identity, duration=1.5)
    write_status(project.storage, b.output_path, FAILED, name="s/b", identity=b.identity, error="exit 3")
    report = status_rows(project)
    assert [r.name for r in report.rows] == ["s/a", "s/b"] and report.prefix == str(tmp_path)
    first, second = report.rows
    assert (first.status, first.duration, first.error, first.time is not None) == ("SUCCESS", 1.5, None, True)
    assert (second.status, second.error) == ("FAILED", "exit 3")
    assert second.lease is None and second.progress is None and second.slurm is None and second.provisioning is None
    assert report.warnings == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.status = "NONE"  # type: ignore[misc]


def test_a_target_brings_the_steps_it_needs_and_no_others(tmp_path: Path) -> None:
    project = project_of_steps(_steps(), str(tmp_path))
    assert [r.name for r in status_rows(project, ["s/a"]).rows] == ["s/a"]
    assert [r.name for r in status_rows(project, ["s/b"]).rows] == ["s/a", "s/b"]
    assert {r.status for r in status_rows(project, ["s/*"]).rows} == {"NONE"}


def test_an_output_path_holding_another_steps_outputs_is_none_and_says_so(tmp_path: Path) -> None:
    project = project_of_steps(_steps(), str(tmp_path))
    a = project.graph.nodes["s/a"]
    write_status(project.storage, a.output_path, SUCCESS, name="other", identity="0" * 16, duration=2.0)
    (row, _) = status_rows(project).rows
    assert row.status == "NONE" and row.duration is None and row.retries is None
    assert row.error is not None and row.error.startswith("its output path holds the ")


def test_an_unreadable_marker_is_a_warning_never_an_error(tmp_path: Path) -> None:
    project = project_of_steps(_steps(), str(tmp_path))
    a = project.graph.nodes["s/a"]
    Storage.for_prefix(str(tmp_path)).write_atomic(status_path(a.output_path), "{not json")
    report = status_rows(project)
    assert len(report.warnings) == 1 and report.warnings[0].endswith("(treated as unknown: the step will run)")


def test_to_json_is_the_row_key_for_key() -> None:
    row = StepStatus("n", "NONE", "/p/n-0", None, None, None, None, None, None, None, None, None)
    assert list(row.to_json()) == ["name", "status", "output_path", "duration", "time", "error", "lease", "retries",
                                   "progress", "provisioning", "slurm", "outside_writes"]
