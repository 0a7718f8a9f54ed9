"""The ``marinbuild`` command line: run, plan, status, why, clean.

Exit codes: 0 ok, 1 a step failed, 2 bad input or usage, 130 interrupted. Bad input is
one line on stderr (a traceback only with ``-v``).
"""

from __future__ import annotations

import enum
import functools
import gc
import json
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from marinbuild.cli import dag_text as dag_render
from marinbuild.errors import MarinbuildError, UserError, missing_extra
from marinbuild.execution.admission import describe_request
from marinbuild.execution.session import BackendChoice
from marinbuild.planner import Plan, closure, select
from marinbuild.project import Project, open_project, plan_targets, probe
from marinbuild.staleness import Action, Decision, diff_payloads
from marinbuild.store.history import RunIndex, earlier_info
from marinbuild.store.markers import UNREADABLE, read_info

if TYPE_CHECKING:
    from rich.console import Console

    from marinbuild.execution.reporting import Reporter
    from marinbuild.execution.session import Machine

app = typer.Typer(
    name="marinbuild",
    help="Build tool for ML experiments: steps with hashed configs, run in parallel, never twice.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)



def _print_version(value: bool) -> None:
    if value:
        from marinbuild import __version__

        print(f"marinbuild {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """Build tool for ML experiments: steps with hashed configs, run in parallel, never twice."""


class _LazyConsole:
    """A rich Console made on first use: commands that print plain text never import rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    @functools.cached_property
    def console(self) -> Console:
        from rich.console import Console

        return Console(**self._options)

    def print(self, *objects: Any, **options: Any) -> None:
        self.console.print(*objects, **options)


out = _LazyConsole(highlight=False, soft_wrap=True)
err = _LazyConsole(stderr=True, highlight=False, soft_wrap=True)

F = TypeVar("F", bound=Callable[..., Any])


class DagFormat(enum.StrEnum):
    """Text formats of the step graph."""

    dot = "dot"
    mermaid = "mermaid"


FileOpt = Annotated[str, typer.Option("-f", "--file", help="The Marinfile to load.")]
PrefixOpt = Annotated[
    str | None,
    typer.Option("--prefix", envvar="MARIN_PREFIX", help="Where outputs live (any fsspec URL); default ./marinbuild-out."),
]
TargetsArg = Annotated[list[str] | None, typer.Argument(help="Step names or globs; none means every declared step.")]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="Tracebacks and more detail.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Only failures and the summary.")]
ForceOpt = Annotated[list[str] | None, typer.Option("--force", "-R", help="Rerun this step (and what depends on it); repeatable.")]
ForceAllOpt = Annotated[bool, typer.Option("--force-all", "-F", help="Rerun every step the targets need.")]
CoresOpt = Annotated[int | None, typer.Option("--cores", help="Cores this run may use (default: detected).")]
MemOpt = Annotated[str | None, typer.Option("--mem", help="Memory this run may use, e.g. 16g (g = GiB; default: detected minus headroom).")]
ResourcesOpt = Annotated[list[str] | None, typer.Option("--resources", help="A custom counted resource NAME=N steps may ask for; repeatable.")]
TokenOpt = Annotated[list[str] | None, typer.Option("--token", help="A token this run offers; repeatable.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="TPU cluster file (TOML); default: the Marinfile's DEFAULT_CLUSTER.")]


def step_targets(project: Project, targets: list[str] | None) -> list[str]:
    """The targets as step names or globs: an output path (``marinbuild-out/data-1f0e…``, or a
    file inside one) stands for the step writing it; anything else is left for ``select``."""
    wanted = list(targets or [])
    nodes = project.graph.nodes
    looks_like_path = [t for t in wanted if t not in nodes and ("/" in t or os.sep in t) and not any(c in t for c in "*?[")]
    if not looks_like_path:
        return wanted
    local = project.storage.is_local
    by_output = {node.output_path.rstrip("/"): name for name, node in nodes.items()}
    out: list[str] = []
    for t in wanted:
        if t in looks_like_path:
            path = os.path.abspath(t) if local and "://" not in t else t.rstrip("/")
            while path and path not in by_output and os.path.dirname(path) != path:
                path = os.path.dirname(path)  # a file inside an output names its step too
            t = by_output.get(path, t)
        out.append(t)
    return out


def handles_errors(fn: F) -> F:
    """Turn marinbuild errors into one line and an exit code; tracebacks only with -v."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = bool(kwargs.get("verbose"))
        try:
            return fn(*args, **kwargs)
        except MarinbuildError as e:
            if verbose:
                traceback.print_exc()
            err.print(f"marinbuild: error: {e}", markup=False)
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err.print("marinbuild: interrupted", markup=False)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except ImportError as e:
            extra = missing_extra(e)
            if extra is None:
                raise _internal_error(e, verbose) from None
            if verbose:
                traceback.print_exc()
            err.print(f"marinbuild: error: {extra}", markup=False)
            raise typer.Exit(extra.exit_code) from None
        except OSError as e:
            if not e.filename:
                raise _internal_error(e, verbose) from None
            # A prefix that is full, read-only or not ours: one line naming the path.
            if verbose:
                traceback.print_exc()
            err.print(f"marinbuild: error: {e.filename}: {e.strerror or e}", markup=False)
            raise typer.Exit(2) from None
        except Exception as e:
            raise _internal_error(e, verbose) from None

    return wrapper  # type: ignore[return-value]


def _internal_error(e: Exception, verbose: bool) -> typer.Exit:
    if verbose:
        traceback.print_exc()
    err.print(f"marinbuild: internal error: {type(e).__name__}: {e} (rerun with -v for details)", markup=False)
    return typer.Exit(1)


def _terminate_as_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@app.command()
@handles_errors
def run(
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
        machine=_machine(cores, mem, resources, token),
        cluster=cluster,
        settings=settings,
        explain=dry,
        dry=dry,
    )
    _print_notes(planned)
    if review is not None:
        from marinbuild.cli.reviewed import check_review

        check_review(review, planned.plan, project.graph, lambda line: err.print(line, markup=False))
    if dry:
        _print_plan(planned.plan, _with_environments(planned))
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
        on_output=_output_printer(json_events) if print_output else None,
        on_command=_command_printer(json_events) if print_commands else None,
    )
    if summary.interrupted:
        raise typer.Exit(130)
    if not summary.ok:
        raise typer.Exit(1)


def _output_printer(json_events: bool) -> Callable[[str, str], None]:
    """Where a step's printed lines go: ``[step] line`` on stdout, or JSON ``output`` events."""
    if json_events:
        def as_json(step: str, line: str) -> None:
            sys.stdout.write(json.dumps({"event": "output", "time": time.time(), "step": step, "line": line}) + "\n")
            sys.stdout.flush()

        return as_json
    return lambda step, line: out.print(f"[{step}] {line}", markup=False, highlight=False)


def _command_printer(json_events: bool) -> Callable[[str, str], None]:
    """``run -p``: each shell step's resolved command as it starts, ``[step] $ command``."""
    if json_events:
        def as_json(step: str, command: str) -> None:
            sys.stdout.write(json.dumps({"event": "command", "time": time.time(), "step": step, "command": command}) + "\n")
            sys.stdout.flush()

        return as_json
    return lambda step, command: out.print(f"[{step}] $ {command}", markup=False, highlight=False)


def _machine(cores: int | None, mem: str | None, resources: list[str] | None, tokens: list[str] | None) -> Machine:
    from marinbuild.execution.session import Machine

    return Machine(cores=cores, mem=mem, resources=tuple(resources or ()), tokens=tuple(tokens or ()))


def _reporter(quiet: bool, json_events: bool) -> Reporter:
    from marinbuild.cli.console import LineReporter, LiveReporter
    from marinbuild.execution.reporting import JsonReporter

    if json_events:
        return JsonReporter()
    if quiet or not out.console.is_terminal:
        return LineReporter(out.console, quiet=quiet)
    return LiveReporter(out.console)


def _print_notes(planned: Any) -> None:
    """What planning could not check, said once on stderr."""
    for note in planned.fields.notes if planned.fields is not None else ():
        err.print(f"marinbuild: note: {note}", markup=False)


def _with_environments(planned: Any) -> dict[str, object]:
    """The resources column, with the key of each step's Python environment after its request."""
    envs = planned.fields.environments if planned.fields is not None else {}
    return {n: f"{r} env={envs[n].short}" if n in envs else r for n, r in planned.requests.items()}


def _print_plan(plan: Plan, requests: Mapping[str, object]) -> None:
    """A rich table on a terminal; plain columns into a pipe or a file."""
    if not sys.stdout.isatty():
        from marinbuild.cli.plan_view import plan_text

        sys.stdout.write(plan_text(plan, requests))
        return
    from marinbuild.cli.console import plan_table

    out.print(plan_table(plan, requests))


@app.command()
@handles_errors
def plan(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    dry: Annotated[bool, typer.Option("--dry", "-n", "--dry-run", help="Accepted for habit: plan never runs anything.")] = True,
    check: Annotated[bool, typer.Option("--check", "-q", help="Print nothing; exit 1 when anything would run (like make -q).")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the plan as a JSON list.")] = False,
    dag: Annotated[DagFormat | None, typer.Option("--dag", case_sensitive=False, help="Print the graph for Graphviz or Mermaid.")] = None,
    force: ForceOpt = None,
    force_all: ForceAllOpt = False,
    cores: CoresOpt = None,
    mem: MemOpt = None,
    resources: ResourcesOpt = None,
    token: TokenOpt = None,
    cluster: ClusterOpt = None,
    output: Annotated[str | None, typer.Option("-o", "--output", help="Also write the plan to this file, for `marinbuild run --plan FILE`.")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Show what `run` would do, and why, without running or writing anything (but the -o file)."""
    from marinbuild.execution import session

    project = session.load(file, prefix=prefix)
    planned = session.plan_run(
        project,
        step_targets(project, targets),
        force=force or [],
        force_all=force_all,
        machine=_machine(cores, mem, resources, token),
        cluster=cluster,
        explain=not check,
    )
    _print_notes(planned)
    the_plan, requests = planned.plan, planned.requests
    environments = planned.fields.environments if planned.fields is not None else {}
    if output is not None:
        from marinbuild.plan_review import plan_document, write_plan_file

        write_plan_file(output, plan_document(the_plan, project.graph.prefix, force or [], force_all, project.marinfile.path))
    if check:
        raise typer.Exit(1 if the_plan.to_run() else 0)
    from marinbuild.cli import plan_notes

    for line in plan_notes.drift_lines(project, the_plan):
        err.print(f"marinbuild: {line}", markup=False)
    estimates = plan_notes.estimates(project, the_plan) if dag is None else {}
    if dag is DagFormat.dot:
        sys.stdout.write(dag_render.to_dot(the_plan))
    elif dag is DagFormat.mermaid:
        sys.stdout.write(dag_render.to_mermaid(the_plan))
    elif as_json:
        rows = [
            {
                "name": n,
                "identity": the_plan.node(n).identity,
                "output_path": the_plan.node(n).output_path,
                "action": the_plan.decisions[n].action.value,
                "reason": the_plan.decisions[n].reason,
                "dependencies": list(the_plan.node(n).deps),
                "resources": describe_request(requests[n]),
                "environment": environments[n].to_json() if n in environments else None,
                "estimate": _estimate_json(estimates, n),
            }
            for n in the_plan.order
        ]
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
    else:
        _print_plan(the_plan, _with_environments(planned))
        from marinbuild.cli.plan_view import columns_text

        for line in plan_notes.estimate_lines(estimates, columns_text):
            out.print(line, markup=False)
    if output is not None:
        err.print(f"marinbuild: plan written to {output}; run exactly it with: marinbuild run --plan {output}", markup=False)


def _estimate_json(estimates: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """A step's estimate in `plan --json`: null for a step that would not run or has no history."""
    found = estimates.get(name)
    return found.to_json() if found is not None else None


@app.command()
@handles_errors
def status(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON list.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Each step's stored status, output path and last duration."""
    project = open_project(file, prefix)
    graph = project.graph
    needed = closure(graph, select(graph, step_targets(project, targets)))  # once: per step it made status quadratic
    names = [n for n in graph.order if n in needed]
    leases: dict[str, Any] = {}
    problems: dict[str, str] = {}
    records = probe(project, names, leases, problems)  # the leases of RUNNING steps come with it
    # A marker that cannot be used is named, never fatal: the step is simply planned to run.
    problems.update({p: rec.error or p for p, rec in records.items() if rec.status == UNREADABLE})
    for line in sorted(set(problems.values())):
        err.print(f"marinbuild: warning: {line} (treated as unknown: the step will run)", markup=False)
    if leases:
        from marinbuild.store.lease import owner_alive

        # A lease whose runner exited on this machine is no one's: plan runs the step again.
        leases = {p: lease for p, lease in leases.items() if lease is None or owner_alive(lease.owner) is not False}
    rows: list[dict[str, Any]] = []
    for n in names:
        node = graph.nodes[n]
        rec = records.get(node.output_path)
        lease = leases.get(node.output_path)
        foreign = rec is not None and rec.mismatch is not None
        rows.append(
            {
                "name": n,
                "status": rec.status if rec and not foreign else "NONE",
                "output_path": node.output_path,
                "duration": rec.duration if rec and not foreign else None,
                "time": (rec.time or None) if rec and not foreign else None,
                "error": f"its output path holds the {rec.mismatch}" if rec and foreign else rec.error if rec else None,
                "lease": {"owner": str(lease.owner), "since": lease.acquired, "renewed": lease.renewed} if lease else None,
            }
        )
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=1) + "\n")
        return
    _print_status(rows)


def _print_status(rows: list[dict[str, Any]]) -> None:
    """Plain columns into a pipe or a file (never wrapped: `status | grep` sees whole paths); a table on a terminal."""
    with_lease = any(r["status"] == "RUNNING" for r in rows)
    with_error = any(r["error"] for r in rows)
    columns = ("step", "status", "duration", "finished", "output") + (("lease",) if with_lease else ()) + (
        ("error",) if with_error else ()
    )
    cells: list[tuple[str, ...]] = []
    for r in rows:
        dur = f"{r['duration']:.1f} s" if r["duration"] is not None else ""
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r["time"])) if r["time"] else ""
        row = [r["name"], r["status"], dur, when, r["output_path"]]
        if with_lease:
            row.append(_lease_text(r["lease"]) if r["status"] == "RUNNING" else "")
        if with_error:
            row.append((r["error"] or "").splitlines()[0] if r["error"] else "")
        cells.append(tuple(row))
    if not sys.stdout.isatty():
        from marinbuild.cli.plan_view import columns_text

        sys.stdout.write("".join(line + "\n" for line in columns_text([columns, *cells])))
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(show_edge=False)
    for col in columns:
        table.add_column(col, overflow="fold")
    colors = {"SUCCESS": "green", "FAILED": "red", "RUNNING": "cyan", "NONE": "dim"}
    for shown in cells:
        styled = [Text(c) for c in shown]
        styled[1].stylize(colors.get(shown[1], "white"))
        table.add_row(*styled)
    out.print(table)


def _lease_text(lease: dict[str, Any] | None) -> str:
    if lease is None:
        return "none: its runner is gone (the next run redoes it)"
    since = time.strftime("%H:%M:%S", time.localtime(lease["since"])) if lease["since"] else "?"
    renewed = time.strftime("%H:%M:%S", time.localtime(lease["renewed"])) if lease["renewed"] else "?"
    return f"{lease['owner']} since {since}, renewed {renewed}"


@app.command()
@handles_errors
def why(
    targets: Annotated[list[str], typer.Argument(help="The steps to explain: names, globs or output paths.")],
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Why steps would (or would not) run: a field-level diff against each one's last run."""
    project = open_project(file, prefix)
    names = select(project.graph, step_targets(project, targets))
    the_plan = plan_targets(project, list(names))
    index = RunIndex(project.storage, project.graph, list(names))
    for i, name in enumerate(names):
        if i:
            out.print("")
        _explain(project, name, the_plan.decisions[name], index)


def _headline(name: str, action: Action, reason: str) -> str:
    """The first line of `why`: the verdict, and the reason when it adds something.

    >>> _headline("a", Action.SKIP, "up to date"), _headline("b", Action.WAIT, "waiting: leased by h:1")
    ('a is up to date', 'b waits: leased by h:1')
    """
    if action is Action.SKIP:
        return f"{name} is up to date" + ("" if reason == "up to date" else f": {reason}")
    if action is Action.WAIT:
        return f"{name} waits: {reason.removeprefix('waiting: ')}"
    return f"{name} would run: {reason}"


def _explain(project: Project, name: str, decision: Decision, index: RunIndex) -> None:
    graph = project.graph
    node = graph.nodes[name]
    out.print(_headline(name, decision.action, decision.reason), markup=False)
    out.print(f"  identity {node.identity}  output {node.output_path}", markup=False)
    own = read_info(project.storage, node.output_path)
    from marinbuild.cli.plan_notes import why_extras

    if own is not None:
        out.print("  this identity ran before (same versioned values and dependencies)", markup=False)
        for line in why_extras(project, name, own, own=True):
            out.print(f"  {line}", markup=False)
        return
    info = earlier_info(project.storage, node, index)
    if info is None or not isinstance(info.get("identity_payload"), dict):
        out.print("  no earlier run of this step under the prefix", markup=False)
        return
    out.print(f"  compared with the earlier run at {info.get('output_path')}:", markup=False)
    changes = diff_payloads(info["identity_payload"], node.payload)
    for c in changes:
        out.print(f"  {c.line()}", markup=False)
    if not changes:
        out.print("  no field differs", markup=False)
    for line in why_extras(project, name, info, own=False):
        out.print(f"  {line}", markup=False)


@app.command()
@handles_errors
def clean(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    orphans: Annotated[bool, typer.Option("--orphans", help="Remove this Marinfile's outputs that no current step points to.")] = False,
    any_orphans: Annotated[bool, typer.Option("--any-orphans", help="Like --orphans, for every NAME-HASH output under the prefix, whichever Marinfile wrote it.")] = False,
    force: Annotated[bool, typer.Option("--force", help="Remove outputs even while a live runner holds their lease.")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask.")] = False,
    dry: Annotated[bool, typer.Option("--dry", "-n", "--dry-run", help="List what would be removed.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Delete the targets' current outputs, or (--orphans) outputs of old identities; running ones are left alone."""
    from marinbuild.store.clean import plan_clean, remove_output
    from marinbuild.store.index import forget

    project = open_project(file, prefix)
    storage = project.storage
    names = None if orphans or any_orphans else select(project.graph, step_targets(project, targets))
    chosen = plan_clean(storage, project.graph, names, project.marinfile.path, any_shape=any_orphans, force=force)
    for skipped in chosen.skipped:
        err.print(f"marinbuild: {skipped.line()}", markup=False)
    victims = chosen.remove
    if not victims:
        out.print("nothing to remove")
        return
    # Without a terminal to ask on, list what would go (nothing is removed) before refusing.
    cannot_ask = not dry and not yes and not sys.stdin.isatty()
    for p in victims:
        out.print(("would remove " if dry or cannot_ask else "remove ") + p, markup=False)
    if dry:
        return
    if cannot_ask:
        raise UserError(f"refusing to delete {len(victims)} output(s) without confirmation: nothing removed; pass --yes")
    if not yes and not typer.confirm(f"Remove {len(victims)} output(s)?"):
        err.print("marinbuild: nothing removed", markup=False)
        raise typer.Exit(1)
    # Their status summary entries go first (store/index.py): an entry outliving its folder
    # could be believed again if a runner re-created the folder and stopped at once. One
    # forgotten for a folder then left alone costs a marker read, never a wrong answer.
    forget(storage, victims)
    removed = 0
    for p in victims:
        why = remove_output(storage, p, force=force)
        if why is None:
            removed += 1
        else:
            err.print(f"marinbuild: leaving {p} alone: {why}", markup=False)
    out.print(f"removed {removed} output(s)")


def _command_names() -> frozenset[str]:
    return frozenset(c.name or c.callback.__name__ for c in app.registered_commands if c.callback is not None)


class _Commands:
    """The names of the registered commands (read when asked: modules register as they load)."""

    def __contains__(self, name: object) -> bool:
        return name in _command_names()


COMMANDS = _Commands()


# click's UsageError, whichever click typer runs on (its own copy or the package).
_UsageError: type[Exception] = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "UsageError")


def _bare_jobs(args: list[str]) -> list[str]:
    """``-j`` without a number, as make and Snakemake take it, becomes ``--jobs=0`` (all cores).

    >>> _bare_jobs(["run", "-j"]), _bare_jobs(["run", "-j", "train"]), _bare_jobs(["run", "-j", "4"])
    (['run', '--jobs=0'], ['run', '--jobs=0', 'train'], ['run', '-j', '4'])
    """
    out: list[str] = []
    for i, arg in enumerate(args):
        if arg == "--":
            return out + args[i:]
        following = args[i + 1] if i + 1 < len(args) else None
        if arg in ("-j", "--jobs") and (following is None or not following.isdigit()):
            out.append("--jobs=0")
        else:
            out.append(arg)
    return out


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``marinbuild`` console script (``argv``: instead of ``sys.argv[1:]``).

    Usage errors (an unknown option, a missing argument) get the same one line as every
    other bad input, instead of click's framed usage box.
    """
    # Loading a Marinfile allocates objects by the hundred thousand and frees almost none;
    # at the default thresholds the cyclic collector ran 256 times over a 10,000-step plan,
    # a sixth of its time. Collections stay, only rarer.
    gc.set_threshold(100_000, 50, 50)
    try:
        args = _bare_jobs(list(sys.argv[1:] if argv is None else argv))
        code = app(args=args, prog_name="marinbuild", standalone_mode=False)
    except _UsageError as error:
        e: Any = error  # click's UsageError: ctx, exit_code, format_message()
        if not e.format_message():  # bare `marinbuild`: the help was the answer
            sys.exit(e.exit_code)
        command = f" {e.ctx.command_path.split(' ', 1)[1]}" if e.ctx is not None and " " in e.ctx.command_path else ""
        err.print(f"marinbuild{command}: error: {e.format_message()} (see --help)", markup=False)
        sys.exit(2)
    except (KeyboardInterrupt, typer.Abort):
        err.print("marinbuild: interrupted", markup=False)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


import marinbuild.cli.env  # noqa: E402, F401  (registers `marinbuild env`)
from marinbuild.cli import logs, report, show  # noqa: E402, F401  (register `marinbuild logs`, `report`, `show`)
