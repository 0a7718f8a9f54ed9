"""What happens around one execution of a step: before it and after it.

Before: the step's dependencies are checked once more (each must still hold the
``SUCCESS`` it was planned on, with no other runner's lease on it: a dependency being
redone elsewhere makes the step wait, see docs/leases.md), the output directory is
prepared (cleared first for a fresh output), mirrored inputs are copied, the claim is
written (a ``RUNNING`` status and the info as it starts, their versions kept by a
:class:`~marinbuild.store.fenced.StepFence`) and the config is resolved into a
:class:`~marinbuild.backends.base.Job`. After: the dependencies are checked again (one redone
while the step ran makes it ``FAILED``), the info JSON is written with both times, then a
``SUCCESS`` status only when the step returned successfully and this runner still holds its
lease, otherwise ``FAILED`` with the error, each only over the version the claim wrote (a
runner that took the step over meanwhile makes it :class:`~marinbuild.errors.LeaseLost`);
the log and the attempt ledger follow the status. Every status names the step and its identity.

A store that refuses a write (full, read-only, a folder where a marker should be) fails
the step with one line naming the path; a step that finished is never left ``RUNNING``
when anything at all can still be written or removed.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import math
import os
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from marinbuild.accounting import held_by
from marinbuild.backends.base import HELD_EXTRA, Job, Outcome
from marinbuild.backends.environments import DECLARED_ENV_EXTRA, ENV_EXTRA
from marinbuild.backends.final_records import RecordedOutcome, record
from marinbuild.config_walk import (
    LEAF_TYPES,
    MAPPING,
    MAX_INT_BITS,
    RECORD,
    SET,
    children,
    describe_leaf,
    is_namedtuple,
)
from marinbuild.drift import code_record
from marinbuild.errors import LeaseLost, MarinbuildError, StorageError
from marinbuild.execution.dependency_check import check_dependencies, describe_status
from marinbuild.execution.stray_writes import (
    Layout,
    Snapshot,
    describe,
    found_since,
    layout_of,
    note_path,
    take_snapshot,
)
from marinbuild.graph import StepNode
from marinbuild.pyenv.spec import EnvSpec, environment_of
from marinbuild.redact import redact_env
from marinbuild.resolve import render_command, resolve_config
from marinbuild.resources import ResourceConfig
from marinbuild.steps import Step, find_mirrored
from marinbuild.store.aside import ASIDE_PREFIX, asides, set_aside, step_entries
from marinbuild.store.attempt_ledger import read_attempts
from marinbuild.store.fenced import CommitRefused, StepFence
from marinbuild.store.lease import Owner, Watch
from marinbuild.store.links import stored_link_problem
from marinbuild.store.markers import (
    FAILED,
    MARKER_DIR,
    RUNNING,
    SUCCESS,
    info_path,
    info_text,
    read_status,
    read_statuses,
    status_path,
    write_status,
)
from marinbuild.store.mirror import ensure_mirrored
from marinbuild.store.step_logs import LOG_NOTE_EXTRA, begin_step_log, staged_log
from marinbuild.store.storage import Storage, overlapped

__all__ = [
    "RunContext",
    "clear_output",
    "commit",
    "link_refusal",
    "prepare",
    "record_failure",
]

T = TypeVar("T")


@dataclass(frozen=True)
class RunContext:
    """Facts about this run that every step's info records."""

    storage: Storage
    workdir: str
    marinfile: str
    outputs: Mapping[str, str]
    """Output path of every step in the graph, by name."""
    fresh_output: bool = False
    """Clear every step's partial output before it runs (``run --fresh-output``), as ``fresh_output=True`` does."""
    lost_attempts: frozenset[str] = frozenset()
    """Output paths whose step an earlier run left ``RUNNING`` (its runner killed): its last attempt
    was never recorded, and its number is not given again."""
    keep_output: bool = False
    """Every step resumes in place over what its folder holds (``run --keep-output``), as ``resume_output=True`` does."""
    start_over: frozenset[str] = frozenset()
    """Output paths whose earlier contents are set aside before their step runs (see :mod:`marinbuild.store.aside`)."""
    resuming: Mapping[str, str] = field(default_factory=dict)
    """Output paths whose step continues in place, with what the earlier run was (``failed``, ``interrupted``,
    ``finished``): the step's first log line says so when it finds output there."""
    identities: Mapping[str, str] = field(default_factory=dict)
    """Identity of every step in the graph, by name: a dependency's status must be written for it."""
    prefix: str = ""
    """Where the outputs live: a step's writes beside them are watched (:mod:`marinbuild.execution.stray_writes`)."""
    strict_outputs: bool = False
    """A step that writes outside its output fails (``run --strict-outputs``), as ``strict_outputs=True`` does."""
    warn: Callable[[str], None] = field(default=lambda line: None, repr=False, compare=False)
    """Where a warning about a step goes (a line of the run's output)."""
    _watches: dict[str, Watch] = field(default_factory=dict, repr=False, compare=False)
    _spans: dict[str, list[float]] = field(default_factory=dict, repr=False, compare=False)
    """When each step of this run started and (once recorded) ended, by name: which steps ran beside
    one found writing outside its output (any of them may have written it)."""
    """Leases on dependencies seen held, by lease path: how long each stayed unchanged."""

    @functools.cached_property
    def layout(self) -> Layout:
        """Where the graph's outputs lie on this machine, once per run (see :mod:`marinbuild.execution.stray_writes`)."""
        local = {p: d for d, out in self.outputs.items() if (p := self.storage.local_file(out)) is not None}
        return layout_of(local, self.storage.local_file(self.prefix) or self.prefix)

    @functools.cached_property
    def provenance(self) -> dict[str, Any]:
        return {
            "git_commit": _git_commit(self.workdir),
            "user": _user(),
            "host": socket.gethostname(),
            "marinfile": self.marinfile,
        }


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


@dataclass(frozen=True)
class StepInputs:
    """What a step runs with, resolved once: the job and ``info.json`` both take it from here."""

    config: Any
    """The config with every placeholder resolved (dependency outputs, mirrored copies)."""
    command: str | None
    """The shell command rendered from the template, for a ``cmd`` step."""
    env: dict[str, str]
    environment: EnvSpec | None
    held: dict[str, Any]
    """What the step holds of the machine (:func:`marinbuild.accounting.held_by`)."""


def prepare(ctx: RunContext, node: StepNode, extra_env: Mapping[str, str], cores: tuple[int, ...] = (),
            timeout: float | None = None) -> tuple[Job, dict[str, Any]]:
    """Check the dependencies, write the RUNNING marker and build the job; returns the job and the info to record.

    In stages: the dependencies, the output folder, the inputs (one :class:`StepInputs`),
    then the records that claim the step. Raises :class:`DependencyBusy` when a dependency
    is being redone elsewhere (the step waits), and another
    :class:`~marinbuild.errors.MarinbuildError` naming the path when the step cannot start
    (it fails alone).
    """
    seen = check_dependencies(ctx, node)
    note, earlier = _output_folder(ctx, node)
    inputs = _resolved_inputs(ctx, node, extra_env, cores)
    log_file = begin_step_log(ctx.storage, node.output_path)  # this run's attempts start a new log; the last run's is kept
    info = _started_info(ctx, node, inputs, seen, earlier)
    previous = _claim(ctx, node, info)
    s = node.step
    job = Job(
        name=s.name,
        output_path=node.output_path,
        log_file=log_file,
        workdir=ctx.workdir,
        env=inputs.env,
        fn=s.fn,
        config=inputs.config,
        command=inputs.command,
        cores=cores,
        timeout=timeout,
        extra={**_extra(s, inputs.environment), HELD_EXTRA: inputs.held,
               **({LOG_NOTE_EXTRA: note} if note is not None else {}),
               DEPS_EXTRA: node.deps, **({STRICT_EXTRA: True} if s.strict_outputs else {})},
        previous_attempts=previous,
        lost_attempt=node.output_path in ctx.lost_attempts,
        progress_timeout=s.progress_timeout,
    )
    return job, info


def _output_folder(ctx: RunContext, node: StepNode) -> tuple[str | None, list[str]]:
    """The step's output folder made ready (earlier contents set aside or kept); the log note and what was set aside."""
    out = node.output_path
    status_file = status_path(out)
    on_disk = ctx.storage.local_file(status_file)
    if on_disk is not None and os.path.isdir(on_disk):
        raise StorageError(f"{status_file} is a folder, not a status file; move it away to run {node.step.name}")
    note, earlier = _prepare_output(ctx, node)
    _stored(f"create {out}", lambda: ctx.storage.makedirs(out))
    return note, earlier


def _resolved_inputs(ctx: RunContext, node: StepNode, extra_env: Mapping[str, str], cores: tuple[int, ...] = ()) -> StepInputs:
    """The step's config, command, environment variables, Python environment and holdings, resolved."""
    s, out = node.step, node.output_path
    mirrors = {m.source: ensure_mirrored(m, ctx.storage) for m in find_mirrored(s.config)}
    config = resolve_config(s.config, out, ctx.outputs, mirrors)
    command = render_command(s.cmd, config, out, s.name) if s.cmd is not None else None
    return StepInputs(
        config=config,
        command=command,
        env=step_environment(s, out, extra_env),
        environment=environment_of(s.name, s.pip_dependency_groups, ctx.marinfile),
        held=held_by(s.resources, cores),
    )


def _started_info(ctx: RunContext, node: StepNode, inputs: StepInputs, seen: dict[str, float], earlier: list[str]) -> dict[str, Any]:
    """``info.json`` as the step starts, from the same inputs as its job."""
    s, out = node.step, node.output_path
    info: dict[str, Any] = {
        "name": s.name,
        "identity": node.identity,
        "identity_payload": node.payload,
        "output_path": out,
        "config": to_jsonable(inputs.config),
        "dependencies": {d: ctx.outputs[d] for d in node.deps},
        "dependency_status_times": seen,
        "kind": s.kind,
        "function": _describe_fn(s.fn) if s.fn is not None else None,
        "command": inputs.command,
        "description": s.description,
        "environment": inputs.environment.to_json() if inputs.environment is not None else None,
        "env_vars": redact_env(env_vars_of(s)),
        "held": inputs.held,
        **code_record(s),  # what plan and why compare to tell drift (drift.py)
        "start_time": time.time(),
        **ctx.provenance,
    }
    if earlier:
        info[_EARLIER] = earlier
    if ctx.prefix:
        ctx._spans[s.name] = [time.monotonic(), math.inf]
        info[_BEFORE] = take_snapshot(ctx.storage, ctx.prefix, out, [ctx.outputs[d] for d in node.deps], ctx.layout.seen)
    return info


def _claim(ctx: RunContext, node: StepNode, info: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Write the RUNNING status and the info as it stands; returns what the attempt ledger holds of earlier runs.

    Each is written whatever is there and its version kept: the final info and status are
    written only over these very versions (store/fenced.py), so that a runner that lost the
    step meanwhile cannot commit. The attempt ledger is read meanwhile.
    """
    storage, out = ctx.storage, node.output_path
    fence = StepFence(storage)
    started = info_text({k: v for k, v in info.items() if k != _EARLIER})
    info[_FENCE] = fence
    return _while_reading_attempts(storage, out, lambda: _stored(
        f"write {status_path(out)}",
        lambda: overlapped(
            storage,
            lambda: write_status(storage, out, RUNNING, put=fence.claim, owner=_owner(), name=node.step.name,
                                 identity=node.identity),
            lambda: fence.claim(info_path(out), started),
        ),
    ))


_EARLIER = "earlier_output"
"""Info key (dropped before the info is written) listing the aside folders a success removes."""
DEPS_EXTRA = "dependencies"
"""A job's ``extra`` key: the names of the steps it depends on (whose outputs it must not write to)."""
STRICT_EXTRA = "strict_outputs"
"""A job's ``extra`` key: the step fails when it writes outside its output (``strict_outputs=True``)."""
_BEFORE = "outside_before"
"""Info key (dropped before the info is written): what was seen outside the output before the step ran."""

_FENCE = "_fence"
"""Info key (dropped before the info is written) holding the step's :class:`~marinbuild.store.fenced.StepFence`."""


def _prepare_output(ctx: RunContext, node: StepNode) -> tuple[str | None, list[str]]:
    """Start over, clear or continue the step's output folder; the log's first line and the aside folders.

    A step rerun over a finished output has the earlier contents set aside (never deleted
    before the new run succeeds); a fresh output clears a failed run's partial output; any
    other step continues in place and says so when it finds output there.
    """
    storage, out, name = ctx.storage, node.output_path, node.name
    was = ctx.resuming.get(out)
    kept = ctx.keep_output or node.step.resume_output
    unfinished = was == "interrupted" and not kept and _was_starting_over(storage, out)
    if out in ctx.start_over or unfinished:
        # RUNNING first: a runner killed while (or right after) moving the output aside must not
        # leave the old SUCCESS marker over an emptied folder, which the next plan would trust.
        # It says the attempt starts over: killed before the move, it leaves the earlier finished
        # output in place, which the next run must set aside too rather than resume from.
        _stored(f"write {status_path(out)}", lambda: write_status(
            storage, out, RUNNING, owner=_owner(), name=name, identity=node.identity, starting_over=True))
        earlier = _stored(f"list {out}", lambda: asides(storage, out))
        # A set-aside that was interrupted goes on into its own folder: one earlier output, one folder.
        into = earlier[-1] if unfinished and earlier else None
        moved = _stored(f"set aside the earlier output of {name}", lambda: set_aside(storage, out, into=into))
        if moved is None:
            return None, earlier
        return (f"marinbuild: {name} starts from an empty output folder; its earlier output is set aside in {moved} "
                "until this run succeeds"), list(dict.fromkeys([*earlier, moved]))
    if node.step.fresh_output or ctx.fresh_output:
        _stored(f"clear {out}", lambda: clear_output(storage, out))
        return None, []
    if was is None:
        return None, []
    listed = _stored(f"list {out}", lambda: storage.list_names(out))
    entries = step_entries(listed)
    earlier = _stored(f"list {out}", lambda: asides(storage, out)) if MARKER_DIR in listed else []
    if not entries:
        return None, earlier
    if was == "finished":
        return f"marinbuild: {name} resumes in place from its earlier output in {out} (kept on request)", earlier
    return f"marinbuild: {name} resumes from partial output of an earlier {was} run in {out}; --fresh-output to start over", earlier


def _was_starting_over(storage: Storage, out: str) -> bool:
    """Whether the interrupted attempt over ``out`` had begun to start over (its status says so).

    Read here, not at planning: the status summary of a remote store does not carry it, and
    only a step resuming after an interruption pays the read.
    """
    record = _stored(f"read {status_path(out)}", lambda: read_status(storage, out))
    return record is not None and record.status == RUNNING and record.starting_over is True


def _while_reading_attempts(storage: Storage, output: str, write: Callable[[], Any]) -> tuple[dict[str, Any], ...]:
    """Run ``write`` while the step's attempt ledger is read; the attempts it holds.

    On a remote store the two requests are in flight together, one round trip instead of two.
    """
    _, attempts = overlapped(storage, write, lambda: read_attempts(storage, output))
    return attempts


def _extra(s: Step, environment: EnvSpec | None) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if environment is not None:
        extra[ENV_EXTRA] = environment
    declared = frozenset(env_vars_of(s)) | {k for k, _ in s.env}
    if declared:
        extra[DECLARED_ENV_EXTRA] = declared
    return extra


def env_vars_of(s: Step) -> Mapping[str, str]:
    """The step's ``ResourceConfig.env_vars`` (none for other ways of giving resources)."""
    return s.resources.env_vars if isinstance(s.resources, ResourceConfig) else {}


def step_environment(s: Step, out: str, extra_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a step gets on top of the runner's environment, in order of precedence.

    Lowest first: what admission derives (thread counts, device lists), the step's
    ``env_vars`` and ``env=``, then marinbuild's own ``MARINBUILD_*`` variables, which win
    over everything (a step cannot be told a wrong output path or attempt number).
    """
    env = {**extra_env, **env_vars_of(s), **dict(s.env)}
    env.update((k, v) for k, v in extra_env.items() if k.startswith("MARINBUILD_"))
    env.update(MARINBUILD_OUTPUT=out, MARINBUILD_STEP=s.name, MARINBUILD_ATTEMPT="1")
    return env


def status_left_to_the_attempt(info: Mapping[str, Any], job: Job) -> None:
    """The step's attempt rewrites its ``RUNNING`` status where it runs (a backend that
    announces its start): the commit fences on the info JSON alone, not on the status version
    this runner wrote at its claim, which the attempt replaced."""
    fence: StepFence | None = info.get(_FENCE)
    if fence is not None:
        fence.release(status_path(job.output_path))


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
    earlier: list[str] = info.pop(_EARLIER, None) or []
    before: Snapshot | None = info.pop(_BEFORE, None)
    fence: StepFence | None = info.pop(_FENCE, None)
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
        record(storage, job.output_path, info, outcome, owner=_owner(), beside=beside, fence=fence)
    except CommitRefused as e:
        # Another runner claimed the step after this one's lease check: its records stand, and
        # this attempt is reported as one that lost its lease, never as the step's result.
        raise LeaseLost(f"step {job.name} lost its lease before its commit ({e}); nothing more recorded") from e
    except (MarinbuildError, OSError) as e:
        error = f"could not record {'SUCCESS' if outcome.ok else 'the failure'} in {job.output_path}: {_storage_problem(e)}"
        _give_up_running(storage, job.output_path, info, error)
        return _settle_earlier(storage, dataclasses.replace(outcome, ok=False, error=error), earlier)
    return _settle_earlier(storage, outcome, earlier)


def _outside_writes(ctx: RunContext, job: Job, before: Snapshot | None, outcome: Outcome) -> tuple[list[str], Outcome]:
    """What the step wrote outside its output, said in one warning line; with strict outputs a failure."""
    if before is None:
        return [], outcome
    now = time.monotonic()
    span = ctx._spans.get(job.name, [now, math.inf])
    beside = sorted(n for n, (start, end) in list(ctx._spans.items()) if n != job.name and start < now and end > span[0])
    span[1] = now
    deps = [ctx.outputs[d] for d in job.extra.get(DEPS_EXTRA) or () if d in ctx.outputs]
    after = take_snapshot(ctx.storage, ctx.prefix, job.output_path, deps, ctx.layout.seen)
    if after is None:
        return [], outcome
    found = found_since(before, after, ctx.layout)
    if not found:
        return [], outcome
    line = describe(job.name, found)
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
        write_status(storage, output, FAILED, error=error, owner=_owner(), name=info.get("name"),
                     identity=info.get("identity"))
        return
    except (MarinbuildError, OSError):
        pass
    try:
        storage.remove(status_path(output))  # removing needs no free space
    except (MarinbuildError, OSError):
        pass  # a read-only store: the RUNNING status stays, with no lease behind it (shown as incomplete)


def _storage_problem(e: BaseException) -> str:
    if isinstance(e, OSError) and e.filename:
        return f"{e.filename}: {e.strerror or e}"
    return str(e)


def _stored(what: str, fn: Callable[[], T]) -> T:
    """Run a storage operation before the step starts; a refusal becomes one line naming the path."""
    try:
        return fn()
    except OSError as e:
        raise StorageError(f"cannot {what}: {_storage_problem(e)}") from e


def record_failure(ctx: RunContext, node: StepNode, error: str) -> None:
    """Mark a step FAILED that could not even start (its claim is still held); best effort.

    When even that cannot be written (the store is full or read-only) the status is left
    as it was: the step's own error already names the path.
    """
    try:
        write_status(ctx.storage, node.output_path, FAILED, error=error, owner=_owner(), name=node.name,
                     identity=node.identity)
    except (MarinbuildError, OSError):
        pass


def clear_output(storage: Storage, out: str) -> None:
    """Empty an output directory for a fresh start, keeping its lease (the caller holds it)."""
    for entry in storage.list_names(out):
        if entry != MARKER_DIR:
            storage.remove(Storage.join(out, entry))
    markers = Storage.join(out, MARKER_DIR)
    for entry in storage.list_names(markers):
        if not entry.startswith(("lease", ASIDE_PREFIX)):  # an earlier finished output stays until a success
            storage.remove(Storage.join(markers, entry))


_LOG_WITH_INFO = 16 << 20
"""A log up to this size is uploaded together with the info JSON (one overlapped batch)."""


def to_jsonable(value: Any) -> Any:
    """A JSON-friendly rendering of a resolved config, for humans (not for identity).

    Walked as every config is (:mod:`marinbuild.config_walk`): a dataclass or a
    NamedTuple by its fields, a set sorted when it can be, an enum by its value, a path
    as text; anything else that JSON cannot hold by its ``repr``.
    """
    found = children(value)
    if found is None:
        leaf = describe_leaf(value)
        if type(leaf) is int and leaf.bit_length() > MAX_INT_BITS:  # no JSON can hold it as a number
            return f"(an integer of {leaf.bit_length()} bits)"
        if leaf is None or type(leaf) in LEAF_TYPES:
            return leaf
        try:
            json.dumps(leaf)
            return leaf
        except (TypeError, ValueError):
            return repr(value)
    shape, items = found
    if shape in (MAPPING, RECORD):
        return {str(k): to_jsonable(v) for k, v in items}
    if is_namedtuple(value):
        return {k: to_jsonable(v) for k, v in zip(type(value)._fields, value, strict=True)}
    rendered = [to_jsonable(v) for _, v in items]
    if shape == SET:
        try:
            return sorted(rendered)
        except TypeError:
            return rendered
    return rendered


def _describe_fn(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


@functools.cache
def _owner() -> str:
    """How markers name this runner: the same ``HOST:PID`` its leases show."""
    return str(Owner.current())


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _git_commit(folder: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None
