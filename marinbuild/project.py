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
from typing import TYPE_CHECKING

from marinbuild.graph import StepGraph, StepNode, build_graph
from marinbuild.history import explain_new_steps
from marinbuild.input_times import rerun_inputs
from marinbuild.marinfile import Marinfile, load_marinfile
from marinbuild.planner import Plan, closure, make_plan, select
from marinbuild.staleness import Decision
from marinbuild.steps import Step
from marinbuild.store.index import index_of
from marinbuild.store.marker_snapshot import MarkerSnapshot, snapshot_for
from marinbuild.store.markers import RUNNING, STATUS_IN_OUTPUT, StatusRecord, read_statuses
from marinbuild.store.storage import Storage, resolve_prefix

if TYPE_CHECKING:
    from marinbuild.store.lease import LeaseRecord

__all__ = ["Project", "open_project", "plan_targets", "probe", "project_of_steps", "step_targets", "steps_instead_of_marinfile"]


@dataclass(frozen=True)
class Project:
    """A loaded Marinfile, its step graph, and the store under its prefix."""

    marinfile: Marinfile
    graph: StepGraph
    storage: Storage
    markers: MarkerSnapshot | None = None
    """On local disk, the stat-checked snapshot of the status markers that :func:`probe` reads
    through; ``run`` saves it once planned (see :mod:`marinbuild.store.marker_snapshot`)."""

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
    return _project(marinfile, graph, resolved)


def project_of_steps(steps: Sequence[Step], prefix: str | None) -> Project:
    """A project of steps made by a script instead of a Marinfile (``marinbuild.run(steps=...)``).

    The script that made them (``__main__``) stands in for the Marinfile: its folder is the
    working directory, and remote hosts load it by path to find function steps.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None) or os.path.join(os.getcwd(), "<steps>")
    marinfile = Marinfile(path=os.path.abspath(path), steps=tuple(steps), module=main or ModuleType("__main__"))
    resolved = resolve_prefix(prefix)
    return _project(marinfile, build_graph(marinfile.steps, resolved), resolved)


def _project(marinfile: Marinfile, graph: StepGraph, prefix: str) -> Project:
    storage = Storage.for_prefix(prefix)
    return Project(marinfile, graph, storage, snapshot_for(storage))


def probe(
    project: Project,
    names: Sequence[str] | set[str],
    leases: dict[str, LeaseRecord | None] | None = None,
    problems: dict[str, str] | None = None,
    listed: dict[str, set[str]] | None = None,
) -> dict[str, StatusRecord]:
    """Stored status of the named steps, keyed by output path, in a few batched requests.

    1. A listing of each parent folder rules out steps that never ran: a fresh plan reads
       no marker at all (on GCS a listing answers for up to 1,000 entries). Where the summary
       is kept, the listing is of the status markers themselves (``FOLDER/*/.marinbuild/status``,
       one ``matchGlob`` listing on GCS): an output folder or a marker deleted by hand rules
       its step out even though its summary entry stays.
    2. One listing of the status summary (:mod:`marinbuild.store.index`) gives the status
       of every step whose lone, sound entry names its identity.
    3. The markers of the others (no entry, two entries, a FAILED one) are read in one batch.
    4. The leases of RUNNING steps are read in one batch: a step with a live lease is marked
       ``leased_by`` its holder; one whose RUNNING came from the summary without a live lease
       has its marker read after all, since the summary may be behind it.

    ``leases``, when given, receives the lease read for each step left RUNNING (None where
    unreadable) and ``problems`` a line for each unusable lease, so that ``status`` need not
    read them again; ``listed`` receives the listing of each parent folder (folder -> names;
    where the summary is kept, only the outputs holding a status marker).
    """
    graph, storage = project.graph, project.storage
    nodes = [graph.nodes[n] for n in names]
    kept = _listed_outputs(storage, nodes, listed if listed is not None else {})
    summary = index_of(storage)
    # On local disk every marker is read (a few microseconds each): a marker edited or removed
    # by hand must count, and be named when it cannot be read; the summary saves round trips.
    # It is listed even when no step ran, so that a run writes each RUNNING marker together
    # with its summary entry instead of after it (see store/index.py).
    seen = summary.read() if storage.keeps_summary else {}
    if not kept:
        return {}
    identities = {node.output_path: node.identity for node in nodes}
    statuses: dict[str, StatusRecord] = {}
    unknown = []
    for node in kept:
        record = summary.believed(seen, node.output_path, node.identity) if seen else None
        if record is None:
            unknown.append(node.output_path)
        else:
            statuses[node.output_path] = record
    if unknown:
        markers = project.markers
        if markers is not None:
            statuses.update(markers.read_statuses(storage, unknown, identities))
        else:
            statuses.update(read_statuses(storage, unknown, identities))
    running = [out for out, record in statuses.items() if record.status == RUNNING]
    if not running:
        return statuses
    found = _backed_by_leases(storage, statuses, running, set(unknown), identities, problems)
    if leases is not None:
        leases.update((out, found[out]) for out in running if out in found and statuses.get(out, _NONE).status == RUNNING)
    return statuses


def _listed_outputs(storage: Storage, nodes: Sequence[StepNode], present: dict[str, set[str]]) -> list[StepNode]:
    """Step 1 of :func:`probe`: the nodes whose output a listing of its parent folder shows (``present`` fills in)."""
    keeps_summary = storage.keeps_summary
    kept = []
    for node in nodes:
        out = node.output_path
        # Output paths are normalized (no trailing "/"); os.path.split costs 3x as much.
        folder, _, base = out.rpartition("/")
        if not folder and out.startswith("/"):
            folder = "/"
        if folder not in present:
            present[folder] = set(storage.list_holding(folder, STATUS_IN_OUTPUT) if keeps_summary
                                  else storage.list_names(folder))
        if base in present[folder]:
            kept.append(node)
    return kept


def _backed_by_leases(
    storage: Storage,
    statuses: dict[str, StatusRecord],
    running: list[str],
    from_markers: set[str],
    identities: dict[str, str],
    problems: dict[str, str] | None,
) -> dict[str, LeaseRecord | None]:
    """Step 4 of :func:`probe`: mark each RUNNING step ``leased_by`` its live lease; a RUNNING from the
    summary (not in ``from_markers``) without one has its marker read after all. Returns the leases read."""
    from marinbuild.store.lease import owner_alive, read_leases  # leases matter only when a step may be running

    unbacked = []
    found = read_leases(storage, running, problems)
    for out in running:
        lease = found.get(out)
        if lease is not None and owner_alive(lease.owner) is not False:
            statuses[out] = replace(statuses[out], leased_by=lease.describe())
        elif out not in from_markers:
            unbacked.append(out)
    if unbacked:
        for out in unbacked:
            del statuses[out]  # the marker says, and a missing one means no status at all
        statuses.update(read_statuses(storage, unbacked, identities))
    return found


_NONE = StatusRecord("NONE", 0.0)


def _rerun_inputs(project: Project, names: set[str], statuses: dict[str, StatusRecord]) -> dict[str, str]:
    """Finished steps whose dependency was rerun since they ran (see :mod:`marinbuild.input_times`).

    Where the summary's digest differs, the markers say which dependency: read in one batch,
    and kept in ``statuses``.
    """
    rerun, unsure = rerun_inputs(project.graph, names, statuses)
    if not unsure:
        return rerun
    nodes = project.graph.nodes
    identities = {nodes[n].output_path: nodes[n].identity for n in names}
    statuses.update(read_statuses(project.storage, unsure, {o: identities[o] for o in unsure if o in identities}))
    return rerun_inputs(project.graph, names, statuses)[0]


def plan_targets(
    project: Project,
    targets: Sequence[str],
    force: Sequence[str] = (),
    force_all: bool = False,
    explain: bool = True,
    fresh_output: bool = False,
) -> Plan:
    """Select targets, read their statuses and decide; reasons name changed fields.

    ``fresh_output``: failed steps will start over (``run --fresh-output``), not resume.
    """
    graph = project.graph
    chosen = select(graph, targets)
    listed: dict[str, set[str]] = {}
    needed = closure(graph, chosen)
    statuses = probe(project, needed, listed=listed)
    rerun = _rerun_inputs(project, needed, statuses)
    plan = make_plan(graph, chosen, statuses, force, force_all, rerun, fresh_output)
    if not explain:
        return plan
    fresh = [n for n in plan.order if plan.decisions[n].reason == "new"]
    changes = explain_new_steps(project.storage, graph, fresh, listed) if fresh else {}
    if not changes:
        return plan
    decisions = dict(plan.decisions)
    for name, reason in changes.items():
        decisions[name] = Decision(decisions[name].action, reason)
    return replace(plan, decisions=decisions)


def step_targets(project: Project, targets: Sequence[str] | None) -> list[str]:
    """The targets as step names or globs: an output path (``marinbuild-out/data-1f0e…``, or a
    file inside one) stands for the step writing it; anything else is left for ``select``."""
    wanted = list(targets or [])
    nodes = project.graph.nodes
    looks_like_path = [t for t in wanted if t not in nodes and ("/" in t or os.sep in t) and not any(c in t for c in "*?[")]
    if not looks_like_path:
        return wanted
    by_output = {node.output_path.rstrip("/"): name for name, node in nodes.items()}
    out: list[str] = []
    for t in wanted:
        if t in looks_like_path:
            path = project.storage.user_path(t)
            while path and path not in by_output and os.path.dirname(path) != path:
                path = os.path.dirname(path)  # a file inside an output names its step too
            t = by_output.get(path, t)
        out.append(t)
    return out
