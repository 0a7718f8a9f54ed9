"""The run loop: start ready steps as capacity allows, record how each one ends.

The loop is driven by completion events, never by sleeping: backends report outcomes on a
queue, and each event frees capacity and may make dependants ready. Three gates decide
whether a ready step starts now:

* the ``-j`` cap on steps running at once;
* :class:`Admission`, the resource pools (a step whose request does not fit now waits
  while smaller ready steps go ahead; once it has waited ``starvation_limit`` seconds,
  nothing further is started ahead of it until it fits, so it is not starved);
* :class:`Claims`, the leases (a step leased by another runner waits without holding up
  the rest, and is re-checked every ``poll_interval`` seconds). A step whose lease is lost
  while it runs is cancelled, nothing of it is recorded, and it waits again.

A failed step stops new starts unless ``keep_going``; its dependants never start. Any
exception while preparing, launching or recording one step fails that step with its error
(its marker says ``FAILED``, its resources and claim are given back); the run goes on.

Readiness comes from the plan's networkx graph: a step is ready once every dependency
that runs in this plan has succeeded.
"""

from __future__ import annotations

import heapq
import queue
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from marinbuild.backends.base import Backend, Grant, Job, Outcome, Running
from marinbuild.errors import LeaseLost, MarinbuildError
from marinbuild.execution.admission import JOBS_WAIT, LEASE_WAIT
from marinbuild.execution.reporting import Failure, Reporter, Summary
from marinbuild.execution.step_records import DependencyBusy, RunContext, commit, prepare, record_failure
from marinbuild.graph import Node
from marinbuild.planner import Plan

__all__ = ["Admission", "Claims", "Grant", "RunOptions", "Scheduler"]


class Admission(Protocol):
    def try_acquire(self, node: Node) -> Grant | None:
        """Reserve the step's resources all at once, or nothing (None)."""

    def release(self, grant: Grant, duration: float | None = None) -> None:
        """Give back what :meth:`try_acquire` reserved; ``duration`` of a successful run."""

    def refusal(self, node: Node) -> str | None:
        """Why the step must not start at all in this run, or None."""


class Claims(Protocol):
    def try_claim(self, node: Node) -> tuple[str, str]:
        """``("go", "")`` to run, ``("done", why)`` when finished elsewhere, ``("wait", why)``."""

    def lost(self, node: Node) -> bool:
        """True when this runner no longer holds the step's claim (never commit SUCCESS then)."""

    def release(self, node: Node) -> None:
        """Give up the claim after the step's outcome is recorded."""

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        """Call ``on_lost(step_name, reason)`` from any thread when a held claim is lost."""


@dataclass(frozen=True)
class _ClaimLost:
    """Event: the claim of a running step was lost; the step must be cancelled."""

    reason: str


class _Unlimited:
    def try_acquire(self, node: Node) -> Grant | None:
        return Grant()

    def release(self, grant: Grant, duration: float | None = None) -> None:
        pass

    def refusal(self, node: Node) -> str | None:
        return None


class _NoClaims:
    def try_claim(self, node: Node) -> tuple[str, str]:
        return "go", ""

    def lost(self, node: Node) -> bool:
        return False

    def release(self, node: Node) -> None:
        pass

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        pass


@dataclass(frozen=True)
class RunOptions:
    jobs: int | None = None
    keep_going: bool = False
    starvation_limit: float = 60.0
    poll_interval: float = 5.0


@dataclass
class _Active:
    node: Node
    job: Job
    info: dict[str, Any]
    grant: Grant
    handle: Running


class Scheduler:
    """Runs the steps of a plan that need running, through a backend."""

    def __init__(
        self,
        plan: Plan,
        ctx: RunContext,
        backend: Backend,
        reporter: Reporter,
        options: RunOptions = RunOptions(),
        admission: Admission | None = None,
        claims: Claims | None = None,
        backend_for: Callable[[Node], Backend] | None = None,
    ) -> None:
        self.plan = plan
        self.ctx = ctx
        self.backend_for = backend_for or (lambda node: backend)
        self.reporter = reporter
        self.options = options
        self.admission = admission or _Unlimited()
        self.claims = claims or _NoClaims()
        self.events: queue.Queue[tuple[str, Outcome | _ClaimLost]] = queue.Queue()
        self.claims.watch(lambda name, why: self.events.put((name, _ClaimLost(why))))
        self.running: dict[str, _Active] = {}
        self.summary = Summary()

        to_run = plan.to_run()
        self._index = {n: i for i, n in enumerate(plan.order)}
        members = set(to_run)
        self._pending: dict[str, int] = {}
        self._dependants: dict[str, list[str]] = {}
        if to_run:  # a run with nothing to do does not import networkx
            graph = plan.graph
            self._pending = {n: sum(1 for d in graph.predecessors(n) if d in members) for n in to_run}
            self._dependants = {n: [c for c in graph.successors(n) if c in members] for n in to_run}
        self._ready: list[tuple[int, str]] = [(self._index[n], n) for n in to_run if self._pending[n] == 0]
        heapq.heapify(self._ready)
        self._waiting: dict[str, float] = {}  # leased elsewhere: name -> next check time
        self._told_waiting: dict[str, str] = {}  # the last reason reported, so a poll says nothing new
        self._blocked_since: dict[str, float] = {}
        self._waiting_for: dict[str, str] = {}  # leased elsewhere, or a dependency redone elsewhere
        self._told_counts: dict[str, int] = {}
        self._stopping = False
        self.summary.total = len(to_run)
        self.summary.skipped = len(plan.order) - len(to_run)

    def run(self) -> Summary:
        """Run until every step is done, failed, or cannot start; Ctrl-C stops it cleanly."""
        self.reporter.run_started(self.summary.total, self.summary.skipped)
        try:
            self._loop()
        except KeyboardInterrupt:
            self._interrupt()
        self.summary.not_started = (
            self.summary.total - self.summary.done - len(self.summary.failed)
        )
        self.reporter.run_finished(self.summary)
        return self.summary

    def _loop(self) -> None:
        while True:
            if not self._stopping:
                self._start_ready()
            if not self.running and not (self._waiting and not self._stopping):
                self._give_up_on_blocked()
                return
            try:
                name, event = self.events.get(timeout=self._next_wakeup())
            except queue.Empty:
                continue
            self._handle(name, event)

    def _handle(self, name: str, event: Outcome | _ClaimLost) -> None:
        if isinstance(event, Outcome):
            self._finish(name, event)
        elif name in self.running:
            self.reporter.step_waiting(name, f"lease lost: {event.reason}; stopping it")
            self.running[name].handle.cancel(f"lease lost: {event.reason}")

    def _give_up_on_blocked(self) -> None:
        # Nothing runs and nothing waits: whatever is still ready can never be admitted.
        while self._ready and not self._stopping:
            _, name = heapq.heappop(self._ready)
            reason = "not started: its resources never became free"
            self.reporter.step_skipped(name, reason)

    def _next_wakeup(self) -> float | None:
        if not self._waiting and not self._blocked_since:
            return None
        if self._waiting:
            return max(0.05, min(self._waiting.values()) - time.monotonic())
        return self.options.poll_interval

    def _start_ready(self) -> None:
        now = time.monotonic()
        for name, due in list(self._waiting.items()):
            if due <= now:
                del self._waiting[name]
                heapq.heappush(self._ready, (self._index[name], name))
        deferred: list[tuple[int, str]] = []
        short_of: Counter[str] = Counter()
        capped = False
        misses = 0
        while self._ready and misses < 64:
            if self.options.jobs is not None and len(self.running) >= self.options.jobs:
                capped = True
                break
            item = heapq.heappop(self._ready)
            name = item[1]
            node = self.plan.node(name)
            refusal = self.admission.refusal(node)
            if refusal is not None:
                self.reporter.step_skipped(name, refusal)
                continue
            # Resources first: they are counted in memory, while a claim reads and writes
            # the store, and a claim taken for a step that cannot start would be let go at once.
            grant = self.admission.try_acquire(node)
            if grant is None:
                deferred.append(item)
                short_of[self._waits_on(node)] += 1
                misses += 1
                since = self._blocked_since.setdefault(name, now)
                if now - since >= self.options.starvation_limit:
                    break  # reserve: nothing later starts ahead of a step that waited this long
                continue
            self._blocked_since.pop(name, None)
            try:
                verdict, why = self.claims.try_claim(node)
            except (MarinbuildError, OSError) as e:
                # The store refused even the lease (full, read-only): this step fails, the run goes on.
                self.admission.release(grant)
                self.claims.release(node)
                where = e.filename if isinstance(e, OSError) and e.filename else node.output_path
                problem = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                self._failed(name, f"cannot take its lease ({where}): {problem}", "")
                continue
            if verdict == "done":
                self.admission.release(grant)
                self.summary.finished_elsewhere.append(name)
                self.reporter.step_skipped(name, why)
                self._succeeded(name)
                continue
            if verdict == "wait":
                self.admission.release(grant)
                if self._told_waiting.get(name) != why:
                    self._told_waiting[name] = why
                    self.reporter.step_waiting(name, why)
                self._waiting[name] = now + self.options.poll_interval
                self._waiting_for[name] = LEASE_WAIT
                continue
            self._launch(node, grant)
        if self._ready:
            # Not looked at in this pass: behind the -j limit, or behind the steps deferred.
            short_of[JOBS_WAIT if capped else next(iter(short_of), JOBS_WAIT)] += len(self._ready)
        for item in deferred:
            heapq.heappush(self._ready, item)
        self._tell_waiting(short_of)

    def _waits_on(self, node: Node) -> str:
        waits_on = getattr(self.admission, "waits_on", None)
        return (waits_on(node) if waits_on is not None else "") or "resources"

    def _tell_waiting(self, short_of: Counter[str]) -> None:
        """Tell the reporter how many ready steps wait, and on what, when that changed."""
        for name in self._waiting:
            short_of[self._waiting_for.get(name, LEASE_WAIT)] += 1
        counts = dict(short_of)
        if counts != self._told_counts:
            self._told_counts = counts
            tell = getattr(self.reporter, "steps_waiting", None)
            if tell is not None:
                tell(counts)

    def _launch(self, node: Node, grant: Grant) -> None:
        try:
            job, info = prepare(self.ctx, node, dict(grant.env), grant.cores, grant.timeout)
        except DependencyBusy as e:
            # A dependency is being redone elsewhere: wait for it as for a step leased elsewhere.
            self.admission.release(grant)
            self.claims.release(node)
            if self._told_waiting.get(node.name) != str(e):
                self._told_waiting[node.name] = str(e)
                self.reporter.step_waiting(node.name, str(e))
            self._waiting[node.name] = time.monotonic() + self.options.poll_interval
            self._waiting_for[node.name] = "a dependency redone elsewhere"
            return
        except Exception as e:
            # A step that cannot be prepared (an input too big to mirror, a value no command
            # can hold, a bug) fails alone; the run goes on with the others.
            self._not_started(node, grant, _describe(e))
            return
        name = node.name
        starting = getattr(self.reporter, "step_starting", None)
        if starting is not None:
            starting(name, job.log_file)  # before it can print: what it prints is followed from here
        if job.command is not None:
            command_shown = getattr(self.reporter, "step_command", None)
            if command_shown is not None:
                command_shown(name, job.command)  # `run -p`: the resolved command, as it starts
        try:
            backend = self.backend_for(node)
            handle = backend.start(job, lambda outcome: self.events.put((name, outcome)))
        except Exception as e:
            self._not_started(node, grant, f"could not start: {_describe(e)}")
            return
        # Registered before anything else can run: a Ctrl-C while the start is being reported
        # (the first line printed imports the terminal library) must still cancel the step.
        self.running[name] = _Active(node, job, info, grant, handle)
        self.reporter.step_started(name, node.output_path)

    def _not_started(self, node: Node, grant: Grant, error: str) -> None:
        """A step that failed before it started: its marker says FAILED, its grant and claim go back."""
        self.admission.release(grant)
        try:
            record_failure(self.ctx, node, error)
        except Exception as e:  # the store refused even that: the run still goes on
            error = f"{error} (and its FAILED status could not be written: {_describe(e)})"
        finally:
            self.claims.release(node)
        self._failed(node.name, error, "")

    def _finish(self, name: str, outcome: Outcome) -> None:
        active = self.running.pop(name)
        self.admission.release(active.grant, outcome.duration if outcome.ok else None)
        try:
            outcome = commit(self.ctx, active.job, active.info, outcome, still_owner=lambda: not self.claims.lost(active.node))
        except LeaseLost as e:
            # Another runner holds the step now: its outcome, not ours, will be recorded.
            self.reporter.step_waiting(name, f"{e}; waiting for its new holder")
            self._waiting[name] = time.monotonic() + self.options.poll_interval
            return
        except Exception as e:
            # The outcome could not be recorded: the step counts as failed, the run goes on.
            self._failed(name, f"could not record its outcome: {_describe(e)}", active.job.log_file)
            return
        finally:
            self.claims.release(active.node)
        if outcome.ok:
            self.reporter.step_finished(name, outcome.duration)
            self._succeeded(name)
            return
        self._failed(name, outcome.error or "failed", active.job.log_file)

    def _failed(self, name: str, error: str, log: str) -> None:
        self.summary.failed.append(Failure(name, error, log))
        self.reporter.step_failed(name, error, log)
        if not self.options.keep_going:
            self._stopping = True

    def _succeeded(self, name: str) -> None:
        self.summary.done += 1
        for child in self._dependants[name]:
            self._pending[child] -= 1
            if self._pending[child] == 0:
                heapq.heappush(self._ready, (self._index[child], child))

    def _interrupt(self) -> None:
        self.summary.interrupted = True
        for active in self.running.values():
            active.handle.cancel("interrupted")
        deadline = time.monotonic() + 10
        while self.running and time.monotonic() < deadline:
            try:
                name, event = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            except KeyboardInterrupt:
                continue
            self._handle(name, event)


def _describe(e: BaseException) -> str:
    """One line for an error: marinbuild's own say what is wrong; anything else names its type too."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if isinstance(e, MarinbuildError):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__
