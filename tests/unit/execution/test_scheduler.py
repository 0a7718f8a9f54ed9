"""Unit tests of marinbuild.execution.scheduler: the run loop over an in-process backend.

The backend finishes each job on a thread with the outcome the step's config asks for;
markers are real files under ``tmp_path``. Order is read from the backend's start list.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from marinbuild import step
from marinbuild.backends.base import Grant, Job, Outcome
from marinbuild.execution.reporting import NullReporter, Summary
from marinbuild.execution.run_context import RunContext
from marinbuild.execution.scheduler import RunOptions, Scheduler
from marinbuild.graph import StepGraph, StepNode, build_graph
from marinbuild.planner import make_plan, select
from marinbuild.steps import Step
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, read_status, read_statuses
from marinbuild.store.storage import Storage
from tests.fakes import FunctionBackend, ThreadBackend


def _noop(cfg: Any) -> None:
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


# -- The scheduler in-process: a backend that runs plain functions on threads, real markers on disk.


WAIT = 10.0  # seconds a barrier or event may wait before the test calls it broken


@dataclass
class Recorder:
    """What the step functions did: start and end times, and how many ran at once."""

    times: dict[str, tuple[float, float]] = field(default_factory=dict)
    running: int = 0
    most: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, name: str) -> float:
        with self.lock:
            self.running += 1
            self.most = max(self.most, self.running)
        return time.monotonic()

    def leave(self, name: str, started: float) -> None:
        with self.lock:
            self.running -= 1
            self.times[name] = (started, time.monotonic())

    def before(self, a: str, b: str) -> bool:
        """``a`` ended before ``b`` started."""
        return self.times[a][1] <= self.times[b][0]


def recorded(rec: Recorder, name: str, then: Callable[[], None] | None = None) -> Callable[[Any], None]:
    def fn(config: Any) -> None:
        t = rec.enter(name)
        try:
            if then is not None:
                then()
        finally:
            rec.leave(name, t)

    fn.__qualname__ = f"recorded_{name}"
    return fn


def run(steps: list[Any], tmp_path: Any, backend: FunctionBackend | None = None, **kw: Any) -> tuple[Any, Any, dict]:
    """Plan ``steps`` under ``tmp_path`` and run them; returns (summary, graph, statuses)."""
    admission = kw.pop("admission", None)
    claims = kw.pop("claims", None)
    graph = build_graph(steps, str(tmp_path / "out"))
    plan = make_plan(graph, select(graph, []), statuses={})
    storage = Storage.for_prefix(graph.prefix)
    ctx = RunContext(
        storage=storage,
        workdir=str(tmp_path),
        marinfile="(test)",
        outputs={n: node.output_path for n, node in graph.nodes.items()},
        identities={n: node.identity for n, node in graph.nodes.items()},
    )
    options = RunOptions(poll_interval=0.05, **kw)
    scheduler = Scheduler(plan, ctx, backend or FunctionBackend(), NullReporter(), options,
                          admission=admission, claims=claims)
    summary = scheduler.run()
    outputs = {n: node.output_path for n, node in graph.nodes.items()}
    statuses = read_statuses(storage, list(outputs.values()))
    return summary, graph, {n: statuses.get(out) for n, out in outputs.items()}


def test_dependants_start_after_their_dependencies_end(tmp_path):
    rec = Recorder()
    a = step("s/a", fn=recorded(rec, "a"))
    b = step("s/b", fn=recorded(rec, "b"), config={"a": a})
    c = step("s/c", fn=recorded(rec, "c"), config={"a": a})
    d = step("s/d", fn=recorded(rec, "d"), config={"b": b, "c": c})
    summary, _, statuses = run([d], tmp_path, jobs=4)
    assert summary.ok and summary.done == 4
    assert rec.before("a", "b") and rec.before("a", "c") and rec.before("b", "d") and rec.before("c", "d")
    assert {s.status for s in statuses.values()} == {SUCCESS}


def test_the_jobs_cap_bounds_steps_at_once_and_steps_do_overlap_up_to_it(tmp_path):
    rec = Recorder()
    pair = threading.Barrier(2, timeout=WAIT)  # two at a time must meet, or the step fails
    steps = [step(f"j/{i}", fn=recorded(rec, str(i), pair.wait)) for i in range(6)]
    summary, _, _ = run(steps, tmp_path, jobs=2)
    assert summary.ok, summary.failed
    assert rec.most == 2


def test_jobs_one_runs_steps_one_after_another_in_plan_order(tmp_path):
    rec = Recorder()
    steps = [step(f"o/{i}", fn=recorded(rec, str(i))) for i in range(5)]
    summary, _, _ = run(steps, tmp_path, jobs=1)
    assert summary.ok and rec.most == 1
    assert all(rec.before(str(i), str(i + 1)) for i in range(4))


class Pool:
    """A counting pool of units: the shape admission has, without machines behind it."""

    def __init__(self, units: int, need: dict[str, int]) -> None:
        self.free = units
        self.need = need
        self.lock = threading.Lock()

    def try_acquire(self, node: StepNode) -> Grant | None:
        n = self.need.get(node.name, 1)
        with self.lock:
            if n > self.free:
                return None
            self.free -= n
        return Grant(allocation=n)

    def release(self, grant: Grant, duration: float | None = None) -> None:
        with self.lock:
            self.free += grant.allocation

    def refusal(self, node: StepNode) -> str | None:
        return "needs more units than the pool has" if self.need.get(node.name, 1) > 3 else None


def _starvation_steps(rec: Recorder, first_running: threading.Event, release_first: threading.Event) -> list[Any]:
    def first() -> None:
        first_running.set()
        assert release_first.wait(WAIT)

    small1 = step("st/1-small", fn=recorded(rec, "small1", first))
    big = step("st/2-big", fn=recorded(rec, "big"))
    later = [step(f"st/3-small{i}", fn=recorded(rec, f"small{i}")) for i in range(2, 5)]
    return [small1, big, *later]


def test_a_big_step_that_waited_past_the_limit_is_not_starved_by_smaller_ones(tmp_path):
    rec, running, release = Recorder(), threading.Event(), threading.Event()
    steps = _starvation_steps(rec, running, release)
    pool = Pool(2, {"st/2-big": 2})
    release.set()  # the first small step's units are held until the scheduler hears it ended
    summary, _, _ = run(steps, tmp_path, admission=pool, starvation_limit=0.0, jobs=4)
    assert summary.ok, summary.failed
    # The big step asked first and waited: no later small step went ahead of it.
    assert all(rec.before("big", f"small{i}") for i in range(2, 5))


def test_without_starvation_smaller_ready_steps_go_ahead_of_one_that_does_not_fit(tmp_path):
    rec, running, release = Recorder(), threading.Event(), threading.Event()
    steps = _starvation_steps(rec, running, release)
    pool = Pool(2, {"st/2-big": 2})

    def release_when_small_ones_ran() -> None:
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline and len(rec.times) < 3:
            time.sleep(0.01)
        release.set()

    threading.Thread(target=release_when_small_ones_ran, daemon=True).start()
    summary, _, _ = run(steps, tmp_path, admission=pool, starvation_limit=3600.0, jobs=4)
    assert summary.ok, summary.failed
    assert all(rec.before(f"small{i}", "big") for i in range(2, 5))


def test_a_step_no_pool_can_hold_is_skipped_alone(tmp_path):
    rec = Recorder()
    huge = step("r/huge", fn=recorded(rec, "huge"))
    fine = step("r/fine", fn=recorded(rec, "fine"))
    summary, _, _ = run([huge, fine], tmp_path, admission=Pool(3, {"r/huge": 9}))
    assert "huge" not in rec.times and "fine" in rec.times
    assert summary.not_started == 1


def boom(config: Any) -> None:
    raise ValueError("the step failed on purpose")


def test_a_failure_stops_new_starts_and_its_dependants_never_start(tmp_path):
    rec = Recorder()
    bad = step("k/0-bad", fn=boom)
    after_bad = step("k/1-after", fn=recorded(rec, "after"), config={"bad": bad})
    other = step("k/2-other", fn=recorded(rec, "other"))
    summary, _, statuses = run([bad, after_bad, other], tmp_path, jobs=1)
    assert [f.name for f in summary.failed] == ["k/0-bad"]
    assert "ValueError: the step failed on purpose" in summary.failed[0].error
    assert rec.times == {}  # -j 1 in plan order: nothing starts after the failure
    assert statuses["k/0-bad"].status == FAILED and statuses["k/2-other"] is None


def test_keep_going_runs_everything_that_does_not_depend_on_the_failure(tmp_path):
    rec = Recorder()
    bad = step("k/0-bad", fn=boom)
    after_bad = step("k/1-after", fn=recorded(rec, "after"), config={"bad": bad})
    others = [step(f"k/2-other{i}", fn=recorded(rec, f"other{i}")) for i in range(3)]
    summary, _, statuses = run([bad, after_bad, *others], tmp_path, jobs=1, keep_going=True)
    assert [f.name for f in summary.failed] == ["k/0-bad"]
    assert set(rec.times) == {"other0", "other1", "other2"}
    assert statuses["k/1-after"] is None and summary.not_started == 1


class FlakyClaims:
    """Claims whose holder loses ``name``'s lease once it runs; the next claim finds it done elsewhere."""

    def __init__(self, name: str, running: threading.Event) -> None:
        self.name = name
        self.running = running
        self.lost_names: set[str] = set()
        self.released: list[str] = []
        self.on_lost: Callable[[str, str], None] | None = None

    def try_claim(self, node: StepNode) -> tuple[str, str]:
        if node.name in self.lost_names:
            return "done", "finished by the runner that took it over"
        if node.name == self.name:
            threading.Thread(target=self._lose, daemon=True).start()
        return "go", ""

    def _lose(self) -> None:
        assert self.running.wait(WAIT)
        self.lost_names.add(self.name)
        assert self.on_lost is not None
        self.on_lost(self.name, "another runner took it over")

    def lost(self, node: StepNode) -> bool:
        return node.name in self.lost_names

    def release(self, node: StepNode) -> None:
        self.released.append(node.name)

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        self.on_lost = on_lost


def test_a_step_whose_lease_is_lost_is_cancelled_and_records_nothing(tmp_path):
    running = threading.Event()

    def long_step(config: Any, cancelled: threading.Event) -> None:
        running.set()
        assert cancelled.wait(WAIT), "the scheduler never cancelled the step"

    rec = Recorder()
    lost = step("l/lost", fn=long_step)
    other = step("l/other", fn=recorded(rec, "other"))
    claims = FlakyClaims("l/lost", running)
    summary, _, statuses = run([lost, other], tmp_path, claims=claims, jobs=2)
    assert summary.finished_elsewhere == ["l/lost"] and not summary.failed
    assert statuses["l/lost"].status == RUNNING  # our RUNNING, never our SUCCESS or FAILED
    assert statuses["l/other"].status == SUCCESS
    assert claims.released.count("l/lost") == 1


def test_a_step_whose_launch_raises_fails_alone_and_the_run_goes_on(tmp_path):
    rec = Recorder()
    refused = step("x/0-refused", fn=recorded(rec, "refused"))
    after = step("x/1-after", fn=recorded(rec, "after"), config={"r": refused})
    fine = step("x/2-fine", fn=recorded(rec, "fine"))
    backend = FunctionBackend(refuse=frozenset({"x/0-refused"}))
    summary, _, statuses = run([refused, after, fine], tmp_path, backend=backend, jobs=1, keep_going=True)
    assert [f.name for f in summary.failed] == ["x/0-refused"]
    assert summary.failed[0].error == "could not start: RuntimeError: no worker will take x/0-refused"
    assert statuses["x/0-refused"].status == FAILED
    assert set(rec.times) == {"fine"}
    assert all(s is None or s.status != RUNNING for s in statuses.values())


@dataclass
class HoldsRef:
    ref: Any

    def __copy__(self) -> HoldsRef:
        raise RuntimeError("this config cannot be copied")


def test_a_step_that_cannot_be_prepared_fails_with_its_error_and_the_rest_runs(tmp_path):
    rec = Recorder()
    up = step("p/0-up", fn=recorded(rec, "up"))
    broken = step("p/1-broken", fn=recorded(rec, "broken"), config=HoldsRef(up))
    nul = step("p/2-nul", cmd="echo {v} > {output}/x", config={"v": "a\0b"})
    fine = step("p/3-fine", fn=recorded(rec, "fine"))
    summary, _, statuses = run([up, broken, nul, fine], tmp_path, jobs=1, keep_going=True)
    errors = {f.name: f.error for f in summary.failed}
    assert errors["p/1-broken"] == "RuntimeError: this config cannot be copied"
    assert "p/2-nul" in errors and "NUL byte" in errors["p/2-nul"] and "config field 'v'" in errors["p/2-nul"]
    assert set(rec.times) == {"up", "fine"}
    assert statuses["p/1-broken"].status == FAILED and statuses["p/2-nul"].status == FAILED
    assert all(s is None or s.status != RUNNING for s in statuses.values())


@pytest.mark.parametrize("keep_going", [False, True])
def test_without_keep_going_a_failed_preparation_still_lets_running_steps_finish(tmp_path, keep_going):
    rec, started, release = Recorder(), threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        assert release.wait(WAIT)

    slow_step = step("w/0-slow", fn=recorded(rec, "slow", slow))
    nul = step("w/1-nul", cmd="echo {v}", config={"v": "\0"})
    threading.Thread(target=lambda: started.wait(WAIT) and release.set(), daemon=True).start()
    summary, _, statuses = run([slow_step, nul], tmp_path, jobs=2, keep_going=keep_going)
    assert [f.name for f in summary.failed] == ["w/1-nul"]
    assert statuses["w/0-slow"].status == SUCCESS  # finished and recorded, not left RUNNING
