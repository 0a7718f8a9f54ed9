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

from collections.abc import Iterable, Mapping, Sequence

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
    if not statuses:  # nothing ran: no step has inputs to be rewritten (a fresh plan's every step)
        return {}, []
    nodes = graph.nodes
    wanted = names if isinstance(names, (set, frozenset)) else set(names)
    every = len(wanted) >= len(nodes)  # the usual plan: every step, no membership test per step
    get = statuses.get
    stale: dict[str, str] = {}
    roots: dict[str, str] = {}  # stale step -> the rerun dependency at the bottom
    unsure: list[str] = []
    for name in graph.order:
        node = nodes[name]
        deps = node.deps
        if not deps or (not every and name not in wanted):
            continue
        record = get(node.output_path)
        if record is None or record.status != SUCCESS or record.mismatch:
            continue
        if record.inputs is None and record.inputs_digest is None:
            continue  # written before runs recorded their inputs: up to date, as it always was
        if stale:
            upstream = next((d for d in deps if d in stale), None)
            if upstream is not None:
                roots[name] = roots[upstream]
                stale[name] = f"upstream {roots[name]} rerun since this step ran"
                continue
        changed = _changed_dependency(deps, record, [get(nodes[d].output_path) for d in deps])
        if changed is _UNSURE:
            unsure.append(node.output_path)
        elif changed is not None:
            roots[name] = changed
            stale[name] = f"dependency {changed} rerun since this step ran"
    return stale, unsure


_UNSURE = "\0unsure"


def _changed_dependency(
    deps: Sequence[str], record: StatusRecord, now: Sequence[StatusRecord | None]
) -> str | None:
    """The first dependency whose output changed since ``record``'s run read it; None; or :data:`_UNSURE`.

    ``now`` holds each dependency's status, in the order of ``deps``.
    """
    read = record.inputs
    if read is not None and len(deps) == 1 == len(read) and read[0][0] == deps[0]:
        current = now[0]  # the common case, one dependency: no list or dict made
        if current is None or current.mismatch:
            return None
        if current.status in _BEGUN:
            return deps[0]
        return deps[0] if current.status == SUCCESS and current.time != read[0][1] else None
    done: list[tuple[str, float]] = []
    for dep, current in zip(deps, now, strict=True):
        if current is None or current.mismatch:
            continue
        if current.status in _BEGUN:
            return dep  # a rerun of it began (and failed, or was interrupted): its output is rewritten
        if current.status == SUCCESS:
            done.append((dep, current.time))
    if read is None:
        if len(done) == len(deps) and inputs_digest(done) == record.inputs_digest:
            return None
        return _UNSURE  # the summary cannot say which one: the marker can
    recorded = dict(read)
    return next((dep for dep, when in done if dep in recorded and when != recorded[dep]), None)


_BEGUN = frozenset({FAILED, RUNNING})
"""A dependency's status once a rerun of it has begun; an unreadable marker or another
identity's status says nothing of a rerun and counts as no status."""
