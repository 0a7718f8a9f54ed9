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
from collections.abc import Sequence

from marinbuild.execution.reporting import PlainReporter, Reporter
from marinbuild.execution.session import Machine, RunSettings, RunSummary, execute, load, plan_run
from marinbuild.planner import Plan
from marinbuild.steps import Step, declaring

__all__ = ["main", "plan", "run"]


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


def run(
    targets: str | Sequence[str] | None = None,
    *,
    file: str = "Marinfile.py",
    steps: Sequence[Step] | None = None,
    prefix: str | None = None,
    jobs: int | None = None,
    keep_going: bool = False,
    backend: str | None = None,
    force: Sequence[str] = (),
    force_all: bool = False,
    cores: int | None = None,
    mem: str | None = None,
    resources: Sequence[str] = (),
    tokens: Sequence[str] = (),
    cluster: str | None = None,
    ray_address: str | None = None,
    fresh_output: bool = False,
    max_retries_preemption: int = 100,
    max_retries_failure: int = 0,
    walltime: str | None = None,
    reporter: Reporter | None = None,
    quiet: bool = False,
) -> RunSummary:
    """Run the targets and whatever they need that is not up to date; returns what happened.

    Takes the options of ``marinbuild run`` as keywords (``backend``: ``"local"`` or ``"ray"``;
    default the Marinfile's ``DEFAULT_BACKEND``, else local). Progress goes to stderr as plain
    lines unless ``quiet`` or another ``reporter`` is given. Bad input raises
    :class:`~marinbuild.MarinbuildError`; a failed step does not raise: the summary says so.

    >>> import marinbuild, tempfile
    >>> s = marinbuild.step("hello", cmd="echo hi > {output}/hi.txt")
    >>> summary = marinbuild.run(steps=[s], prefix=tempfile.mkdtemp(), quiet=True)
    >>> summary.ok, summary.steps["hello"].outcome.value
    (True, 'ran')
    """
    settings = RunSettings(
        jobs=jobs,
        keep_going=keep_going,
        backend=backend,
        ray_address=ray_address,
        fresh_output=fresh_output,
        max_retries_preemption=max_retries_preemption,
        max_retries_failure=max_retries_failure,
        walltime=walltime,
    )
    project = load(file, steps, prefix)
    machine = Machine(cores=cores, mem=mem, resources=tuple(resources), tokens=tuple(tokens))
    planned = plan_run(
        project,
        _targets(targets),
        force=force,
        force_all=force_all,
        machine=machine,
        cluster=cluster,
        settings=settings,
        dry=False,
    )
    if reporter is None and not quiet:
        reporter = PlainReporter(sys.stderr)
    return execute(planned, settings, reporter, echo=lambda line: print(line, file=sys.stderr))


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
    from marinbuild.cli.app import COMMANDS
    from marinbuild.cli.app import main as cli_main
    from marinbuild.project import steps_instead_of_marinfile

    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] not in COMMANDS and args[0] not in ("--help", "--version")):
        args.insert(0, "run")
    with steps_instead_of_marinfile(steps):
        cli_main(args)
