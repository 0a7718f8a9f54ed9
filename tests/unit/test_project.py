"""Unit tests of marinbuild.project: a Marinfile on disk to statuses and a plan, on a local store."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

from marinbuild.project import open_project, plan_targets, probe, project_of_steps, steps_instead_of_marinfile
from marinbuild.staleness import Action
from marinbuild.steps import step
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import RUNNING, SUCCESS, info_path, info_text, write_status

MARINFILE = """
from marinbuild import step, versioned

a = step("a", cmd="echo {n} > {output}/x", config={"n": versioned(N)})
b = step("b", cmd="cat {a}/x > {output}/y", config={"a": a})
"""


def _marinfile(folder: Path, n: int = 1) -> str:
    path = folder / "Marinfile.py"
    path.write_text(textwrap.dedent(MARINFILE).replace("N", str(n)))
    return str(path)


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    return tmp_path


def test_open_project_loads_and_builds_without_writing(folder: Path) -> None:
    project = open_project(_marinfile(folder), str(folder / "out"))
    assert set(project.graph.nodes) == {"a", "b"}
    assert project.graph.prefix == str(folder / "out")
    assert project.workdir == str(folder)
    assert not (folder / "out").exists()


def test_probe_reads_only_what_exists(folder: Path) -> None:
    project = open_project(_marinfile(folder), str(folder / "out"))
    assert probe(project, ["a", "b"]) == {}
    a = project.graph.nodes["a"]
    write_status(project.storage, a.output_path, SUCCESS, name="a", identity=a.identity)
    found = probe(project, ["a", "b"])
    assert list(found) == [a.output_path] and found[a.output_path].status == SUCCESS


def test_probe_names_the_holder_of_a_running_step(folder: Path) -> None:
    project = open_project(_marinfile(folder), str(folder / "out"))
    a = project.graph.nodes["a"]
    write_status(project.storage, a.output_path, RUNNING, name="a", identity=a.identity)
    record = LeaseRecord(Owner.current(), time.time(), time.time(), expiry=60.0)
    project.storage.write_atomic(lease_path(a.output_path), record.to_json())
    leases: dict = {}
    found = probe(project, ["a"], leases=leases)
    assert found[a.output_path].leased_by == record.describe()
    assert leases[a.output_path] == record


def test_plan_targets_decides_from_the_store(folder: Path) -> None:
    project = open_project(_marinfile(folder), str(folder / "out"))
    plan = plan_targets(project, ["b"])
    assert plan.to_run() == ["a", "b"]
    a = project.graph.nodes["a"]
    write_status(project.storage, a.output_path, SUCCESS, name="a", identity=a.identity)
    plan = plan_targets(project, ["b"])
    assert plan.decisions["a"].action is Action.SKIP
    assert plan_targets(project, ["b"], force=["a"]).decisions["b"].reason == "upstream a forced"


def test_a_changed_versioned_value_is_explained(folder: Path) -> None:
    old = open_project(_marinfile(folder, 1), str(folder / "out"))
    for n in ("a", "b"):
        node = old.graph.nodes[n]
        info = {"name": n, "identity_payload": node.payload}
        old.storage.write_atomic(info_path(node.output_path), info_text(info))
        write_status(old.storage, node.output_path, SUCCESS, name=n, identity=node.identity)
    new = open_project(_marinfile(folder, 2), str(folder / "out"))
    reason = plan_targets(new, ["a"]).decisions["a"].reason
    assert "n" in reason and "1" in reason and "2" in reason


def test_steps_from_a_script_stand_in_for_the_marinfile(folder: Path) -> None:
    s = step("scripted", cmd="true")
    project = project_of_steps([s], str(folder / "out"))
    assert list(project.graph.nodes) == ["scripted"]
    with steps_instead_of_marinfile([s]):
        assert list(open_project("no-such-Marinfile.py", str(folder / "out")).graph.nodes) == ["scripted"]
