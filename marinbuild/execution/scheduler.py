"""The run loop: start ready steps as capacity allows, record how each one ends.

The loop is driven by completion events, never by sleeping: backends report outcomes on a
queue, and each event frees capacity and may make dependants ready. Three gates decide
whether a ready step starts now:

* the ``-j`` cap on steps running at once;
* :class:`~marinbuild.execution.start_gates.Admission`, the resource pools (a step whose
  request does not fit now waits while smaller ready steps go ahead; once it has waited
  ``starvation_limit`` seconds, nothing further is started ahead of it until it fits, so it
  is not starved);
* :class:`~marinbuild.execution.start_gates.Claims`, the leases (a step leased by another
  runner waits without holding up the rest, and is re-checked every ``poll_interval``
  seconds). A step whose lease is lost while it runs is cancelled, nothing of it is
  recorded, and it waits again.

A failed step stops new starts unless ``keep_going``; its dependants never start. Any
exception while preparing, launching or recording one step fails that step with its error
(its marker says ``FAILED``, its resources and claim are given back); the run goes on.

Readiness comes from each step's dependencies: a step is ready once every dependency
that runs in this plan has succeeded.

A step's store round trips on its way in and out run on the loop itself on local disk, and
on a pool of store threads on a remote store (``Storage.keeps_summary``; see
:mod:`marinbuild.execution.store_work`). Their results come back to the loop as events
(:mod:`marinbuild.execution.loop_events`): only the loop changes the scheduler's state or
talks to the reporter.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import queue
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Backend, Grant, Job, Outcome, Running
from marinbuild.backends.held_signals import HeldSignals
from marinbuild.backends.retrying import announces_start
from marinbuild.errors import LeaseLost, MarinbuildError
from marinbuild.execution.admission import JOBS_WAIT, LEASE_WAIT
from marinbuild.execution.attempt_commit import commit, record_failure
from marinbuild.execution.attempt_handover import status_left_to_the_attempt
from marinbuild.execution.attempt_start import prepare
from marinbuild.execution.dependency_check import DependencyBusy
from marinbuild.execution.loop_events import WAKE, Claimed, ClaimLost, Committed, Stop, StoreDone, Wake
from marinbuild.execution.output_folder import claim_lease, link_refusal
from marinbuild.execution.reporting import Failure, NullReporter, Reporter, Summary
from marinbuild.execution.run_context import RunContext
from marinbuild.execution.start_gates import Admission, Claims, NoClaims, Unlimited
from marinbuild.execution.store_work import StoreWork
from marinbuild.graph import StepNode
from marinbuild.planner import Plan

__all__ = ["RunOptions", "Scheduler"]


@dataclass(frozen=True)
class RunOptions:
    jobs: int | None = None
    keep_going: bool = False
    starvation_limit: float = 60.0
    poll_interval: float = 5.0


@dataclass
class _Active:
    node: StepNode
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
        backend_for: Callable[[StepNode], Backend] | None = None,
    ) -> None:
        self.plan = plan
        self.ctx = ctx
        self.backend_for = backend_for or (lambda node: backend)
        self.reporter = reporter
        self.options = options
        self.admission = admission or Unlimited()
        self.claims = claims or NoClaims()
        # A SimpleQueue: its put may be called from a signal handler (see _wake), and its get
        # hands over an event without Python code in between that a Ctrl-C could interrupt.
        self.events: queue.SimpleQueue[tuple[str, Outcome | ClaimLost | StoreDone | Wake | Stop]] = queue.SimpleQueue()
        self.claims.watch(lambda name, why: self.events.put((name, ClaimLost(why))))
        self.running: dict[str, _Active] = {}
        self.summary = Summary()
        # A second Ctrl-C is never held; the first wakes the wait for the next event.
        self._signals = HeldSignals(second_goes_through=True, on_noted=self._wake)
        remote = getattr(ctx.storage, "keeps_summary", False)
        self.store_work = StoreWork(self.events, min(32, max(8, 2 * (options.jobs or 8))) if remote else 0)
        self._starting: dict[str, Grant] = {}  # claimed and prepared on a store thread, not started yet
        self._lost_while_starting: dict[str, str] = {}

        to_run = plan.to_run()
        self._index = {n: i for i, n in enumerate(plan.order)}
        members = set(to_run)
        # From each step's own dependencies, in plan order (as the plan's networkx graph lists
        # them): a run need not import networkx, 18 MB and a tenth of a second.
        nodes = plan.steps.nodes
        self._pending: dict[str, int] = {}
        self._dependants: dict[str, list[str]] = {n: [] for n in to_run}
        for n in plan.order:
            if n in members:
                deps = [d for d in nodes[n].deps if d in members]
                self._pending[n] = len(deps)
                for d in deps:
                    self._dependants[d].append(n)
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
            with self._signals.installed():
                try:
                    self._loop()
                except KeyboardInterrupt:
                    self._interrupt()
                except BaseException:
                    # Whatever else ended the loop (the reader of the run's output went away, a
                    # bug) stops the steps as Ctrl-C does, each marked, before it is reported;
                    # the reporter may be what failed, so the stop says nothing more.
                    self.reporter = NullReporter()
                    with contextlib.suppress(BaseException):
                        self._interrupt()
                    raise
        finally:
            self.store_work.close()
        self.summary.not_started = (
            self.summary.total - self.summary.done - len(self.summary.failed)
        )
        self.reporter.run_finished(self.summary)
        return self.summary

    def _loop(self) -> None:
        # Ctrl-C and SIGTERM end the loop's wait for an event and are taken then, never halfway
        # through handling one or starting a step: a step is then either listed as running (and
        # cancelled) or not started, and a finished one has its outcome recorded.
        holding = self._signals.holding
        while True:
            with holding():
                if not self._stopping:
                    self._start_ready()
                if not self.running and not self.store_work.in_flight and not (self._waiting and not self._stopping):
                    self._give_up_on_blocked()
                    return
            # The wait is held too: a Ctrl-C raised inside it could take an event off the queue
            # and lose it (a finished step left RUNNING). The Ctrl-C wakes it instead (_wake),
            # and is raised once what was taken is handled.
            with holding():
                try:
                    name, event = self.events.get(timeout=self._next_wakeup())
                except queue.Empty:
                    continue
                self._handle(name, event)

    def _wake(self) -> None:
        self.events.put(("", WAKE))  # SimpleQueue.put: safe inside a signal handler

    def stop_with(self, error: BaseException) -> None:
        """Stop the run as if its loop had raised ``error``: its steps are stopped and marked, then it is raised.

        Safe from any thread; the loop raises it once it has handled what it holds.
        """
        self.events.put(("", Stop(error)))

    def _handle(self, name: str, event: Outcome | ClaimLost | StoreDone | Wake | Stop) -> None:
        if isinstance(event, Wake):
            return
        if isinstance(event, Stop):
            raise event.error
        if isinstance(event, StoreDone):
            self.store_work.finished(name)
            event.then(event.result)
        elif isinstance(event, Outcome):
            self._finish(name, event)
        elif name in self.running:
            self.reporter.step_waiting(name, f"lease lost: {event.reason}; stopping it")
            self.running[name].handle.cancel(f"lease lost: {event.reason}")
        elif name in self._starting:
            self._lost_while_starting[name] = event.reason  # its claim is still on its way back

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
            if self.options.jobs is not None and len(self.running) + len(self._starting) >= self.options.jobs:
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
            self._starting[name] = grant
            self.store_work.submit(name, functools.partial(self._claim, node, grant),
                                   functools.partial(self._claimed, node, grant))
        if self._ready:
            # Not looked at in this pass: behind the -j limit, or behind the steps deferred.
            short_of[JOBS_WAIT if capped else next(iter(short_of), JOBS_WAIT)] += len(self._ready)
        for item in deferred:
            heapq.heappush(self._ready, item)
        self._tell_waiting(short_of)

    def _waits_on(self, node: StepNode) -> str:
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

    def _claim(self, node: StepNode, grant: Grant) -> Claimed:
        """Claim the step and prepare it (RUNNING marker and all); runs on a store thread."""
        refused = link_refusal(self.ctx, node)
        if refused is not None:  # before the lease: nothing at all is written through a link
            return Claimed("refused", refused)
        try:
            verdict, why = claim_lease(self.ctx, node, lambda: self.claims.try_claim(node))
        except (MarinbuildError, OSError) as e:
            # The store refused even the lease (full, read-only): this step fails, the run goes on.
            self.claims.release(node)
            where = e.filename if isinstance(e, OSError) and e.filename else node.output_path
            problem = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            return Claimed("refused", f"cannot take its lease ({where}): {problem}")
        if verdict != "go":
            return Claimed(verdict, why)
        try:
            job, info = prepare(self.ctx, node, dict(grant.env), grant.cores, grant.timeout)
        except DependencyBusy as e:
            # A dependency is being redone elsewhere: wait for it as for a step leased elsewhere.
            self.claims.release(node)
            return Claimed("busy", str(e))
        except Exception as e:
            # A step that cannot be prepared (an input too big to mirror, a value no command
            # can hold, a bug) fails alone; the run goes on with the others.
            return Claimed("unprepared", self._give_up(node, _describe(e)))
        return Claimed("go", why, job, info)

    def _claimed(self, node: StepNode, grant: Grant, result: Claimed | BaseException) -> None:
        """Act on a claim, on the loop: start the step, or say why it waits, was done, or failed."""
        name = node.name
        self._starting.pop(name, None)
        lost = self._lost_while_starting.pop(name, None)
        if lost is not None and isinstance(result, Claimed) and result.kind == "go":
            # Its lease was lost between the claim and now: it never starts; whoever holds
            # the lease now runs it, or it is claimed again.
            self.claims.release(node)
            result = Claimed("wait", f"lease lost before it started: {lost}")
        if isinstance(result, BaseException):
            self.admission.release(grant)
            self._failed(name, f"could not be claimed: {_describe(result)}", "")
            return
        if result.kind != "go":
            self.admission.release(grant)
        if result.kind in ("refused", "unprepared"):
            self._failed(name, result.why, "")
        elif result.kind == "done":
            self.summary.finished_elsewhere.append(name)
            self.reporter.step_skipped(name, result.why)
            self._succeeded(name)
        elif result.kind in ("wait", "busy"):
            if self._told_waiting.get(name) != result.why:
                self._told_waiting[name] = result.why
                self.reporter.step_waiting(name, result.why)
            self._waiting[name] = time.monotonic() + self.options.poll_interval
            self._waiting_for[name] = LEASE_WAIT if result.kind == "wait" else "a dependency redone elsewhere"
        elif self.summary.interrupted:
            # Claimed while Ctrl-C was being handled: it never starts, and says so.
            self.admission.release(grant)
            self._failed(name, self._give_up(node, "interrupted before it started"), "")
        else:
            assert result.job is not None and result.info is not None
            self._launch(node, grant, result.job, result.info)

    def _launch(self, node: StepNode, grant: Grant, job: Job, info: dict[str, Any]) -> None:
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
            if announces_start(backend):
                status_left_to_the_attempt(info, job)
            handle = backend.start(job, lambda outcome: self.events.put((name, outcome)))
        except LeaseLost as e:
            # Its lease went to another runner before the step passed its gate: nothing ran,
            # and the markers are the new holder's to write.
            self.admission.release(grant)
            self.claims.release(node)
            self.reporter.step_waiting(name, f"lease lost before it started: {e}")
            self._waiting[name] = time.monotonic() + self.options.poll_interval
            return
        except Exception as e:
            self._not_started(node, grant, f"could not start: {_describe(e)}")
            return
        # Registered before anything else can run: a Ctrl-C while the start is being reported
        # (the first line printed imports the terminal library) must still cancel the step.
        self.running[name] = _Active(node, job, info, grant, handle)
        self.reporter.step_started(name, node.output_path)

    def _not_started(self, node: StepNode, grant: Grant, error: str) -> None:
        """A step that failed before it started: its marker says FAILED, its grant and claim go back."""
        self.admission.release(grant)
        self._failed(node.name, self._give_up(node, error), "")

    def _give_up(self, node: StepNode, error: str) -> str:
        """Write the FAILED marker of a step that never started and let its claim go; the error to report."""
        try:
            record_failure(self.ctx, node, error)
        except Exception as e:  # the store refused even that: the run still goes on
            error = f"{error} (and its FAILED status could not be written: {_describe(e)})"
        finally:
            self.claims.release(node)
        return error

    def _finish(self, name: str, outcome: Outcome) -> None:
        active = self.running.pop(name)
        self.admission.release(active.grant, outcome.duration if outcome.ok else None)
        self.store_work.submit(name, functools.partial(self._commit, active, outcome),
                               functools.partial(self._committed, active))

    def _commit(self, active: _Active, outcome: Outcome) -> Committed:
        """Record the outcome and let the claim go; runs on a store thread."""
        try:
            recorded = commit(self.ctx, active.job, active.info, outcome,
                              still_owner=lambda: not self.claims.lost(active.node))
        except LeaseLost as e:
            return Committed(lost=str(e))
        except Exception as e:
            return Committed(error=_describe(e))
        finally:
            self.claims.release(active.node)
        return Committed(recorded)

    def _committed(self, active: _Active, result: Committed | BaseException) -> None:
        """Act on a recorded outcome, on the loop."""
        name = active.node.name
        if isinstance(result, BaseException):
            result = Committed(error=_describe(result))
        if result.lost is not None:
            # Another runner holds the step now: its outcome, not ours, will be recorded.
            self.reporter.step_waiting(name, f"{result.lost}; waiting for its new holder")
            self._waiting[name] = time.monotonic() + self.options.poll_interval
            return
        if result.error is not None or result.outcome is None:
            # The outcome could not be recorded: the step counts as failed, the run goes on.
            self._failed(name, f"could not record its outcome: {result.error}", active.job.log_file)
            return
        outcome = result.outcome
        if outcome.ok:
            self.reporter.step_finished(name, outcome.duration, outcome.capacity_wait)
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
        while (self.running or self.store_work.in_flight) and time.monotonic() < deadline:
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
