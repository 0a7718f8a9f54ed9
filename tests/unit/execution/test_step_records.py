"""Unit tests of marinbuild.execution.step_records: before and after one execution, on a local store."""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import pytest

from marinbuild.backends.base import HELD_EXTRA, Outcome
from marinbuild.errors import LeaseLost, StorageError
from marinbuild.execution.dependency_check import DependencyBusy, DependencyChanged, check_dependencies
from marinbuild.execution.step_records import (
    RunContext,
    clear_output,
    commit,
    prepare,
    record_failure,
    step_environment,
    to_jsonable,
)
from marinbuild.graph import StepGraph, build_graph
from marinbuild.steps import step, this_output_path, versioned
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import (
    FAILED,
    RUNNING,
    SUCCESS,
    StatusRecord,
    info_path,
    read_status,
    status_path,
    write_status,
)
from marinbuild.store.storage import Storage


def _fn(cfg: object) -> None:
    pass


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def _graph(storage: Storage) -> StepGraph:
    a = step("a", _fn, {"n": versioned(1)})
    b = step("b", cmd="echo {a} > {output}/x", config={"a": a, "out": this_output_path()}, env={"MY_VAR": "1"})
    return build_graph([b], storage.prefix)


def _ctx(storage: Storage, graph: StepGraph, tmp_path: Path, **kw: object) -> RunContext:
    return RunContext(
        storage=storage,
        workdir=str(tmp_path),
        marinfile=str(tmp_path / "Marinfile.py"),
        outputs={n: node.output_path for n, node in graph.nodes.items()},
        identities={n: node.identity for n, node in graph.nodes.items()},
        **kw,  # type: ignore[arg-type]
    )


def _succeed(storage: Storage, graph: StepGraph, name: str) -> None:
    node = graph.nodes[name]
    write_status(storage, node.output_path, SUCCESS, name=name, identity=node.identity)


def test_prepare_writes_running_and_builds_the_job(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    _succeed(storage, graph, "a")
    node = graph.nodes["b"]
    job, info = prepare(_ctx(storage, graph, tmp_path), node, {"OMP_NUM_THREADS": "2"})
    a_out = graph.nodes["a"].output_path
    assert job.command == f"echo {a_out} > {node.output_path}/x"
    assert job.env["MARINBUILD_OUTPUT"] == node.output_path
    assert job.env["MY_VAR"] == "1" and job.env["OMP_NUM_THREADS"] == "2"
    assert info["dependencies"] == {"a": a_out}
    assert set(info["dependency_status_times"]) == {"a"}
    assert info["identity"] == node.identity
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == RUNNING and status.identity == node.identity
    assert Path(node.output_path).is_dir()


def test_the_job_and_its_info_take_the_same_resolved_inputs(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    _succeed(storage, graph, "a")
    job, info = prepare(_ctx(storage, graph, tmp_path), graph.nodes["b"], {}, cores=(0,))
    assert info["command"] == job.command and info["command"] is not None
    assert info["config"] == to_jsonable(job.config)
    assert info["held"] == job.extra[HELD_EXTRA]


def test_a_dependency_without_success_is_refused(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    with pytest.raises(DependencyChanged, match="dependency a is no longer done: no status"):
        check_dependencies(_ctx(storage, graph, tmp_path), graph.nodes["b"])
    node = graph.nodes["a"]
    write_status(storage, node.output_path, FAILED, error="boom", name="a", identity=node.identity)
    with pytest.raises(DependencyChanged, match=r"FAILED \(boom\)"):
        check_dependencies(_ctx(storage, graph, tmp_path), graph.nodes["b"])


def test_a_dependency_leased_by_a_live_runner_makes_the_step_wait(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    _succeed(storage, graph, "a")
    a_out = graph.nodes["a"].output_path
    record = LeaseRecord(owner=Owner.current(), acquired=time.time(), renewed=time.time(), expiry=60.0)
    storage.write_atomic(lease_path(a_out), record.to_json())
    with pytest.raises(DependencyBusy, match="dependency a is being redone"):
        check_dependencies(_ctx(storage, graph, tmp_path), graph.nodes["b"])


def test_a_step_without_dependencies_checks_nothing(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    assert check_dependencies(_ctx(storage, graph, tmp_path), graph.nodes["a"]) == {}


def test_commit_writes_info_then_success(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    _succeed(storage, graph, "a")
    ctx = _ctx(storage, graph, tmp_path)
    node = graph.nodes["b"]
    job, info = prepare(ctx, node, {})
    outcome = commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=3.5))
    assert outcome.ok
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == SUCCESS and status.duration == 2.5
    written = json.loads(Path(info_path(node.output_path)).read_text())
    assert written["end_time"] == 3.5 and written["duration"] == 2.5


def test_commit_of_a_failure_records_the_error(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    ctx = _ctx(storage, graph, tmp_path)
    node = graph.nodes["a"]
    job, info = prepare(ctx, node, {})
    outcome = commit(ctx, job, info, Outcome(ok=False, started=1.0, ended=2.0, error="exit 3"))
    assert not outcome.ok
    status = read_status(storage, node.output_path)
    assert status is not None and (status.status, status.error) == (FAILED, "exit 3")


def test_commit_without_the_lease_writes_nothing(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    ctx = _ctx(storage, graph, tmp_path)
    node = graph.nodes["a"]
    job, info = prepare(ctx, node, {})
    with pytest.raises(LeaseLost):
        commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0), still_owner=lambda: False)
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == RUNNING


def test_a_dependency_redone_while_the_step_ran_fails_it(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    _succeed(storage, graph, "a")
    ctx = _ctx(storage, graph, tmp_path)
    job, info = prepare(ctx, graph.nodes["b"], {})
    a = graph.nodes["a"]
    redone = StatusRecord(SUCCESS, time.time() + 100, name="a", identity=a.identity)
    storage.write_atomic(status_path(a.output_path), redone.to_json())
    outcome = commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0))
    assert not outcome.ok
    assert outcome.error is not None and "dependency a changed while this step ran" in outcome.error


def test_a_status_folder_fails_prepare_with_one_line(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    node = graph.nodes["a"]
    (Path(node.output_path) / ".marinbuild" / "status").mkdir(parents=True)
    with pytest.raises(StorageError, match="is a folder, not a status file"):
        prepare(_ctx(storage, graph, tmp_path), node, {})


def test_record_failure_marks_failed(storage: Storage, tmp_path: Path) -> None:
    graph = _graph(storage)
    node = graph.nodes["a"]
    record_failure(_ctx(storage, graph, tmp_path), node, "could not start")
    status = read_status(storage, node.output_path)
    assert status is not None and (status.status, status.error) == (FAILED, "could not start")


def test_clear_output_keeps_only_the_lease(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    for rel in ("data/x", "y", ".marinbuild/status", ".marinbuild/lease", ".marinbuild/info.json"):
        storage.write_atomic(Storage.join(out, rel), "z")
    clear_output(storage, out)
    left = sorted(str(p.relative_to(out)) for p in Path(out).rglob("*"))
    assert left == [".marinbuild", ".marinbuild/lease"]


def test_step_environment_precedence() -> None:
    s = step("s", _fn, {}, env={"A": "step", "MARINBUILD_STEP": "spoof"})
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
