"""``marinbuild run``: run the targets and whatever they need that is not up to date."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Annotated, Any

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import (
    ClusterOpt,
    CoresOpt,
    FileOpt,
    ForceAllOpt,
    ForceOpt,
    MemOpt,
    PrefixOpt,
    QuietOpt,
    ResourcesOpt,
    TargetsArg,
    TokenOpt,
    VerboseOpt,
    machine_of,
    step_targets,
)
from marinbuild.cli.printing import err, out, print_notes, print_plan, step_line_printer, with_environments
from marinbuild.execution.session import BackendChoice

if TYPE_CHECKING:
    from marinbuild.execution.reporting import Reporter

__all__ = ["run_command"]


@handles_errors
def run_command(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    jobs: Annotated[int | None, typer.Option("-j", "--jobs", min=0, help="Steps running at once; steps that declare no resources are then limited by -j alone (like make -j). A bare -j: as many as cores. Default: as resources allow (a step that declares nothing counts one core).")] = None,
    keep_going: Annotated[bool, typer.Option("-k", "--keep-going", help="Go on with independent steps after a failure.")] = False,
    force: ForceOpt = None,
    force_all: ForceAllOpt = False,
    dry: Annotated[bool, typer.Option("--dry", "-n", "--dry-run", help="Only show the plan (same as `marinbuild plan`).")] = False,
    print_output: Annotated[bool | None, typer.Option("--print-output/--no-print-output", help="Print what steps print, each line after [step] (default: yes, except with -q or --json).")] = None,
    json_events: Annotated[bool, typer.Option("--json", help="Report events as JSON lines.")] = False,
    cores: CoresOpt = None,
    mem: MemOpt = None,
    resources: ResourcesOpt = None,
    token: TokenOpt = None,
    walltime: Annotated[str | None, typer.Option("--walltime", help="Time budget of the whole run, e.g. 2:00:00; steps whose soft limit exceeds what is left are not started.")] = None,
    backend: Annotated[BackendChoice | None, typer.Option("--backend", case_sensitive=False, help="Where steps run (default: the Marinfile's DEFAULT_BACKEND, else local).")] = None,
    ray_address: Annotated[str | None, typer.Option("--ray-address", envvar="RAY_ADDRESS", help="The Ray cluster for --backend ray (default: a Ray started for this run).")] = None,
    lease_heartbeat: Annotated[float | None, typer.Option("--lease-heartbeat", envvar="MARINBUILD_LEASE_HEARTBEAT", help="Seconds between lease renewals (default: 10).")] = None,
    lease_expiry: Annotated[float | None, typer.Option("--lease-expiry", envvar="MARINBUILD_LEASE_EXPIRY", help="Seconds a lease must stay unrenewed before another runner takes it over (default: 60).")] = None,
    fresh_output: Annotated[bool, typer.Option("--fresh-output", help="Clear each step's output directory before it runs instead of keeping partial output.")] = False,
    cluster: ClusterOpt = None,
    max_retries_preemption: Annotated[int, typer.Option("--max-retries-preemption", min=0, help="Retries of a preempted TPU step (a step's own setting wins).")] = 100,
    max_retries_failure: Annotated[int, typer.Option("--retries", "--max-retries-failure", min=0, help="Retries of a failed step, on every backend (a step's own max_retries_failure wins).")] = 0,
    no_sync: Annotated[bool, typer.Option("--no-sync", help="Do not copy the project directory to TPU hosts.")] = False,
    reviewed: Annotated[str | None, typer.Option("--plan", help="Run exactly the plan `marinbuild plan -o FILE` wrote; refuse when it no longer holds.")] = None,
    print_commands: Annotated[bool, typer.Option("-p", "--print-commands", help="Print each shell step's command, resolved, as it starts.")] = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run the targets and whatever they need that is not up to date."""
    from marinbuild.execution import session

    settings = session.RunSettings(
        jobs=jobs,
        keep_going=keep_going,
        backend=backend.value if backend is not None else None,
        ray_address=ray_address,
        lease_heartbeat=lease_heartbeat,
        lease_expiry=lease_expiry,
        fresh_output=fresh_output,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
        sync=not no_sync,
        walltime=walltime,
    )
    project = session.load(file, prefix=prefix)
    review = None
    if reviewed is not None:
        from marinbuild.cli.reviewed import load_review

        review = load_review(reviewed, targets, force, force_all)
        targets, force, force_all = list(review.targets), list(review.force), review.force_all
    planned = session.plan_run(
        project,
        step_targets(project, targets),
        force=force or [],
        force_all=force_all,
        machine=machine_of(cores, mem, resources, token),
        cluster=cluster,
        settings=settings,
        explain=dry,
        dry=dry,
    )
    print_notes(planned)
    if review is not None:
        from marinbuild.cli.reviewed import check_review

        check_review(review, planned.plan, project.graph, lambda line: err.print(line, markup=False))
    if dry:
        print_plan(planned.plan, with_environments(planned))
        return
    if not planned.plan.to_run():
        if not quiet:
            n = len(planned.plan.order)
            out.print(f"nothing to do: {n} step{'' if n == 1 else 's'} up to date")
        return
    if walltime is not None:
        from marinbuild.units import parse_duration

        parse_duration(walltime)  # refused before the prefix folder is made
    if project.storage.is_local:
        from marinbuild.store.storage import check_local_prefix

        check_local_prefix(project.storage.prefix, prefix, create=True)
    signal.signal(signal.SIGTERM, _terminate_as_interrupt)
    # A background job of a script starts with SIGINT ignored, and Python then leaves it
    # ignored: `kill -INT` would do nothing. The runner stops on it as on Ctrl-C.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if print_output is None:
        print_output = not quiet and not json_events
    summary = session.execute(
        planned,
        settings,
        _reporter(quiet, json_events),
        echo=(lambda line: None) if quiet else (lambda line: out.print(line, markup=False, highlight=False)),
        on_output=step_line_printer(json_events, "output", "[{step}] {text}") if print_output else None,
        on_command=step_line_printer(json_events, "command", "[{step}] $ {text}") if print_commands else None,
    )
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def _reporter(quiet: bool, json_events: bool) -> Reporter:
    from marinbuild.cli.console import LineReporter, LiveReporter
    from marinbuild.execution.reporting import JsonReporter

    if json_events:
        return JsonReporter()
    if quiet or not out.console.is_terminal:
        return LineReporter(out.console, quiet=quiet)
    return LiveReporter(out.console)
