"""Which finished steps read a dependency output that was rewritten since: make's newer prerequisite.

Each ``SUCCESS`` marker records the ``SUCCESS`` time of every dependency its run read
(``inputs``; the status summary carries a digest of them). A step stays up to date while
each dependency still holds that ``SUCCESS``. It is planned to run again when one holds
another ``SUCCESS`` (it was rerun, by ``--force`` or otherwise) or a status that is not
``SUCCESS`` (a rerun that failed, or was interrupted, has begun rewriting it), and so is
everything downstream of it that read the old outputs. Times are compared for equality,
never for order, so hosts' clocks need not agree.

A dependency with no status at all (its output cleaned away), an unreadable one or one
written for another identity changes nothing: the step's identity already covers it. Markers written before the record existed name no inputs and
are taken as up to date.

Pure: works on statuses already read. Where the summary's digest differs and no marker
was read, :func:`rerun_inputs` names the outputs whose markers it needs (a round trip on a
remote store, only for steps something changed under).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from marinbuild.graph import StepGraph
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord, inputs_digest

__all__ = ["rerun_inputs"]


def rerun_inputs(
    graph: StepGraph, names: Iterable[str], statuses: Mapping[str, StatusRecord]
) -> tuple[dict[str, str], list[str]]:
    """Steps among ``names`` whose inputs were rewritten since they ran, with the reason; and the
    output paths whose markers must be read before that can be told (summary records only).

    ``statuses`` maps output paths to the stored status (as :func:`marinbuild.project.probe`
    reads them). ``names`` is walked in the graph's topological order, so that a step
    downstream of a stale one is stale too (``upstream X rerun since this step ran``).
    """
    nodes = graph.nodes
    wanted = set(names)
    stale: dict[str, str] = {}
    roots: dict[str, str] = {}  # stale step -> the rerun dependency at the bottom
    unsure: list[str] = []
    for name in graph.order:
        if name not in wanted:
            continue
        node = nodes[name]
        if not node.deps:
            continue
        record = statuses.get(node.output_path)
        if record is None or record.status != SUCCESS or record.mismatch:
            continue
        if record.inputs is None and record.inputs_digest is None:
            continue  # written before runs recorded their inputs: up to date, as it always was
        upstream = next((d for d in node.deps if d in stale), None)
        if upstream is not None:
            roots[name] = roots[upstream]
            stale[name] = f"upstream {roots[name]} rerun since this step ran"
            continue
        changed = _changed_dependency(node.deps, record, {d: statuses.get(nodes[d].output_path) for d in node.deps})
        if changed is _UNSURE:
            unsure.append(node.output_path)
        elif changed is not None:
            roots[name] = changed
            stale[name] = f"dependency {changed} rerun since this step ran"
    return stale, unsure


_UNSURE = "\0unsure"


def _changed_dependency(
    deps: Iterable[str], record: StatusRecord, now: Mapping[str, StatusRecord | None]
) -> str | None:
    """The first dependency whose output changed since ``record``'s run read it; None; or :data:`_UNSURE`."""
    deps = list(deps)
    done: list[tuple[str, float]] = []
    for dep in deps:
        current = now[dep]
        if current is None or current.mismatch:
            continue
        if current.status in _BEGUN:
            return dep  # a rerun of it began (and failed, or was interrupted): its output is rewritten
        if current.status == SUCCESS:
            done.append((dep, current.time))
    if record.inputs is None:
        if len(done) == len(deps) and inputs_digest(done) == record.inputs_digest:
            return None
        return _UNSURE  # the summary cannot say which one: the marker can
    read = dict(record.inputs)
    return next((dep for dep, when in done if dep in read and when != read[dep]), None)


_BEGUN = frozenset({FAILED, RUNNING})
"""A dependency's status once a rerun of it has begun; an unreadable marker or another
identity's status says nothing of a rerun and counts as no status."""
