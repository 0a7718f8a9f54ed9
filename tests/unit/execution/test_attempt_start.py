"""Unit tests of marinbuild.execution.attempt_start: one attempt prepared, on a local store."""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from marinbuild.backends.base import HELD_EXTRA
from marinbuild.execution.attempt_handover import DEPS_EXTRA, STEP_FENCE
from marinbuild.execution.attempt_start import prepare, step_environment, to_jsonable
from marinbuild.execution.dependency_check import DependencyBusy, DependencyChanged, check_dependencies
from marinbuild.steps import step
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import FAILED, RUNNING, info_path, read_status, write_status
from marinbuild.store.storage import Storage
from tests.unit.execution.two_steps import context, noop, succeed, two_steps


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def test_prepare_writes_running_and_builds_the_job(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    succeed(storage, graph, "a")
    node = graph.nodes["b"]
    job, info = prepare(context(storage, graph, tmp_path), node, {"OMP_NUM_THREADS": "2"})
    a_out = graph.nodes["a"].output_path
    assert job.command == f"echo {a_out} > {node.output_path}/x"
    assert job.env["MARINBUILD_OUTPUT"] == node.output_path
    assert job.env["MY_VAR"] == "1" and job.env["OMP_NUM_THREADS"] == "2"
    assert list(job.extra[DEPS_EXTRA]) == ["a"]
    assert info["dependencies"] == {"a": a_out}
    assert set(info["dependency_status_times"]) == {"a"}
    assert info["identity"] == node.identity
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == RUNNING and status.identity == node.identity
    assert Path(node.output_path).is_dir()
    written = json.loads(Path(info_path(node.output_path)).read_text())
    assert written["name"] == "b" and STEP_FENCE not in written, "the info as it starts, without what only the commit needs"


def test_the_job_and_its_info_take_the_same_resolved_inputs(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    succeed(storage, graph, "a")
    job, info = prepare(context(storage, graph, tmp_path), graph.nodes["b"], {}, cores=(0,))
    assert info["command"] == job.command and info["command"] is not None
    assert info["config"] == to_jsonable(job.config)
    assert info["held"] == job.extra[HELD_EXTRA]


def test_a_dependency_without_success_is_refused(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    with pytest.raises(DependencyChanged, match="dependency a is no longer done: no status"):
        check_dependencies(context(storage, graph, tmp_path), graph.nodes["b"])
    node = graph.nodes["a"]
    write_status(storage, node.output_path, FAILED, error="boom", name="a", identity=node.identity)
    with pytest.raises(DependencyChanged, match=r"FAILED \(boom\)"):
        check_dependencies(context(storage, graph, tmp_path), graph.nodes["b"])


def test_a_dependency_leased_by_a_live_runner_makes_the_step_wait(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    succeed(storage, graph, "a")
    a_out = graph.nodes["a"].output_path
    record = LeaseRecord(owner=Owner.current(), acquired=time.time(), renewed=time.time(), expiry=60.0)
    storage.write_atomic(lease_path(a_out), record.to_json())
    with pytest.raises(DependencyBusy, match="dependency a is being redone"):
        check_dependencies(context(storage, graph, tmp_path), graph.nodes["b"])
    with pytest.raises(DependencyBusy):
        prepare(context(storage, graph, tmp_path), graph.nodes["b"], {})
    assert read_status(storage, graph.nodes["b"].output_path) is None, "a step that waits writes nothing"


def test_a_step_without_dependencies_checks_nothing(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    assert check_dependencies(context(storage, graph, tmp_path), graph.nodes["a"]) == {}


def test_step_environment_precedence() -> None:
    s = step("s", noop, {}, env={"A": "step", "MARINBUILD_STEP": "spoof"})
    env = step_environment(s, "/o", {"A": "admission", "B": "admission", "MARINBUILD_X": "runner"})
    assert env["A"] == "step"
    assert env["B"] == "admission"
    assert env["MARINBUILD_X"] == "runner"
    assert (env["MARINBUILD_STEP"], env["MARINBUILD_OUTPUT"], env["MARINBUILD_ATTEMPT"]) == ("s", "/o", "1")


class Color(enum.Enum):
    RED = "red"


class NT(NamedTuple):
    a: int
    b: object


@dataclass
class DC:
    x: object


def test_to_jsonable_renders_every_shape() -> None:
    value = {"p": Path("/x"), "s": {3, 1, 2}, "e": Color.RED, "nt": NT(1, DC([1])), "t": (1, 2), "o": object}
    rendered = to_jsonable(value)
    json.dumps(rendered)
    assert rendered["p"] == "/x"
    assert rendered["s"] == [1, 2, 3]
    assert rendered["e"] == "red"
    assert rendered["nt"] == {"a": 1, "b": {"x": [1]}}
    assert rendered["t"] == [1, 2]
    assert rendered["o"] == repr(object)
