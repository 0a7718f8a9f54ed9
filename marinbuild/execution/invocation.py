"""A run as asked for: every option of ``marinbuild run`` and :func:`marinbuild.run` in one value,
and the one function that carries it out.

The command line and the library both build a :class:`RunParameters` from their keywords and
call :func:`invoke`; they differ only in how they print (a :class:`RunVoice`). Their option
lists are the dataclass's fields, so they cannot drift (``tests/unit/execution/test_invocation.py``
compares ``marinbuild run --help`` with :func:`marinbuild.run`'s keywords).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from marinbuild.errors import UserError
from marinbuild.execution.reporting import NullReporter, Reporter
from marinbuild.execution.run_parameters import RunParameters
from marinbuild.execution.run_results import RunSummary, StepOutcome, StepResult
from marinbuild.execution.session import PlannedRun, execute, load, load_run_modules, plan_run

if TYPE_CHECKING:
    from marinbuild.graph import StepGraph
    from marinbuild.plan_review import Reviewed
    from marinbuild.planner import Plan
    from marinbuild.project import Project
    from marinbuild.steps import Step

__all__ = ["RunVoice", "check_review", "invoke", "load_review"]

def _quiet(line: str) -> None:
    pass


@dataclass(frozen=True)
class RunVoice:
    """How a front end prints a run: the command line on a terminal, the library on stderr."""

    reporter: Callable[[], Reporter] = NullReporter
    """Makes the reporter of the run's events, once steps are about to start: a run with
    nothing to do prints no event, and need not import the terminal's console for them."""
    echo: Callable[[str], None] = _quiet
    """Lines for the user beside the events ("nothing to do", what remote hosts say)."""
    warn: Callable[[str], None] = _quiet
    """Lines for stderr: planning notes, a reviewed plan's differences."""
    on_output: Callable[[str, str], None] | None = None
    on_command: Callable[[str, str], None] | None = None
    show_plan: Callable[[PlannedRun], None] = lambda planned: None
    """A dry run's plan."""
    planned: Callable[[PlannedRun], None] = lambda planned: None
    """Every run's plan, once made (the command line's live view estimates the time left from it)."""
    starting: Callable[[], None] = lambda: None
    """Called once the run is about to start steps (the command line maps SIGTERM then)."""


def invoke(
    params: RunParameters,
    voice: RunVoice,
    steps: Sequence[Step] | None = None,
    target_names: Callable[[Project, Sequence[str]], list[str]] | None = None,
) -> RunSummary:
    """Plan and run ``params``; returns what happened (a failed step does not raise).

    ``steps`` instead of the Marinfile; ``target_names`` turns the targets into step names or
    globs (the command line's output paths). A dry run starts nothing: its summary lists the
    steps it would run as not started.
    """
    _check_before_loading(params)
    project = load(params.file, steps, params.prefix)
    targets, force, force_all = list(params.targets), list(params.force), params.force_all
    if params.list:
        _list_steps(project, targets, target_names, voice)
        return RunSummary({})
    review = None
    if params.plan is not None:
        review = load_review(params.plan, targets, force, force_all)
        targets, force, force_all = list(review.targets), list(review.force), review.force_all
        check_names(review, project.graph, voice.warn)
    planned = plan_run(
        project,
        target_names(project, targets) if target_names is not None else targets,
        force=force,
        force_all=force_all,
        machine=params.machine,
        cluster=params.cluster,
        settings=params,
        explain=params.dry,
        dry=params.dry,
    )
    voice.planned(planned)
    for note in planned.fields.notes if planned.fields is not None else ():
        voice.warn(f"marinbuild: note: {note}")
    if review is not None:
        check_review(review, planned.plan, project.graph, voice.warn)
    _say_drift(planned, voice)
    if params.dry:
        voice.show_plan(planned)
        return _not_started(planned.plan)
    if project.markers is not None:
        project.markers.save()  # what this plan parsed, for the next one to trust while unchanged
    if not planned.plan.to_run():
        n = len(planned.plan.order)
        voice.echo(f"nothing to do: {n} step{'' if n == 1 else 's'} up to date")
        return execute(planned, params)
    from marinbuild.store.storage import prepare_prefix

    reporter = voice.reporter()
    load_run_modules()
    prepare_prefix(project.storage, params.prefix)
    voice.starting()
    return execute(
        planned, params, reporter, echo=voice.echo, on_output=voice.on_output, on_command=voice.on_command,
        warn=voice.warn,
    )


def _check_before_loading(params: RunParameters) -> None:
    """Refuse, in one line, what no Marinfile can make right: a bad ``--walltime``, a prefix that cannot be written."""
    if params.walltime is not None:
        from marinbuild.units import parse_duration

        # Refused as --cores 0 is, dry or not, with work or without: a cron job must not pass
        # until the day there is work to do.
        parse_duration(params.walltime)
    if not params.dry:
        from marinbuild.store.storage import check_writable_prefix

        check_writable_prefix(params.prefix)  # one line before the Marinfile loads, even with nothing to do


def _list_steps(project: Project, targets: Sequence[str],
                target_names: Callable[[Project, Sequence[str]], list[str]] | None, voice: RunVoice) -> None:
    """``run --list``: the names of the steps the targets select (every step without targets), in plan order."""
    from marinbuild.planner import select

    chosen = set(select(project.graph, target_names(project, targets) if target_names else targets)) if targets else None
    for name in project.graph.order:
        if chosen is None or name in chosen:
            voice.echo(name)


def _say_drift(planned: PlannedRun, voice: RunVoice) -> None:
    """What ``plan`` notes of the up-to-date steps (a changed command, function or plain field), said once
    before the run starts or says it has nothing to do."""
    from marinbuild.drift import drift_note_lines
    from marinbuild.staleness import Action

    plan = planned.plan
    kept = [n for n in plan.order if plan.decisions[n].action is Action.SKIP]
    for line in drift_note_lines(planned.project.storage, planned.project.graph, kept, plan.statuses):
        voice.warn(f"marinbuild: {line}")


def _not_started(plan: Plan) -> RunSummary:
    to_run = set(plan.to_run())
    return RunSummary(
        {
            n: StepResult(n, StepOutcome.NOT_STARTED if n in to_run else StepOutcome.SKIPPED, plan.node(n).output_path)
            for n in plan.order
        }
    )


def load_review(path: str, targets: Sequence[str] | None, force: Sequence[str] | None, force_all: bool) -> Reviewed:
    """Read the plan file; the targets and forced steps come from it, so none may be given beside it."""
    from marinbuild.plan_review import read_plan_file

    if targets or force or force_all:
        raise UserError("--plan runs the targets and forced steps written in the plan file; give no targets, --force or -F with it")
    return read_plan_file(path)


def check_names(reviewed: Reviewed, graph: StepGraph, say: Callable[[str], None]) -> None:
    """Refuse, as a plan that no longer holds, a reviewed plan naming steps the Marinfile no longer has.

    A step renamed or removed since the review is the plan going stale, not a typo to
    correct: each is named, and nothing runs.
    """
    import fnmatch

    names = graph.nodes
    gone = [n for n in reviewed.steps if n not in names]
    for pattern in (*reviewed.targets, *reviewed.force):
        globbed = any(c in pattern for c in "*?[")
        if pattern not in names and pattern not in gone and not (globbed and fnmatch.filter(names, pattern)):
            gone.append(pattern)
    if not gone:
        return
    for name in gone:
        say(f"marinbuild: differs from the plan: {name}: in the plan, but no longer a step of the Marinfile (renamed or removed)")
    raise UserError(
        f"the reviewed plan no longer holds: {', '.join(gone[:3])}{' …' if len(gone) > 3 else ''} "
        f"{'is' if len(gone) == 1 else 'are'} no longer in the Marinfile; nothing was run: plan again and review it"
    )


def check_review(reviewed: Reviewed, plan: Plan, graph: StepGraph, say: Callable[[str], None]) -> None:
    """Refuse (printing each difference) unless ``plan`` is the reviewed plan, less steps finished meanwhile."""
    from marinbuild.plan_review import differences, finished_meanwhile

    if reviewed.prefix is not None and reviewed.prefix != graph.prefix:
        say(f"marinbuild: the plan was made for the prefix {reviewed.prefix}, this run's is {graph.prefix}")
        raise UserError(f"the plan in {reviewed.path} is for another prefix; nothing was run")
    found = differences(reviewed, plan, graph)
    if found:
        for line in found:
            say(f"marinbuild: differs from the plan: {line}")
        n = len(found)
        raise UserError(
            f"the plan in {reviewed.path} no longer holds ({n} difference{'' if n == 1 else 's'}); nothing was run: "
            "plan again and review it"
        )
    for name in finished_meanwhile(reviewed, plan):
        say(f"marinbuild: {name}: finished by another runner since the plan was made; skipped")
