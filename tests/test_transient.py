"""Transient storage faults: classified, retried with backoff, and survived by a whole run."""

from __future__ import annotations

import errno
import json
import uuid
from pathlib import Path

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from marinbuild.backends.local.backend import LocalBackend
from marinbuild.errors import StorageError
from marinbuild.execution.claims import LeaseClaims
from marinbuild.execution.reporting import NullReporter
from marinbuild.execution.run_context import RunContext
from marinbuild.execution.scheduler import RunOptions, Scheduler
from marinbuild.graph import build_graph
from marinbuild.marinfile import load_marinfile
from marinbuild.project import Project, plan_targets
from marinbuild.store import retry
from marinbuild.store.conditional import conditional_store
from marinbuild.store.fsspec_store import FsspecStorage
from marinbuild.store.lease import LeaseSettings, lease_path
from marinbuild.store.markers import SUCCESS, StatusRecord, info_path, status_path
from marinbuild.store.retry import RetryPolicy, call_with_retries, is_transient
from marinbuild.store.storage import Storage

from .faults import FlakyFileSystem
from .helpers import write_marinfile


class HttpError(Exception):
    """Shaped like gcsfs's: a status code on ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(f"HTTP {code}")
        self.code = code


class ClientOSError(OSError):
    """Named like aiohttp's connection error."""


@pytest.mark.parametrize(
    "error",
    [ConnectionResetError("reset"), TimeoutError("slow"), OSError(errno.EIO, "eio"), OSError(errno.EAGAIN, "again"),
     HttpError(429), HttpError(503), HttpError(500), ClientOSError("connection lost")],
)
def test_transient_errors(error: Exception) -> None:
    assert is_transient(error)


@pytest.mark.parametrize(
    "error",
    [FileNotFoundError("gone"), PermissionError("no"), FileExistsError("there"), ValueError("bad"),
     HttpError(404), HttpError(403), OSError(errno.ENOSPC, "full")],
)
def test_lasting_errors(error: Exception) -> None:
    assert not is_transient(error)


def test_backoff_grows_with_full_jitter_and_a_cap() -> None:
    policy = RetryPolicy(attempts=6, base=0.1, cap=0.5)
    assert [policy.delay(n, rng=lambda: 1.0) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    assert policy.delay(3, rng=lambda: 0.25) == 0.1


def test_retries_until_success_then_gives_up_with_one_line() -> None:
    slept: list[float] = []
    failures = iter([TimeoutError("t1"), ConnectionResetError("t2")])

    def flaky() -> str:
        error = next(failures, None)
        if error is not None:
            raise error
        return "ok"

    assert call_with_retries(flaky, "read x", RetryPolicy(5, 0.1, 1), sleep=slept.append, rng=lambda: 1.0) == "ok"
    assert slept == [0.1, 0.2]

    def down() -> None:
        raise OSError(errno.EIO, "disk went away")

    with pytest.raises(StorageError, match=r"^write gs://b/x failed after 3 attempts: OSError: .*disk went away"):
        call_with_retries(down, "write gs://b/x", RetryPolicy(3, 0.0, 0.0), sleep=lambda s: None)

    calls = []

    def missing() -> None:
        calls.append(1)
        raise FileNotFoundError("nope")

    with pytest.raises(FileNotFoundError):
        call_with_retries(missing, "read y", sleep=lambda s: None)
    assert calls == [1]


@pytest.fixture
def patient(monkeypatch: pytest.MonkeyPatch) -> None:
    """Enough quick attempts that a 10-50% fault rate never exhausts them in a test."""
    monkeypatch.setattr(retry, "DEFAULT_POLICY", RetryPolicy(attempts=15, base=0.001, cap=0.01))


def flaky_storage(rate: float, seed: int = 0) -> tuple[Storage, FlakyFileSystem]:
    flaky = FlakyFileSystem(MemoryFileSystem(), rate=rate, seed=seed)
    return FsspecStorage(f"memory://flaky-{uuid.uuid4().hex[:8]}", flaky), flaky


def test_every_storage_operation_is_retried(patient: None, tmp_path: Path) -> None:
    storage, flaky = flaky_storage(rate=0.5, seed=3)
    paths = [f"{storage.prefix}/d/f{i}" for i in range(20)]
    for i, p in enumerate(paths):
        storage.write_atomic(p, f"text {i}")
    assert storage.read_many([*paths, f"{storage.prefix}/d/missing"]) == {p: f"text {i}" for i, p in enumerate(paths)}
    assert storage.read_text(paths[0]) == "text 0"
    assert sorted(storage.list_names(f"{storage.prefix}/d")) == sorted(f"f{i}" for i in range(20))
    assert storage.exists(paths[1])
    local = tmp_path / "log.txt"
    local.write_text("log")
    storage.put_file(str(local), f"{storage.prefix}/logs/step.log")
    assert storage.read_text(f"{storage.prefix}/logs/step.log") == "log"
    storage.remove(f"{storage.prefix}/d")
    assert not storage.exists(paths[1])
    assert flaky.faults > 10


def test_conditional_writes_survive_lost_answers(patient: None) -> None:
    storage, flaky = flaky_storage(rate=0.2, seed=11)
    store = conditional_store(storage)
    for i in range(30):
        path = f"{storage.prefix}/s{i}/.marinbuild/lease"
        version = store.create(path, f"mine {i}")
        assert version is not None  # even when the write landed and only its answer was lost
        assert store.create(path, "theirs") is None
        newer = store.swap(path, version, f"renewed {i}")
        assert newer is not None
        assert store.read(path).text == f"renewed {i}"  # type: ignore[union-attr]
    assert flaky.faults > 10


STEPS = """
from marinbuild import step, versioned, output_path_of

first = [step(f"a{i}", cmd="true", config={"i": versioned(i)}) for i in range(10)]
second = [step(f"b{i}", cmd="true", config={"x": output_path_of(first[i]), "y": output_path_of(first[(i + 3) % 10])})
          for i in range(10)]
step("all", cmd="true", config={f"in{i}": output_path_of(s) for i, s in enumerate(second)})
"""


def test_a_run_completes_while_ten_percent_of_storage_operations_fail(patient: None, project: Path) -> None:
    marinfile = load_marinfile(str(write_marinfile(project, STEPS)))
    storage, flaky = flaky_storage(rate=0.1, seed=7)
    graph = build_graph(marinfile.steps, storage.prefix)
    proj = Project(marinfile, graph, storage)
    plan = plan_targets(proj, [])
    ctx = RunContext(storage, str(project), marinfile.path, {n: node.output_path for n, node in graph.nodes.items()})
    claims = LeaseClaims(storage, LeaseSettings(heartbeat=0.2, expiry=2, poll=0.05))
    try:
        summary = Scheduler(plan, ctx, LocalBackend(), NullReporter(), RunOptions(poll_interval=0.05),
                            claims=claims).run()
    finally:
        claims.close()
    assert summary.ok and summary.done == 21, summary
    assert flaky.faults > 20
    plain = FsspecStorage(storage.prefix, MemoryFileSystem())
    for node in graph.nodes.values():
        record = StatusRecord.from_json(plain.read_text(status_path(node.output_path)) or "")
        assert record is not None and record.status == SUCCESS
        info = json.loads(plain.read_text(info_path(node.output_path)) or "")
        assert info["name"] == node.name and info["end_time"] >= info["start_time"]
        assert plain.read_text(lease_path(node.output_path)) is None
