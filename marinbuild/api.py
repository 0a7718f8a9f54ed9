"""marinbuild from Python: plan and run steps from a script or a notebook.

The command line is a thin layer over these functions; both go through
:mod:`marinbuild.execution.session`, so a step runs the same way from either.

A script can end with :func:`main` (the habit of Marin's ``executor_main``)::

    # exp.py
    import marinbuild
    from marinbuild import step, versioned

    data = step("data", cmd="seq {n} > {output}/numbers.txt", config={"n": versioned(10)})

    if __name__ == "__main__":
        marinbuild.main([data])      # python exp.py  |  python exp.py plan  |  python exp.py status
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from marinbuild.backends.retry_budgets import RetryBudgets
from marinbuild.execution.invocation import RunVoice, invoke
from marinbuild.execution.reporting import JsonReporter, NullReporter, PlainReporter, Reporter, json_step_lines
from marinbuild.execution.run_parameters import RunParameters
from marinbuild.execution.run_results import RunSummary
from marinbuild.execution.session import Machine, load, plan_run
from marinbuild.planner import Plan
from marinbuild.steps import Step, declaring

if TYPE_CHECKING:
    from marinbuild.cleanup import CleanResult
    from marinbuild.report.status import StatusReport

__all__ = ["clean", "main", "plan", "run", "status"]


def _targets(targets: str | Sequence[str] | None) -> list[str]:
    if targets is None:
        return []
    return [targets] if isinstance(targets, str) else list(targets)


def plan(
    targets: str | Sequence[str] | None = None,
    *,
    file: str = "Marinfile.py",
    steps: Sequence[Step] | None = None,
    prefix: str | None = None,
    force: Sequence[str] = (),
    force_all: bool = False,
    cores: int | None = None,
    mem: str | None = None,
    resources: Sequence[str] = (),
    tokens: Sequence[str] = (),
    cluster: str | None = None,
) -> Plan:
    """What a run would do, and why; reads the store, writes nothing.

    ``steps`` takes :class:`~marinbuild.Step` objects instead of a Marinfile (``file`` is then
    not read); ``targets`` are step names or globs (none: every step). The plan's ``graph`` is a
    ``networkx.DiGraph`` from each dependency to its dependants.

    >>> import marinbuild, tempfile
    >>> s = marinbuild.step("hello", cmd="echo hi > {output}/hi.txt")
    >>> p = marinbuild.plan(steps=[s], prefix=tempfile.mkdtemp())
    >>> p.order, p.decisions["hello"].action.value
    (('hello',), 'run')
    """
    project = load(file, steps, prefix)
    machine = Machine(cores=cores, mem=mem, resources=tuple(resources), tokens=tuple(tokens))
    planned = plan_run(project, _targets(targets), force=force, force_all=force_all, machine=machine, cluster=cluster)
    return planned.plan


def status(
    targets: str | Sequence[str] | None = None,
    *,
    file: str = "Marinfile.py",
    steps: Sequence[Step] | None = None,
    prefix: str | None = None,
) -> StatusReport:
    """Each step's stored status, as ``marinbuild status`` prints it; reads the store, writes nothing.

    ``targets`` are step names, globs or output paths (none: every step); the report has a row
    per target and per step it needs, in graph order (see
    :class:`~marinbuild.report.status.StepStatus`; ``to_json()`` is what ``status --json`` prints).

    >>> import marinbuild, tempfile
    >>> s = marinbuild.step("hello", cmd="echo hi > {output}/hi.txt")
    >>> [(r.name, r.status) for r in marinbuild.status(steps=[s], prefix=tempfile.mkdtemp()).rows]
    [('hello', 'NONE')]
    """
    from marinbuild.project import step_targets
    from marinbuild.report.status import status_rows

    project = load(file, steps, prefix)
    return status_rows(project, step_targets(project, _targets(targets)))


def clean(
    targets: str | Sequence[str] | None = None,
    *,
    file: str = "Marinfile.py",
    steps: Sequence[Step] | None = None,
    prefix: str | None = None,
    orphans: bool = False,
    any_orphans: bool = False,
    force: bool = False,
    outside_prefix: bool = False,
    dry: bool = False,
) -> CleanResult:
    """Remove the targets' current outputs, or (``orphans``) outputs of old identities, without asking.

    Like ``marinbuild clean --yes``, with its options as keywords of the same name: running
    steps' outputs are left alone unless ``force``; ``dry`` removes nothing and returns the
    outputs it would remove in ``would_remove``. What was left alone is in ``skipped``, with why.

    >>> import marinbuild, tempfile
    >>> s = marinbuild.step("hello", cmd="echo hi > {output}/hi.txt")
    >>> prefix = tempfile.mkdtemp()
    >>> _ = marinbuild.run(steps=[s], prefix=prefix, quiet=True)
    >>> len(marinbuild.clean(steps=[s], prefix=prefix, dry=True).would_remove)
    1
    """
    from marinbuild.cleanup import clean_project
    from marinbuild.project import step_targets

    if not dry:
        from marinbuild.store.storage import check_writable_prefix

        check_writable_prefix(prefix)  # a read-only prefix: one line, before anything is read
    project = load(file, steps, prefix)
    return clean_project(project, step_targets(project, _targets(targets)), orphans=orphans, any_orphans=any_orphans,
                         force=force, outside_prefix=outside_prefix, dry=dry)


def run(
    targets: str | Sequence[str] | None = None,
    *,
    file: str = "Marinfile.py",
    steps: Sequence[Step] | None = None,
    prefix: str | None = None,
    jobs: int | None = None,
    keep_going: bool = False,
    force: Sequence[str] = (),
    force_all: bool = False,
    dry: bool = False,
    print_output: bool | None = None,
    json: bool = False,
    cores: int | None = None,
    mem: str | None = None,
    resources: Sequence[str] = (),
    token: Sequence[str] = (),
    walltime: str | None = None,
    backend: str | None = None,
    ray_address: str | None = None,
    lease_heartbeat: float | None = None,
    lease_expiry: float | None = None,
    fresh_output: bool = False,
    keep_output: bool = False,
    cluster: str | None = None,
    max_retries_preemption: int = RetryBudgets.preemption,
    max_retries_failure: int = RetryBudgets.failure,
    max_retries_hang: int = RetryBudgets.hang,
    no_sync: bool = False,
    allow_cross_region: bool = False,
    plan: str | None = None,
    print_commands: bool = False,
    wide: bool = False,
    strict_outputs: bool = False,
    list: bool = False,
    quiet: bool = False,
    verbose: bool = False,
    reporter: Reporter | None = None,
) -> RunSummary:
    """Run the targets and whatever they need that is not up to date; returns what happened.

    Takes every option of ``marinbuild run`` as a keyword of the same name (``--lease-heartbeat``
    is ``lease_heartbeat``, ``--plan FILE`` is ``plan="FILE"``, ``--token`` is ``token``;
    :class:`~marinbuild.execution.run_parameters.RunParameters` documents each). ``backend``:
    ``"local"``, ``"ray"``, ``"slurm"`` or a kind registered with
    :func:`marinbuild.backends.registry.register`, default the Marinfile's ``DEFAULT_BACKEND``,
    else local.
    Progress, what steps print (``print_output``) and their commands (``print_commands``) go to
    stderr as plain lines, unless ``quiet`` or another ``reporter`` is given; ``json`` writes
    the events as JSON lines on stdout. ``dry`` starts nothing: the summary lists the steps that
    would run as not started. Bad input raises :class:`~marinbuild.MarinbuildError`; a failed
    step does not raise: the summary says so.

    >>> import marinbuild, tempfile
    >>> s = marinbuild.step("hello", cmd="echo hi > {output}/hi.txt")
    >>> summary = marinbuild.run(steps=[s], prefix=tempfile.mkdtemp(), quiet=True)
    >>> summary.ok, summary.steps["hello"].outcome.value
    (True, 'ran')
    """
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
    return invoke(params, _voice(params, reporter), steps)


def _voice(params: RunParameters, reporter: Reporter | None) -> RunVoice:
    """The library prints on stderr (stdout is the script's), JSON events on stdout."""

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    def step_line(event: str, template: str) -> Callable[[str, str], None]:
        if params.json:
            return json_step_lines(event, sys.stdout)
        return lambda step, text: say(template.format(step=step, text=text))

    if reporter is None and params.json:
        reporter = JsonReporter(sys.stdout)
    elif reporter is None and not params.quiet:
        reporter = PlainReporter(sys.stderr)
    quiet = params.quiet or params.json
    return RunVoice(
        reporter=(lambda: reporter) if reporter is not None else NullReporter,
        echo=(lambda line: None) if quiet else say,
        warn=say,
        on_output=step_line("output", "[{step}] {text}") if params.prints_output else None,
        on_command=step_line("command", "[{step}] $ {text}") if params.print_commands else None,
    )


def main(steps: Sequence[Step], argv: Sequence[str] | None = None) -> None:
    """The ``marinbuild`` command line over ``steps``, for a script run as ``python exp.py``.

    ``python exp.py`` runs the steps like ``marinbuild run``; ``python exp.py plan``,
    ``status``, ``why``, ``clean`` … take the same options as the command line (``-f`` is not
    needed: the steps are the script's). While the script is loaded as a Marinfile (by
    ``marinbuild -f exp.py`` or on a remote host), this does nothing: the steps are declared.
    Exits like the command line does.
    """
    if declaring():
        return
    from marinbuild.cli.app import COMMANDS, command_line
    from marinbuild.project import steps_instead_of_marinfile

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] not in COMMANDS and args[0] not in ("--help", "--version")):
        args.insert(0, "run")
    with steps_instead_of_marinfile(steps):
        command_line(args)
