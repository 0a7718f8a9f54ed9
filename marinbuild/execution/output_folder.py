"""A step's output folder made ready for an attempt: its earlier contents set aside, cleared or kept.

A step rerun over a finished output has the earlier contents set aside (never deleted
before the new run succeeds, see :mod:`marinbuild.store.aside`); a fresh output clears a
failed run's partial output; any other step continues in place and says so in its log's
first line when it finds output there. Nothing is written through a link: an output folder,
``.marinbuild`` or a marker that is one refuses the step before its lease is taken.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from marinbuild.errors import StorageError
from marinbuild.execution.run_context import RunContext, runner_name
from marinbuild.execution.storage_problems import stored
from marinbuild.execution.stray_writes import made_here
from marinbuild.graph import StepNode
from marinbuild.store.aside import ASIDE_PREFIX, asides, set_aside, step_entries
from marinbuild.store.links import stored_link_problem
from marinbuild.store.markers import MARKER_DIR, RUNNING, read_status, status_path, write_status
from marinbuild.store.storage import Storage

__all__ = ["claim_lease", "clear_output", "link_refusal", "ready_output_folder"]

_T = TypeVar("_T")


def link_refusal(ctx: RunContext, node: StepNode) -> str | None:
    """The one line refusing a step whose output folder, ``.marinbuild`` or a marker is a symlink
    (or a marker is a FIFO, a device or a socket, which would block or never end a read).

    Asked before the step's lease is taken: clearing, setting aside or writing through such
    a link would reach outside the prefix. ``clean`` follows the same rule.
    """
    problem = stored_link_problem(ctx.storage, node.output_path)
    if problem is None:
        return None
    why = "; marinbuild never writes through a link" if problem.endswith("symlink") else ""
    return f"refusing to write under {node.output_path}: {problem}{why}"


def claim_lease(ctx: RunContext, node: StepNode, claim: Callable[[], _T]) -> _T:
    """Take the step's lease by ``claim``, which makes its output folder where there is none yet;
    the look for writes outside the outputs learns of the new folder without listing its parent."""
    local = ctx.storage.local_file(node.output_path) if ctx.prefix else None
    return claim() if local is None else made_here(ctx.layout.seen, local, claim)


def ready_output_folder(ctx: RunContext, node: StepNode) -> tuple[str | None, list[str]]:
    """The step's output folder made ready (earlier contents set aside or kept); the log note and what was set aside."""
    out = node.output_path
    status_file = status_path(out)
    on_disk = ctx.storage.local_file(status_file)
    if on_disk is not None and os.path.isdir(on_disk):
        raise StorageError(f"{status_file} is a folder, not a status file; move it away to run {node.step.name}")
    note, earlier = _prepare_output(ctx, node)
    stored(f"create {out}", lambda: ctx.storage.makedirs(out))
    return note, earlier


def _prepare_output(ctx: RunContext, node: StepNode) -> tuple[str | None, list[str]]:
    """Start over, clear or continue the step's output folder; the log's first line and the aside folders."""
    storage, out, name = ctx.storage, node.output_path, node.name
    was = ctx.resuming.get(out)
    kept = ctx.keep_output or node.step.resume_output
    unfinished = was == "interrupted" and not kept and _was_starting_over(storage, out)
    if out in ctx.start_over or unfinished:
        return _start_over(ctx, node, unfinished)
    if node.step.fresh_output or ctx.fresh_output:
        stored(f"clear {out}", lambda: clear_output(storage, out))
        return None, []
    if was is None:
        return None, []
    listed = stored(f"list {out}", lambda: storage.list_names(out))
    entries = step_entries(listed)
    earlier = stored(f"list {out}", lambda: asides(storage, out)) if MARKER_DIR in listed else []
    if not entries:
        return None, earlier
    if was == "finished":
        return f"marinbuild: {name} resumes in place from its earlier output in {out} (kept on request)", earlier
    return f"marinbuild: {name} resumes from partial output of an earlier {was} run in {out}; --fresh-output to start over", earlier


def _start_over(ctx: RunContext, node: StepNode, unfinished: bool) -> tuple[str | None, list[str]]:
    """Set the earlier output aside (``unfinished``: into the folder an interrupted set-aside began)."""
    storage, out, name = ctx.storage, node.output_path, node.name
    # RUNNING first: a runner killed while (or right after) moving the output aside must not
    # leave the old SUCCESS marker over an emptied folder, which the next plan would trust.
    # It says the attempt starts over: killed before the move, it leaves the earlier finished
    # output in place, which the next run must set aside too rather than resume from.
    stored(f"write {status_path(out)}", lambda: write_status(
        storage, out, RUNNING, owner=runner_name(), name=name, identity=node.identity, starting_over=True))
    earlier = stored(f"list {out}", lambda: asides(storage, out))
    # A set-aside that was interrupted goes on into its own folder: one earlier output, one folder.
    into = earlier[-1] if unfinished and earlier else None
    moved = stored(f"set aside the earlier output of {name}", lambda: set_aside(storage, out, into=into))
    if moved is None:
        return None, earlier
    return (f"marinbuild: {name} starts from an empty output folder; its earlier output is set aside in {moved} "
            "until this run succeeds"), list(dict.fromkeys([*earlier, moved]))


def _was_starting_over(storage: Storage, out: str) -> bool:
    """Whether the interrupted attempt over ``out`` had begun to start over (its status says so).

    Read here, not at planning: the status summary of a remote store does not carry it, and
    only a step resuming after an interruption pays the read.
    """
    record = stored(f"read {status_path(out)}", lambda: read_status(storage, out))
    return record is not None and record.status == RUNNING and record.starting_over is True


def clear_output(storage: Storage, out: str) -> None:
    """Empty an output directory for a fresh start, keeping its lease (the caller holds it)."""
    for entry in storage.list_names(out):
        if entry != MARKER_DIR:
            storage.remove(Storage.join(out, entry))
    markers = Storage.join(out, MARKER_DIR)
    for entry in storage.list_names(markers):
        if not entry.startswith(("lease", ASIDE_PREFIX)):  # an earlier finished output stays until a success
            storage.remove(Storage.join(markers, entry))
