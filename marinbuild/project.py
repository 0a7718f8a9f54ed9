"""From a Marinfile on disk to a plan: the steps every command shares.

``run``, ``plan``, ``status``, ``why`` and ``clean`` all go through :func:`open_project`
and :func:`plan_targets`, so a step is judged the same way by every command.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from types import ModuleType

from marinbuild.graph import StepGraph, build_graph
from marinbuild.marinfile import Marinfile, load_marinfile
from marinbuild.planner import Plan, closure, make_plan, select
from marinbuild.staleness import Decision
from marinbuild.steps import Step
from marinbuild.store.history import explain_new_steps
from marinbuild.store.markers import RUNNING, StatusRecord, read_statuses
from marinbuild.store.storage import Storage, resolve_prefix

__all__ = ["Project", "open_project", "plan_targets", "probe", "project_of_steps", "steps_instead_of_marinfile"]


@dataclass(frozen=True)
class Project:
    """A loaded Marinfile, its step graph, and the store under its prefix."""

    marinfile: Marinfile
    graph: StepGraph
    storage: Storage

    @property
    def workdir(self) -> str:
        return os.path.dirname(self.marinfile.path)


_script_steps: contextvars.ContextVar[tuple[Step, ...] | None] = contextvars.ContextVar("script_steps", default=None)


@contextlib.contextmanager
def steps_instead_of_marinfile(steps: Sequence[Step]) -> Iterator[None]:
    """Within this block every command opens ``steps`` instead of reading a Marinfile."""
    token = _script_steps.set(tuple(steps))
    try:
        yield
    finally:
        _script_steps.reset(token)


def open_project(file: str, prefix: str | None) -> Project:
    """Load ``file`` and build its graph under the resolved prefix (nothing is written).

    Inside :func:`steps_instead_of_marinfile` (``marinbuild.main``) the script's steps stand in
    for the Marinfile.
    """
    given = _script_steps.get()
    if given is not None:
        return project_of_steps(given, prefix)
    marinfile = load_marinfile(file)
    resolved = resolve_prefix(prefix)
    graph = build_graph(marinfile.steps, resolved)
    return Project(marinfile, graph, Storage.for_prefix(resolved))


def project_of_steps(steps: Sequence[Step], prefix: str | None) -> Project:
    """A project of steps made by a script instead of a Marinfile (``marinbuild.run(steps=...)``).

    The script that made them (``__main__``) stands in for the Marinfile: its folder is the
    working directory, and remote hosts load it by path to find function steps.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or os.path.join(os.getcwd(), "<steps>")
    marinfile = Marinfile(path=os.path.abspath(path), steps=tuple(steps), module=main or ModuleType("__main__"))
    resolved = resolve_prefix(prefix)
    return Project(marinfile, build_graph(marinfile.steps, resolved), Storage.for_prefix(resolved))


def probe(project: Project, names: Sequence[str] | set[str]) -> dict[str, StatusRecord]:
    """Stored status of the named steps, keyed by output path, in one batched read.

    A listing of each parent directory first rules out steps that never ran, so a fresh
    plan reads no marker at all (on GCS a listing answers for up to 1,000 entries). The
    leases of RUNNING steps are then read in one more batch: a step with a live lease is
    marked ``leased_by`` its holder.
    """
    graph, storage = project.graph, project.storage
    outputs = [graph.nodes[n].output_path for n in names]
    present: dict[str, set[str]] = {}
    kept = []
    for out in outputs:
        # Output paths are normalized (no trailing "/"); os.path.split costs 3x as much.
        folder, _, base = out.rpartition("/")
        if not folder and out.startswith("/"):
            folder = "/"
        if folder not in present:
            present[folder] = set(storage.list_names(folder))
        if base in present[folder]:
            kept.append(out)
    statuses = read_statuses(storage, kept, {graph.nodes[n].output_path: graph.nodes[n].identity for n in names} if kept else None)
    running = [out for out, record in statuses.items() if record.status == RUNNING]
    if not running:
        return statuses
    from marinbuild.store.lease import owner_alive, read_leases  # leases matter only when a step may be running

    for out, lease in read_leases(storage, running).items():
        if lease is not None and owner_alive(lease.owner) is not False:
            statuses[out] = replace(statuses[out], leased_by=lease.describe())
    return statuses


def plan_targets(
    project: Project,
    targets: Sequence[str],
    force: Sequence[str] = (),
    force_all: bool = False,
    explain: bool = True,
) -> Plan:
    """Select targets, read their statuses and decide; reasons name changed fields."""
    graph = project.graph
    chosen = select(graph, targets)
    statuses = probe(project, closure(graph, chosen))
    plan = make_plan(graph, chosen, statuses, force, force_all)
    if not explain:
        return plan
    fresh = [n for n in plan.order if plan.decisions[n].reason == "new"]
    changes = explain_new_steps(project.storage, graph, fresh) if fresh else {}
    if not changes:
        return plan
    decisions = dict(plan.decisions)
    for name, reason in changes.items():
        decisions[name] = Decision(decisions[name].action, reason)
    return Plan(plan.graph, plan.targets, plan.order, decisions)
