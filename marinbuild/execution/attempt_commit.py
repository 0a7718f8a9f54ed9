"""The records of an attempt once it has run: how the step ended, written by its holder alone.

The dependencies are checked again (one redone while the step ran makes it ``FAILED``), the
info JSON is written with both times, then a ``SUCCESS`` status only when the step returned
successfully and this runner still holds its lease, otherwise ``FAILED`` with the error,
each only over the version the claim wrote (:mod:`marinbuild.execution.attempt_start`; a
runner that took the step over meanwhile makes it :class:`~marinbuild.errors.LeaseLost`).
The log and the attempt ledger follow the status; what the step wrote outside its output is
noted beside them. A success removes the earlier output set aside; a failure says where it is.

A store that refuses a write fails the step with one line naming the path; a step that
finished is never left ``RUNNING`` when anything at all can still be written or removed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from typing import Any

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.final_records import RecordedOutcome, record
from marinbuild.errors import LeaseLost, MarinbuildError
from marinbuild.execution.attempt_handover import DEPS_EXTRA, EARLIER_OUTPUTS, OUTSIDE_BEFORE, STEP_FENCE, STRICT_EXTRA
from marinbuild.execution.dependency_check import describe_status
from marinbuild.execution.run_context import RunContext, runner_name
from marinbuild.execution.storage_problems import storage_problem
from marinbuild.execution.stray_writes import Snapshot, describe, found_since, note_path, take_snapshot
from marinbuild.graph import StepNode
from marinbuild.store.fenced import CommitRefused, StepFence
from marinbuild.store.markers import FAILED, SUCCESS, read_statuses, status_path, write_status
from marinbuild.store.step_logs import staged_log
from marinbuild.store.storage import Storage

__all__ = ["commit", "record_failure"]

_LOG_WITH_INFO = 16 << 20
"""A log up to this size is uploaded together with the info JSON (one overlapped batch)."""


def commit(
    ctx: RunContext, job: Job, info: dict[str, Any], outcome: Outcome, still_owner: Callable[[], bool] | None = None
) -> Outcome:
    """Record how the step ended: SUCCESS only for a successful outcome, only by its holder.

    ``still_owner`` is asked right before anything is written (the step's output is complete
    by then); when it answers no, nothing is written, since the step belongs to another
    runner now, and :class:`~marinbuild.errors.LeaseLost` is raised.

    Returns the outcome as recorded: a success turns into a failure when a dependency was
    redone while the step ran (it may have read half of it), or when the store refused
    the markers (the error names the path; the step is then left ``FAILED``, or without a
    status, never ``RUNNING``).
    """
    earlier: list[str] = info.pop(EARLIER_OUTPUTS, None) or []
    before: Snapshot | None = info.pop(OUTSIDE_BEFORE, None)
    fence: StepFence | None = info.pop(STEP_FENCE, None)
    if isinstance(outcome, RecordedOutcome):
        # Its markers were written beside the work by the step's holder; writing them again
        # could clobber a newer run. Only what was left to write with them remains.
        if outcome.records:
            try:
                ctx.storage.write_many(outcome.records)
            except (MarinbuildError, OSError):
                pass  # the ledger only explains; the step's own markers are written already
        return _settle_earlier(ctx.storage, outcome, earlier)
    if still_owner is not None and not still_owner():
        raise LeaseLost(f"step {job.name} lost its lease; nothing recorded")
    if outcome.ok:
        changed = _dependencies_changed(ctx, info)
        if changed is not None:
            outcome = dataclasses.replace(outcome, ok=False, error=changed)
    outside, outcome = _outside_writes(ctx, job, before, outcome)
    storage = ctx.storage
    try:
        beside: dict[str, str | bytes] = dict(outcome.records)
        if outside:
            beside[note_path(job.output_path)] = json.dumps({"outside": outside}, indent=1)
        beside.update(staged_log(storage, job.output_path, job.log_file, _LOG_WITH_INFO))
        record(storage, job.output_path, info, outcome, owner=runner_name(), beside=beside, fence=fence)
    except CommitRefused as e:
        # Another runner claimed the step after this one's lease check: its records stand, and
        # this attempt is reported as one that lost its lease, never as the step's result.
        raise LeaseLost(f"step {job.name} lost its lease before its commit ({e}); nothing more recorded") from e
    except (MarinbuildError, OSError) as e:
        error = f"could not record {'SUCCESS' if outcome.ok else 'the failure'} in {job.output_path}: {storage_problem(e)}"
        _give_up_running(storage, job.output_path, info, error)
        return _settle_earlier(storage, dataclasses.replace(outcome, ok=False, error=error), earlier)
    return _settle_earlier(storage, outcome, earlier)


def _outside_writes(ctx: RunContext, job: Job, before: Snapshot | None, outcome: Outcome) -> tuple[list[str], Outcome]:
    """What the step wrote outside its output, said in one warning line; with strict outputs a failure."""
    if before is None:
        return [], outcome
    now = time.monotonic()
    span = ctx.step_spans.get(job.name, [now, math.inf])
    span[1] = now
    deps = [ctx.outputs[d] for d in job.extra.get(DEPS_EXTRA) or () if d in ctx.outputs]
    after = take_snapshot(ctx.storage, ctx.prefix, job.output_path, deps, ctx.layout.seen)
    if after is None:
        return [], outcome
    found = found_since(before, after, ctx.layout)
    if not found:
        return [], outcome
    line = describe(job.name, found)
    # Only a step that wrote outside looks for company: every run's spans, walked per step, made a run quadratic.
    beside = sorted(n for n, (start, end) in list(ctx.step_spans.items()) if n != job.name and start < now and end > span[0])
    if beside:  # a write seen is not proof of whose it was
        shown = ", ".join(beside[:3]) + (f" and {len(beside) - 3} more" if len(beside) > 3 else "")
        line += f" (or {shown}, running at the same time)"
    if outcome.ok and (ctx.strict_outputs or job.extra.get(STRICT_EXTRA)):
        return found, dataclasses.replace(outcome, ok=False, error=f"{line} (strict outputs)")
    ctx.warn(f"marinbuild: warning: {line}")
    return found, outcome


def _settle_earlier(storage: Storage, outcome: Outcome, earlier: list[str]) -> Outcome:
    """After the outcome is recorded: a success removes the earlier output set aside, a failure says where it is."""
    if not earlier:
        return outcome
    if not outcome.ok:
        kept = f"its earlier output is kept in {_listed(earlier)}"
        return dataclasses.replace(outcome, error=f"{outcome.error}; {kept}" if outcome.error else kept)
    for folder in earlier:
        try:
            storage.remove(folder)
        except (MarinbuildError, OSError):
            pass  # left for the next success to remove
    return outcome


def _listed(folders: list[str]) -> str:
    """Every folder named, oldest first: ``A``, ``A and B``, ``A, B and C``."""
    return folders[0] if len(folders) == 1 else f"{', '.join(folders[:-1])} and {folders[-1]}"


def _dependencies_changed(ctx: RunContext, info: dict[str, Any]) -> str | None:
    """Why the step's output cannot count: a dependency redone while it ran; None when none was."""
    seen: dict[str, float] = info.get("dependency_status_times") or {}
    if not seen:
        return None
    outputs = {ctx.outputs[d]: d for d in seen}
    try:
        now = read_statuses(ctx.storage, outputs)
    except MarinbuildError as e:
        return f"its dependencies could not be checked after it ran: {e}"
    for out, dep in outputs.items():
        record = now.get(out)
        if record is None or record.status != SUCCESS or record.time != seen[dep]:
            state = "redone meanwhile" if record is not None and record.status == SUCCESS else describe_status(record, status_path(out))
            return f"dependency {dep} changed while this step ran ({state}); its output may mix both: run it again"
    return None


def _give_up_running(storage: Storage, output: str, info: dict[str, Any], error: str) -> None:
    """After a failed final write: FAILED if anything can be written, else no status at all."""
    try:
        write_status(storage, output, FAILED, error=error, owner=runner_name(), name=info.get("name"),
                     identity=info.get("identity"))
        return
    except (MarinbuildError, OSError):
        pass
    try:
        storage.remove(status_path(output))  # removing needs no free space
    except (MarinbuildError, OSError):
        pass  # a read-only store: the RUNNING status stays, with no lease behind it (shown as incomplete)


def record_failure(ctx: RunContext, node: StepNode, error: str) -> None:
    """Mark a step FAILED that could not even start (its claim is still held); best effort.

    When even that cannot be written (the store is full or read-only) the status is left
    as it was: the step's own error already names the path.
    """
    try:
        write_status(ctx.storage, node.output_path, FAILED, error=error, owner=runner_name(), name=node.name,
                     identity=node.identity)
    except (MarinbuildError, OSError):
        pass
