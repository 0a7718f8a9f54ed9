"""Unit tests of marinbuild.execution.attempt_commit: how one attempt's end is recorded, on a local store."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from marinbuild.backends.base import Outcome
from marinbuild.errors import LeaseLost
from marinbuild.execution.attempt_commit import commit, record_failure
from marinbuild.execution.attempt_handover import status_left_to_the_attempt
from marinbuild.execution.attempt_start import prepare
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord, info_path, read_status, status_path
from marinbuild.store.storage import Storage
from tests.unit.execution.two_steps import context, succeed, two_steps


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def test_commit_writes_info_then_success(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    succeed(storage, graph, "a")
    ctx = context(storage, graph, tmp_path)
    node = graph.nodes["b"]
    job, info = prepare(ctx, node, {})
    outcome = commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=3.5))
    assert outcome.ok
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == SUCCESS and status.duration == 2.5
    written = json.loads(Path(info_path(node.output_path)).read_text())
    assert written["end_time"] == 3.5 and written["duration"] == 2.5


def test_commit_of_a_failure_records_the_error(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    ctx = context(storage, graph, tmp_path)
    node = graph.nodes["a"]
    job, info = prepare(ctx, node, {})
    outcome = commit(ctx, job, info, Outcome(ok=False, started=1.0, ended=2.0, error="exit 3"))
    assert not outcome.ok
    status = read_status(storage, node.output_path)
    assert status is not None and (status.status, status.error) == (FAILED, "exit 3")


def test_commit_without_the_lease_writes_nothing(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    ctx = context(storage, graph, tmp_path)
    node = graph.nodes["a"]
    job, info = prepare(ctx, node, {})
    with pytest.raises(LeaseLost):
        commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0), still_owner=lambda: False)
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == RUNNING


def test_a_status_rewritten_since_the_claim_refuses_the_commit_unless_left_to_the_attempt(
        storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    ctx = context(storage, graph, tmp_path)
    node = graph.nodes["a"]
    rewritten = StatusRecord(RUNNING, time.time(), name="a", identity=node.identity, owner="elsewhere:1").to_json()
    # Rewritten by someone else: another runner's claim, and this runner's commit is refused.
    job, info = prepare(ctx, node, {})
    storage.write_atomic(status_path(node.output_path), rewritten)
    with pytest.raises(LeaseLost, match="before its commit"):
        commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0))
    # Rewritten by the attempt where it runs, as a backend that announces its start does: it commits.
    job, info = prepare(ctx, node, {})
    status_left_to_the_attempt(info, job)
    storage.write_atomic(status_path(node.output_path), rewritten)
    assert commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0)).ok
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == SUCCESS


def test_a_dependency_redone_while_the_step_ran_fails_it(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    succeed(storage, graph, "a")
    ctx = context(storage, graph, tmp_path)
    job, info = prepare(ctx, graph.nodes["b"], {})
    a = graph.nodes["a"]
    redone = StatusRecord(SUCCESS, time.time() + 100, name="a", identity=a.identity)
    storage.write_atomic(status_path(a.output_path), redone.to_json())
    outcome = commit(ctx, job, info, Outcome(ok=True, started=1.0, ended=2.0))
    assert not outcome.ok
    assert outcome.error is not None and "dependency a changed while this step ran" in outcome.error


def test_record_failure_marks_failed(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    record_failure(context(storage, graph, tmp_path), node, "could not start")
    status = read_status(storage, node.output_path)
    assert status is not None and (status.status, status.error) == (FAILED, "could not start")
