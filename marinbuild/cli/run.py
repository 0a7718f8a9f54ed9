"""``marinbuild run``: run the targets and whatever they need that is not up to date."""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.backends.registry import kind_names, kinds
from marinbuild.backends.retry_budgets import RetryBudgets
from marinbuild.cli.exits import handles_errors, interruption_said
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
    step_targets,
)
from marinbuild.cli.printing import err, out, print_plan, step_line_printer, terminal_safe, with_environments
from marinbuild.cli.startup import signals_of_a_run
from marinbuild.execution.invocation import RunVoice, invoke
from marinbuild.execution.run_parameters import RunParameters
from marinbuild.store.lease_settings import DEFAULT_EXPIRY, DEFAULT_HEARTBEAT

if TYPE_CHECKING:
    from marinbuild.execution.reporting import Reporter
    from marinbuild.execution.session import PlannedRun

__all__ = ["run_command"]


def _lease_flag(ctx: typer.Context, param: typer.CallbackParam, value: float | None) -> float | None:
    """Refuse a lease heartbeat or expiry out of bounds as it is parsed, before anything loads.

    Click parses the two in command-line order: the second one parsed also checks the pair,
    a missing one counting as its default.
    """
    mine, other = ("lease_expiry", "lease_heartbeat") if param.name == "lease_expiry" else ("lease_heartbeat", "lease_expiry")
    given = {mine: value}
    if other in ctx.params:  # parsed already: check the pair
        given[other] = ctx.params[other]
    if all(v is None for v in given.values()):
        return value
    from marinbuild.store.lease_settings import lease_flag_problem
    if other in given:
        beat = given["lease_heartbeat"] if given["lease_heartbeat"] is not None else DEFAULT_HEARTBEAT
        expiry = given["lease_expiry"] if given["lease_expiry"] is not None else DEFAULT_EXPIRY
        problem = lease_flag_problem(beat, expiry)
    else:
        problem = lease_flag_problem(value) if mine == "lease_heartbeat" else lease_flag_problem(expiry=value)
    if problem is not None:
        raise typer.BadParameter(problem)
    return value


BackendName = enum.StrEnum("BackendName", {name: name for name in kind_names()})  # type: ignore[misc]
"""The kinds ``--backend`` takes, as the registry knows them when the command line loads."""
_BACKENDS_HELP = ", ".join(f"{k.name} ({k.help})" if k.help else k.name for k in kinds() if k.choice)


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
    json: Annotated[bool, typer.Option("--json", help="Report events as JSON lines.")] = False,
    cores: CoresOpt = None,
    mem: MemOpt = None,
    resources: ResourcesOpt = None,
    token: TokenOpt = None,
    walltime: Annotated[str | None, typer.Option("--walltime", help="Time budget of the whole run, e.g. 2:00:00; steps whose soft limit exceeds what is left are not started.")] = None,
    backend: Annotated[BackendName | None, typer.Option("--backend", case_sensitive=False, help=f"Where steps run: {_BACKENDS_HELP} (default: the Marinfile's DEFAULT_BACKEND, else local).")] = None,
    ray_address: Annotated[str | None, typer.Option("--ray-address", envvar="RAY_ADDRESS", help="The Ray cluster for --backend ray (default: a Ray started for this run).")] = None,
    lease_heartbeat: Annotated[float | None, typer.Option("--lease-heartbeat", envvar="MARINBUILD_LEASE_HEARTBEAT", callback=_lease_flag, help=f"Seconds between lease renewals (default: {DEFAULT_HEARTBEAT:g}; at least 0.1).")] = None,
    lease_expiry: Annotated[float | None, typer.Option("--lease-expiry", envvar="MARINBUILD_LEASE_EXPIRY", callback=_lease_flag, help=f"Seconds a lease must stay unrenewed before another runner takes it over (default: {DEFAULT_EXPIRY:g}; 1 to 3600, at least twice the heartbeat).")] = None,
    fresh_output: Annotated[bool, typer.Option("--fresh-output", help="A failed or interrupted step starts over: its partial output is cleared first instead of resumed from.")] = False,
    keep_output: Annotated[bool, typer.Option("--keep-output", help="A step rerun over its finished output (forced, or a dependency rerun) resumes in place instead of starting from an empty folder.")] = False,
    cluster: ClusterOpt = None,
    max_retries_preemption: Annotated[int, typer.Option("--max-retries-preemption", min=0, help="Retries of a preempted TPU step (a step's own setting wins).")] = RetryBudgets.preemption,
    max_retries_failure: Annotated[int, typer.Option("--max-retries-failure", "--retries", min=0, help="Retries of a failed step, on every backend (a step's own max_retries_failure wins).")] = RetryBudgets.failure,
    max_retries_hang: Annotated[int, typer.Option("--max-retries-hang", min=0, help="Retries of an attempt killed for making no progress within its progress_timeout (a step's own max_retries_hang wins).")] = RetryBudgets.hang,
    no_sync: Annotated[bool, typer.Option("--no-sync", help="Do not copy the project directory to TPU hosts.")] = False,
    allow_cross_region: Annotated[bool, typer.Option("--allow-cross-region", help="Run TPU steps whose prefix or gs:// inputs lie outside the [gcp] zone's region (billed egress).")] = False,
    plan: Annotated[str | None, typer.Option("--plan", help="Run exactly the plan `marinbuild plan -o FILE` wrote; refuse when it no longer holds.")] = None,
    print_commands: Annotated[bool, typer.Option("-p", "--print-commands", help="Print each shell step's command, resolved, as it starts (with -n: each command that would run).")] = False,
    wide: Annotated[bool, typer.Option("--wide", help="With -n on a terminal: whole output paths and reasons instead of a table within 100 columns.")] = False,
    strict_outputs: Annotated[bool, typer.Option("--strict-outputs", help="Fail a step that writes outside its output folder (into a dependency's output, or beside the outputs) instead of warning; as strict_outputs=True on a step.")] = False,
    list: Annotated[bool, typer.Option("--list", help="Print the names of the steps the targets select, one a line, and run nothing (as `marinbuild list`).")] = False,
    quiet: QuietOpt = False,
    verbose: VerboseOpt = False,
) -> None:
    """Run the targets and whatever they need that is not up to date."""
    if list:
        from marinbuild.cli.list import print_step_names

        print_step_names(file, prefix, targets)
        return
    # Every option is a field of RunParameters, passed by name (tests/unit/cli/test_run.py checks
    # that the command line, marinbuild.run and RunParameters name the same options).
    params = RunParameters.of(
        targets=targets, file=file, prefix=prefix, jobs=jobs, keep_going=keep_going, force=force,
        force_all=force_all, dry=dry, print_output=print_output, json=json, cores=cores, mem=mem,
        resources=resources, token=token, walltime=walltime, backend=backend, ray_address=ray_address,
        lease_heartbeat=lease_heartbeat, lease_expiry=lease_expiry, fresh_output=fresh_output,
        keep_output=keep_output, cluster=cluster, max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure, max_retries_hang=max_retries_hang, no_sync=no_sync,
        allow_cross_region=allow_cross_region, plan=plan, print_commands=print_commands, wide=wide,
        strict_outputs=strict_outputs, list=list, quiet=quiet, verbose=verbose,
    )
    quiet = params.quiet
    made: dict[str, PlannedRun] = {}  # the plan, once made: the live view's estimates
    with signals_of_a_run() as starting:
        voice = RunVoice(
            reporter=lambda: _reporter(quiet, params.json, made.get("plan")),
            planned=lambda planned: made.update(plan=planned),
            # With --json, stdout holds JSON lines only: "nothing to do" and what TPU hosts say go to stderr.
            echo=_silent if quiet else _to_stderr if params.json else lambda line: out.print(line, markup=False, highlight=False),
            warn=_to_stderr,
            on_output=step_line_printer(params.json, "output", "[{step}] {text}") if params.prints_output else None,
            on_command=step_line_printer(params.json, "command", "[{step}] $ {text}") if params.print_commands else None,
            show_plan=lambda planned: _show_dry_run(planned, params),
            starting=starting,
        )
        summary = invoke(params, voice, target_names=step_targets)
    if params.dry or params.list:
        return  # the plan was the answer
    if summary.interrupted:
        interruption_said()  # in the run's summary
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _show_dry_run(planned: PlannedRun, params: RunParameters) -> None:
    """``run -n``: the plan; with ``-p`` also each shell step that would run, its command resolved (Snakemake's ``-n -p``)."""
    print_plan(planned.plan, with_environments(planned), params.wide)
    if params.print_commands:
        show = step_line_printer(params.json, "command", "[{step}] $ {text}")
        for name, command in commands_to_run(planned):
            show(name, command)


def commands_to_run(planned: PlannedRun) -> list[tuple[str, str]]:
    """Each shell step the plan would run and its command as it would start (mirrored inputs at their copies' paths)."""
    from marinbuild.errors import MarinbuildError
    from marinbuild.resolve import render_command, resolve_config
    from marinbuild.steps import find_mirrored
    from marinbuild.store.mirror import mirror_target

    graph = planned.project.graph
    outputs = {n: node.output_path for n, node in graph.nodes.items()}
    found: list[tuple[str, str]] = []
    for name in planned.plan.to_run():
        node = graph.nodes[name]
        s = node.step
        if s.cmd is None:
            continue
        mirrors = {m.source: mirror_target(graph.prefix, m.source) for m in find_mirrored(s.config)}
        try:
            config = resolve_config(s.config, node.output_path, outputs, mirrors)
            found.append((name, render_command(s.cmd, config, node.output_path, name)))
        except MarinbuildError as e:
            found.append((name, f"(cannot be rendered: {e})"))
    return found


def _silent(line: str) -> None:
    pass


def _to_stderr(line: str) -> None:
    err.print(terminal_safe(line), markup=False, highlight=False)


def _reporter(quiet: bool, json_events: bool, planned: PlannedRun | None = None) -> Reporter:
    from marinbuild.cli.console import LineReporter, LiveReporter
    from marinbuild.execution.reporting import JsonReporter

    if json_events:
        return JsonReporter()
    if quiet or not out.console.is_terminal:
        return LineReporter(out.console, quiet=quiet)
    live = LiveReporter(out.console)
    if planned is not None:
        live.estimate_from(planned.project, planned.plan.to_run())
    return live
