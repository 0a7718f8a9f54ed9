"""One run, wired: from a Marinfile (or a list of steps) to a plan, the scheduler and its backends.

Everything a run assembles lives here and nowhere else: the machine's capacity, admission, the
backends and which step goes to which, the lease claims and the scheduler. The command line and
the library API (:func:`marinbuild.run`, :func:`marinbuild.plan`) both call this module, so a step
runs the same way from either. Backends are kinds found by name
(:mod:`marinbuild.backends.registry`): this module names none of them, and a new kind is added
there, not here (docs/architecture.md says how).

Data flows one way: Marinfile → steps → plan → session → scheduler → backend → markers.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from marinbuild.backends.cluster_file import cluster_path, read_cluster_file
from marinbuild.backends.kinds import PlacedKind, PlanInput
from marinbuild.backends.registry import chosen_kind, companion_kinds, kinds
from marinbuild.capacity import Capacity, Machine, detect_capacity, parse_named_counts, with_overrides
from marinbuild.execution.admission import RemoteAdmission, ResourceAdmission, check_plan_fits, requests_of
from marinbuild.execution.backend_fields import FieldCheck, check_fields
from marinbuild.planner import Plan
from marinbuild.project import Project, open_project, plan_targets, project_of_steps
from marinbuild.steps import Step
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord
from marinbuild.units import parse_duration

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, Job, Outcome
    from marinbuild.execution.reporting import Reporter
    from marinbuild.execution.run_context import RunContext
    from marinbuild.execution.run_parameters import RunParameters
    from marinbuild.execution.run_results import RunSummary, StepResult
    from marinbuild.execution.start_gates import Admission
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request
    from marinbuild.store.lease_settings import LeaseSettings

__all__ = [
    "Machine",
    "PlannedRun",
    "execute",
    "load",
    "plan_run",
]


def __getattr__(name: str) -> Any:
    # A run's results lived here once: found where they live now, without a plan loading them.
    if name in ("RunSummary", "StepOutcome", "StepResult"):
        from marinbuild.execution import run_results

        return getattr(run_results, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass(frozen=True)
class PlannedRun:
    """A plan with what a run of it needs to know: each step's request and the capacity."""

    project: Project
    plan: Plan
    requests: dict[str, Request]
    capacity: Capacity
    backends: tuple[PlacedKind, ...] = ()
    """Each kind's part of the run, first choice first: a step runs on the first that takes it."""
    fields: FieldCheck | None = None
    """Each step's environment, container image, and what planning could not check."""

    def kind_of(self, name: str) -> PlacedKind:
        """The kind of backend step ``name`` runs on."""
        return _taker(self.backends, name, self.requests[name])


def load(file: str = "Marinfile.py", steps: Sequence[Step] | None = None, prefix: str | None = None) -> Project:
    """The project of a Marinfile, or of ``steps`` given directly (then ``file`` is not read)."""
    return project_of_steps(steps, prefix) if steps is not None else open_project(file, prefix)


def capacity_of(machine: Machine) -> Capacity:
    """The detected capacity with the user's overrides."""
    return with_overrides(
        detect_capacity(),
        cores=machine.cores,
        mem=machine.mem,
        resources=parse_named_counts(list(machine.resources)),
        tokens=list(machine.tokens),
    )


def cluster_file(project: Project, path: str | None) -> tuple[dict[str, Any] | None, str]:
    """The decoded cluster file (``path``, else the Marinfile's ``DEFAULT_CLUSTER``) and where it is."""
    chosen = cluster_path(project.workdir, project.marinfile.default("DEFAULT_CLUSTER"), path)
    if chosen is None:
        return None, "<cluster>"
    return read_cluster_file(chosen, {key for kind in kinds() for key in kind.cluster_keys}), chosen


def plan_run(
    project: Project,
    targets: Sequence[str] = (),
    *,
    force: Sequence[str] = (),
    force_all: bool = False,
    machine: Machine = Machine(),
    cluster: str | None = None,
    settings: RunParameters | None = None,
    explain: bool = True,
    dry: bool = True,
    allow_cross_region: bool | None = None,
) -> PlannedRun:
    """Decide what runs, and refuse (before anything runs) a step nothing here could hold.

    Reads markers and leases and writes nothing. Every kind of backend the run uses sees the
    plan: the one ``settings`` chooses (joining its cluster only when one is named or the run
    is not ``dry``), those the cluster file configures, and this machine, which takes every
    step no other kind took; such a step must fit this machine.
    """
    fresh = settings is not None and settings.fresh_output
    plan = plan_targets(project, list(targets), list(force), force_all, explain=explain, fresh_output=fresh)
    to_run = tuple(plan.to_run())
    requests = requests_of(project.graph, plan.order)
    data, source = cluster_file(project, cluster)
    allow = allow_cross_region if allow_cross_region is not None else settings is not None and settings.allow_cross_region
    given = PlanInput(project, requests, to_run, capacity_of(machine), data, source,
                      settings.options if settings is not None else {}, dry, allow)
    companions: list[PlacedKind] = []
    for kind in companion_kinds():
        placed = kind.plan(given)
        if placed is not None:
            companions.append(placed)
            given = replace(given, capacity=placed.offer(given.capacity))
    chosen = chosen_kind(backend_choice(settings, project))
    first = chosen.plan(given) if chosen.name != _HERE else None
    here = chosen_kind(_HERE).plan(given)
    assert here is not None
    order = tuple(p for p in (first, *companions, here) if p is not None)
    fields = check_fields(
        project.graph, plan.order, requests, to_run=to_run, marinfile=project.marinfile.path,
        kind_of=lambda n: _taker(order, n, requests[n]),
    )
    settled, capacity = dict(fields.requests), given.capacity
    for placed in order:
        narrowed, capacity = placed.settle(given, settled, capacity)
        settled = dict(narrowed)
    if any(getattr(placed, "remote", True) for placed in order):  # a kind saying nothing is asked step by step
        here_only = {n: settled[n] for n in to_run if not _taker(order, n, requests[n]).remote}
    else:  # every step is this machine's to hold: no kind to ask, step by step
        here_only = {n: settled[n] for n in to_run}
    check_plan_fits(here_only, capacity)
    return PlannedRun(project, plan, settled, capacity, order, fields=fields)


_HERE = "local"
"""The kind that runs steps on this machine: it takes every step no other kind took."""


def _taker(order: Sequence[PlacedKind], name: str, request: Request) -> PlacedKind:
    for placed in order:
        if placed.takes(name, request):
            return placed
    return order[-1]


def backend_choice(settings: RunParameters | None, project: Project) -> str:
    """``settings.backend``, else the Marinfile's ``DEFAULT_BACKEND``, else local; a name ``--backend`` takes."""
    asked = settings.backend if settings is not None else None
    choice = str(asked or project.marinfile.default("DEFAULT_BACKEND") or _HERE)
    return chosen_kind(choice).name


_RUN_PACKAGES = ("marinbuild.execution", "marinbuild.backends", f"marinbuild.backends.{_HERE}")
"""Where the machinery that runs steps on this machine lives: a run loads each of their modules
before it starts (``tests/unit/execution/test_session.py`` checks that a run then loads no more)."""
_STEP_PROCESS_ONLY = frozenset({"marinbuild.backends.worker"})
"""Modules that run in a step's own process, never in the runner's."""


def run_modules() -> list[str]:
    """What :func:`execute` imports to run steps on this machine: every module of :data:`_RUN_PACKAGES`."""
    import importlib
    import os

    found = ["pwd"]  # getpass.getuser, for the info of the first step recorded
    for package in _RUN_PACKAGES:
        (folder,) = importlib.import_module(package).__path__
        names = (f"{package}.{f[:-3]}" for f in sorted(os.listdir(folder)) if f.endswith(".py") and f != "__init__.py")
        found += [name for name in names if name not in _STEP_PROCESS_ONLY and name not in found]
    return found


def load_run_modules() -> None:
    """Import what a run needs before it starts: a plan or a run with nothing to do never does.

    Once a run starts, Ctrl-C stops it. One that landed while a module loaded was handled
    like any other, but a second one then (a storm) raised inside the import system's own
    clean-up, which the interpreter reports as "Exception ignored": a run that is about to
    start loads them first.
    """
    import importlib

    for name in run_modules():
        importlib.import_module(name)


def execute(
    planned: PlannedRun,
    settings: RunParameters | None = None,
    reporter: Reporter | None = None,
    echo: Callable[[str], None] = print,
    on_output: Callable[[str, str], None] | None = None,
    on_command: Callable[[str, str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> RunSummary:
    """Run what the plan says must run; returns once every step is done, failed or blocked.

    ``echo`` prints the few lines a backend says outside the reporter's events (remote hosts);
    ``warn`` (default: ``echo``) what a step did wrong that does not fail it (a write outside its output).
    ``on_output(step, line)``, when given, receives every line a running step prints, and
    ``on_command(step, command)`` each shell step's resolved command as it starts.
    Ctrl-C (and SIGTERM, where the caller maps it to KeyboardInterrupt) stops the run cleanly:
    running steps are cancelled and marked FAILED, and the summary says ``interrupted``.
    """
    # Imported here: a plan never loads what a run returns or is told.
    from marinbuild.execution.reporting import NullReporter
    from marinbuild.execution.run_parameters import RunParameters
    from marinbuild.execution.run_results import Recorder, RunSummary, StepOutcome, StepResult

    settings = settings if settings is not None else RunParameters()
    plan, project = planned.plan, planned.project
    to_run = plan.to_run()
    running = set(to_run)
    nodes = plan.steps.nodes
    results: dict[str, StepResult] = {
        n: StepResult(n, StepOutcome.SKIPPED, nodes[n].output_path) for n in plan.order if n not in running
    }
    for placed in planned.backends:
        placed.before_run(project, echo)  # even with nothing to run: what a killed runner left costs by the hour
    if not to_run:
        return RunSummary(results)
    # Imported here: a dry run or plan does not pay for the machinery that runs steps.
    from marinbuild.execution.claims import LeaseClaims
    from marinbuild.execution.scheduler import RunOptions, Scheduler
    from marinbuild.store.lease_settings import LeaseSettings

    lease_settings = LeaseSettings.resolve(settings.lease_heartbeat, settings.lease_expiry)
    ctx = _run_context(planned, settings, to_run, warn or echo)
    gc.freeze()  # the graph and plan live to the end: later collections need not walk them
    admission, jobs = _admission(planned, settings, to_run)
    tally: dict[str, dict[str, Any]] = {}
    # A remote host's output reaches the terminal only when step output is printed.
    runner, backend_for = _backends(planned, settings, lease_settings, echo, print_output=on_output is not None,
                                    tally=tally)
    claims = LeaseClaims(project.storage, lease_settings, stale_success=_redone(plan))
    recorder = Recorder(reporter or NullReporter(), on_command=on_command, tally=tally)
    if on_output is not None:
        from marinbuild.execution.output_stream import OutputFollower

        recorder.follower = OutputFollower(on_output)
    options = RunOptions(jobs=jobs, keep_going=settings.keep_going, poll_interval=lease_settings.poll)
    scheduler = Scheduler(plan, ctx, runner, recorder, options, admission=admission, claims=claims, backend_for=backend_for)
    if recorder.follower is not None:
        recorder.follower.on_reader_gone = scheduler.stop_with  # `run | head` stops the run and exits 141
    try:
        summary = scheduler.run()
    finally:
        claims.close()
        if recorder.follower is not None:
            recorder.follower.close()
    for n in to_run:
        results[n] = recorder.result(n, nodes[n].output_path, n in summary.finished_elsewhere)
    return RunSummary({n: results[n] for n in plan.order}, interrupted=summary.interrupted)


def _run_context(planned: PlannedRun, settings: RunParameters, to_run: Sequence[str], warn: Callable[[str], None]) -> RunContext:
    """What every step's records share: where outputs live, and which to start over or resume."""
    from marinbuild.execution.run_context import RunContext

    plan, project = planned.plan, planned.project
    start_over, resuming = output_handling(plan, settings)
    return RunContext(
        storage=project.storage,
        workdir=project.workdir,
        marinfile=project.marinfile.path,
        outputs={n: node.output_path for n, node in project.graph.nodes.items()},
        identities={n: node.identity for n, node in project.graph.nodes.items()},
        fresh_output=settings.fresh_output,
        keep_output=settings.keep_output,
        lost_attempts=frozenset(
            out for out in (plan.node(n).output_path for n in to_run)
            if (r := plan.statuses.get(out)) is not None and r.status == RUNNING and not r.mismatch
        ),
        start_over=start_over,
        resuming=resuming,
        prefix=project.graph.prefix,
        strict_outputs=settings.strict_outputs,
        warn=warn,
    )


def _admission(planned: PlannedRun, settings: RunParameters, to_run: Sequence[str]) -> tuple[Admission, int | None]:
    """Which steps may start together, and how many steps that declare nothing run at once."""
    budget = parse_duration(settings.walltime) if settings.walltime is not None else None
    # -j 0 (a bare -j): as many steps that declare nothing as the machine has cores.
    jobs = len(planned.capacity.cores) or 1 if settings.jobs == 0 else settings.jobs
    admission: Admission = ResourceAdmission(
        planned.capacity, planned.requests, planned.project.graph.prefix, walltime=budget, jobs=jobs
    )
    remote = [n for n in to_run if planned.kind_of(n).remote]
    if remote:
        admission = RemoteAdmission(admission, remote)  # type: ignore[arg-type]
    return admission, jobs


def _finished(record: StatusRecord | None) -> bool:
    return record is not None and record.status == SUCCESS


def output_handling(plan: Plan, settings: RunParameters) -> tuple[frozenset[str], dict[str, str]]:
    """How each step to run treats what its output folder holds: ``start_over`` and ``resuming`` of
    :class:`~marinbuild.execution.run_context.RunContext`.

    A step rerun over a finished output (forced, or a dependency rerun since) starts from an
    empty folder, its earlier contents set aside, unless it or the run keeps the output
    (``resume_output=True``, ``--keep-output``); a failed or interrupted step continues in
    place unless a fresh output is asked for.
    """
    start_over: set[str] = set()
    resuming: dict[str, str] = {}
    for name in plan.to_run():
        node = plan.node(name)
        out = node.output_path
        record = plan.statuses.get(out)
        keep = settings.keep_output or node.step.resume_output
        finished = _finished(record)
        if (finished or plan.decisions[name].forced) and not keep:
            start_over.add(out)
        elif finished:
            resuming[out] = "finished"
        elif record is not None and record.status in (FAILED, RUNNING) and not record.mismatch:
            interrupted = record.status == RUNNING or "interrupted" in (record.error or "")
            resuming[out] = "interrupted" if interrupted else "failed"
    return frozenset(start_over), resuming


def _redone(plan: Plan) -> dict[str, StatusRecord]:
    """The SUCCESS records, as planning read them, of the steps this run redoes (forced, or a
    dependency rerun): finding one of them again must not count as done.

    Taken from the plan, never read again: another runner may finish such a step between the
    plan and this line, and its SUCCESS, read here, would be taken for the one to redo.
    """
    outputs = (plan.node(n).output_path for n in plan.to_run())
    return {out: rec for out in outputs if (rec := plan.statuses.get(out)) is not None and rec.status == SUCCESS}


def _backends(
    planned: PlannedRun,
    settings: RunParameters,
    lease: LeaseSettings,
    echo: Callable[[str], None],
    print_output: bool = True,
    tally: dict[str, dict[str, Any]] | None = None,
) -> tuple[Backend, Callable[[StepNode], Backend]]:
    """The backend of every step, from the kinds of the run: each takes its steps and passes the
    rest on to the next; every backend wrapped in the one retry loop."""
    from marinbuild.backends.base import WireInput

    wire = WireInput(
        planned.project, planned.requests, planned.fields.images if planned.fields is not None else {},
        lease, echo, echo if print_output else _drop_line, sync=settings.sync, fresh_output=settings.fresh_output,
    )
    choose: Callable[[StepNode], Backend] = _untaken
    for placed in reversed(planned.backends):
        choose = placed.backend(wire, choose)
    return _retrying(planned, settings, _Untaken(), choose, tally)


def _drop_line(line: str) -> None:
    pass


def _untaken(node: StepNode) -> Backend:
    raise RuntimeError(f"no backend of the run takes step {node.name!r}")


class _Untaken:
    """The scheduler's default backend, never used: every step's comes from the kinds of the run."""

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        raise RuntimeError(f"no backend of the run takes step {job.name!r}")


def _retrying(
    planned: PlannedRun,
    settings: RunParameters,
    backend: Backend,
    backend_for: Callable[[StepNode], Backend] | None,
    tally: dict[str, dict[str, Any]] | None = None,
) -> tuple[Backend, Callable[[StepNode], Backend]]:
    """Every backend wrapped in the one retry loop, with each step's budgets by cause."""
    from marinbuild.backends.retrying import RetryBudgets, with_retries

    graph = planned.project.graph
    timeouts = [p.provision_timeout for p in planned.backends if p.provision_timeout is not None]
    provision_timeout = float(timeouts[0]) if timeouts else RetryBudgets.provision_timeout

    def budget_of(name: str) -> RetryBudgets:
        s = graph.nodes[name].step
        return RetryBudgets(
            failure=settings.max_retries_failure if s.max_retries_failure is None else s.max_retries_failure,
            preemption=settings.max_retries_preemption if s.max_retries_preemption is None else s.max_retries_preemption,
            hang=settings.max_retries_hang if s.max_retries_hang is None else s.max_retries_hang,
            provision_timeout=provision_timeout,
        )

    return with_retries(backend, backend_for, budget_of, tally)
