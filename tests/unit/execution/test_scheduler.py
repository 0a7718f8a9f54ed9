"""Unit tests of marinbuild.execution.scheduler: the run loop over an in-process backend.

The backend finishes each job on a thread with the outcome the step's config asks for;
markers are real files under ``tmp_path``. Order is read from the backend's start list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from marinbuild.backends.base import Grant, Job, Outcome
from marinbuild.execution.reporting import NullReporter, Summary
from marinbuild.execution.scheduler import RunOptions, Scheduler
from marinbuild.execution.step_records import RunContext
from marinbuild.graph import StepGraph, StepNode, build_graph
from marinbuild.planner import make_plan
from marinbuild.steps import Step, step
from marinbuild.store.markers import FAILED, SUCCESS, read_status


def _noop(cfg: Any) -> None:
    pass


class ThreadBackend:
    """Ends every job at once: failed when its config says ``{"fail": True}``."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.lock = threading.Lock()
        self.most = 0
        self.now = 0

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        with self.lock:
            self.started.append(job.name)
            self.now += 1
            self.most = max(self.most, self.now)

        def body() -> None:
            t = time.time()
            time.sleep(0.01)  # long enough for a second start to overlap if the gates allow it
            with self.lock:
                self.now -= 1
            fail = isinstance(job.config, dict) and job.config.get("fail")
            on_done(Outcome(not fail, t, time.time(), error="failed on purpose" if fail else None))

        threading.Thread(target=body, daemon=True).start()
        return self

    def cancel(self, reason: str) -> None:
        pass


def _run(steps: list[Step], tmp_path: Path, backend: ThreadBackend, **kw: Any) -> tuple[Summary, StepGraph]:
    admission, claims = kw.pop("admission", None), kw.pop("claims", None)
    graph = build_graph(steps, str(tmp_path / "out"))
    plan = make_plan(graph, graph.declared, statuses={})
    from marinbuild.store.storage import Storage

    ctx = RunContext(storage=Storage.for_prefix(graph.prefix), workdir=str(tmp_path), marinfile="(test)",
                     outputs={n: node.output_path for n, node in graph.nodes.items()},
                     identities={n: node.identity for n, node in graph.nodes.items()})
    scheduler = Scheduler(plan, ctx, backend, NullReporter(), RunOptions(poll_interval=0.01, **kw),
                          admission=admission, claims=claims)
    return scheduler.run(), graph


def _status(graph: StepGraph, name: str) -> str | None:
    from marinbuild.store.storage import Storage

    record = read_status(Storage.for_prefix(graph.prefix), graph.nodes[name].output_path)
    return record.status if record is not None else None


def test_dependencies_start_first_and_every_step_is_recorded(tmp_path: Path) -> None:
    a = step("a", _noop, {})
    b = step("b", _noop, {"a": a})
    c = step("c", _noop, {"a": a})
    d = step("d", _noop, {"b": b, "c": c})
    backend = ThreadBackend()
    summary, graph = _run([d], tmp_path, backend, jobs=4)
    assert summary.ok and summary.done == 4 and summary.total == 4
    assert backend.started[0] == "a" and backend.started[-1] == "d"
    assert {_status(graph, n) for n in "abcd"} == {SUCCESS}


def test_jobs_caps_steps_running_at_once(tmp_path: Path) -> None:
    backend = ThreadBackend()
    summary, _ = _run([step(f"s{i}", _noop, {"i": i}) for i in range(6)], tmp_path, backend, jobs=2)
    assert summary.ok and backend.most <= 2 and len(backend.started) == 6


def test_a_failure_stops_its_dependants_and_new_starts(tmp_path: Path) -> None:
    bad = step("bad", _noop, {"fail": True})
    after = step("after", _noop, {"bad": bad})
    backend = ThreadBackend()
    summary, graph = _run([after], tmp_path, backend)
    assert not summary.ok
    assert [f.name for f in summary.failed] == ["bad"] and summary.not_started == 1
    assert "after" not in backend.started
    assert _status(graph, "bad") == FAILED and _status(graph, "after") is None


def test_keep_going_runs_what_does_not_depend_on_the_failure(tmp_path: Path) -> None:
    bad = step("bad", _noop, {"fail": True})
    other = step("other", _noop, {"x": 1})
    backend = ThreadBackend()
    summary, _ = _run([bad, step("after", _noop, {"bad": bad}), other], tmp_path, backend, keep_going=True, jobs=1)
    assert "other" in backend.started and "after" not in backend.started
    assert summary.done == 1 and len(summary.failed) == 1


class OneGrant:
    """Admission that lets one step run at a time, and refuses the step named ``never``."""

    def __init__(self) -> None:
        self.busy = False

    def try_acquire(self, node: StepNode) -> Grant | None:
        if self.busy:
            return None
        self.busy = True
        return Grant()

    def release(self, grant: Grant, duration: float | None = None) -> None:
        self.busy = False

    def refusal(self, node: StepNode) -> str | None:
        return "not today" if node.name == "never" else None


def test_admission_gates_starts_and_a_refused_step_is_not_started(tmp_path: Path) -> None:
    backend = ThreadBackend()
    steps = [step("a", _noop, {}), step("b", _noop, {}), step("never", _noop, {})]
    summary, graph = _run(steps, tmp_path, backend, keep_going=True, admission=OneGrant())
    assert backend.most == 1 and sorted(backend.started) == ["a", "b"]
    assert summary.failed == [] and summary.done == 2 and summary.not_started == 1 and not summary.ok
    assert _status(graph, "never") is None


class Claims:
    """``done`` for steps named ``elsewhere``, ``wait`` twice then ``go`` for ``later``."""

    def __init__(self) -> None:
        self.asked: dict[str, int] = {}
        self.released: list[str] = []

    def try_claim(self, node: StepNode) -> tuple[str, str]:
        self.asked[node.name] = self.asked.get(node.name, 0) + 1
        if node.name == "elsewhere":
            return "done", "finished by another runner meanwhile"
        if node.name == "later" and self.asked[node.name] <= 2:
            return "wait", "leased by another runner"
        return "go", ""

    def lost(self, node: StepNode) -> bool:
        return False

    def release(self, node: StepNode) -> None:
        self.released.append(node.name)

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        pass


def test_claims_wait_and_done(tmp_path: Path) -> None:
    backend = ThreadBackend()
    claims = Claims()
    summary, _ = _run([step("elsewhere", _noop, {}), step("later", _noop, {})], tmp_path, backend, claims=claims)
    assert summary.ok and summary.done == 2 and summary.finished_elsewhere == ["elsewhere"]
    assert backend.started == ["later"] and claims.asked["later"] == 3
    assert "later" in claims.released


def test_a_backend_that_cannot_start_a_step_fails_that_step_alone(tmp_path: Path) -> None:
    class Refusing(ThreadBackend):
        def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
            if job.name == "refused":
                raise RuntimeError("no worker will take it")
            return super().start(job, on_done)

    backend = Refusing()
    summary, graph = _run([step("refused", _noop, {}), step("fine", _noop, {})], tmp_path, backend, keep_going=True)
    assert [f.name for f in summary.failed] == ["refused"] and "no worker will take it" in summary.failed[0].error
    assert _status(graph, "refused") == FAILED and _status(graph, "fine") == SUCCESS


class _Events(NullReporter):
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []

    def step_started(self, name: str, output: str) -> None:
        self.seen.append(("started", name))

    def step_finished(self, name: str, duration: float, capacity_wait: float = 0.0) -> None:
        self.seen.append(("finished", name))

    def step_failed(self, name: str, error: str, log: str) -> None:
        self.seen.append(("failed", f"{name}: {error}"))


class _AtOnceBackend:
    """Ends a job inside ``start`` itself (before it returns); refuses a job named ``bad``."""

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        if job.name == "bad":
            raise OSError("cannot spawn")
        on_done(Outcome(True, time.time(), time.time()))
        return self

    def cancel(self, reason: str) -> None:
        pass


def test_a_step_that_ends_inside_start_is_reported_started_before_finished(tmp_path: Path) -> None:
    a = step("a", fn=_noop)
    b = step("b", fn=_noop, config={"dep": a})
    bad = step("bad", fn=_noop)
    graph = build_graph([b, bad], str(tmp_path / "out"))
    plan = make_plan(graph, graph.declared, statuses={})
    from marinbuild.store.storage import Storage

    ctx = RunContext(storage=Storage.for_prefix(graph.prefix), workdir=str(tmp_path), marinfile="(test)",
                     outputs={n: node.output_path for n, node in graph.nodes.items()},
                     identities={n: node.identity for n, node in graph.nodes.items()})
    reporter = _Events()
    summary = Scheduler(plan, ctx, _AtOnceBackend(), reporter,  # type: ignore[arg-type]
                        RunOptions(jobs=1, keep_going=True)).run()
    assert summary.done == 2 and [f.name for f in summary.failed] == ["bad"]
    for name in ("a", "b"):
        assert reporter.seen.index(("started", name)) < reporter.seen.index(("finished", name))
    assert ("failed", "bad: could not start: OSError: cannot spawn") in reporter.seen
    assert ("started", "bad") not in reporter.seen
    assert _status(graph, "b") == SUCCESS and _status(graph, "bad") == FAILED


class _HeldBackend:
    """Starts every job and ends it only when cancelled (as FAILED), telling ``started``."""

    def __init__(self, started: threading.Event) -> None:
        self.started = started
        self.cancelled: list[str] = []

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        backend, t = self, time.time()

        class Handle:
            def cancel(self, reason: str) -> None:
                backend.cancelled.append(f"{job.name}: {reason}")
                on_done(Outcome(False, t, time.time(), error=reason))

        self.started.set()
        return Handle()


def test_stop_with_from_another_thread_stops_the_running_steps_then_raises(tmp_path: Path) -> None:
    a = step("a", fn=_noop)
    b = step("b", fn=_noop, config={"dep": a})
    graph = build_graph([b], str(tmp_path / "out"))
    plan = make_plan(graph, graph.declared, statuses={})
    from marinbuild.store.storage import Storage

    ctx = RunContext(storage=Storage.for_prefix(graph.prefix), workdir=str(tmp_path), marinfile="(test)",
                     outputs={n: node.output_path for n, node in graph.nodes.items()},
                     identities={n: node.identity for n, node in graph.nodes.items()})
    started = threading.Event()
    backend = _HeldBackend(started)
    scheduler = Scheduler(plan, ctx, backend, NullReporter(), RunOptions(jobs=1))  # type: ignore[arg-type]
    stopper = threading.Thread(target=lambda: started.wait(30) and scheduler.stop_with(BrokenPipeError("gone")))
    stopper.start()
    with pytest.raises(BrokenPipeError, match="gone"):
        scheduler.run()
    stopper.join()
    assert len(backend.cancelled) == 1 and backend.cancelled[0].startswith("a: ")
    assert _status(graph, "a") == FAILED and _status(graph, "b") is None
