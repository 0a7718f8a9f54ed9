"""What happens around one execution of a step: before it and after it.

Before: the output directory is prepared (cleared first for a fresh output), mirrored
inputs are copied, a ``RUNNING`` status is written and the config is resolved into a
:class:`~marinbuild.backends.base.Job`. After: the info JSON is written with both times, then a
``SUCCESS`` status only when the step returned successfully and this runner still holds
its lease, otherwise ``FAILED`` with the error; a remote store receives the log at the end.
"""

from __future__ import annotations

import dataclasses
import functools
import getpass
import json
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Job, Outcome
from marinbuild.errors import LeaseLost
from marinbuild.graph import Node
from marinbuild.resolve import render_command, resolve_config
from marinbuild.store.lease import Owner
from marinbuild.store.markers import FAILED, MARKER_DIR, RUNNING, SUCCESS, log_path, write_info, write_status
from marinbuild.store.mirror import ensure_mirrored, find_mirrored
from marinbuild.store.storage import Storage

__all__ = ["RecordedOutcome", "RunContext", "clear_output", "commit", "prepare", "record", "record_failure"]


@dataclass(frozen=True)
class RunContext:
    """Facts about this run that every step's info records."""

    storage: Storage
    workdir: str
    marinfile: str
    outputs: Mapping[str, str]
    """Output path of every step in the graph, by name."""
    fresh_output: bool = False
    """Clear every step's output before it runs (``run --fresh-output``), as ``fresh_output=True`` does."""

    @functools.cached_property
    def provenance(self) -> dict[str, Any]:
        return {
            "git_commit": _git_commit(self.workdir),
            "user": _user(),
            "host": socket.gethostname(),
            "marinfile": self.marinfile,
        }


def prepare(ctx: RunContext, node: Node, extra_env: Mapping[str, str], cores: tuple[int, ...] = (),
            timeout: float | None = None) -> tuple[Job, dict[str, Any]]:
    """Write the RUNNING marker and build the job; returns the job and the info to record."""
    s = node.step
    out = node.output_path
    storage = ctx.storage
    if s.fresh_output or ctx.fresh_output:
        clear_output(storage, out)
    storage.makedirs(out)
    mirrors = {m.source: ensure_mirrored(m, storage) for m in find_mirrored(s.config)}
    config = resolve_config(s.config, out, ctx.outputs, mirrors)
    command = render_command(s.cmd, config, out) if s.cmd is not None else None
    log_file = log_path(out) if storage.is_local else _local_log_file(node)
    env = {"MARINBUILD_OUTPUT": out, "MARINBUILD_STEP": s.name, **dict(s.env), **extra_env}
    info: dict[str, Any] = {
        "name": s.name,
        "identity": node.identity,
        "identity_payload": node.payload,
        "output_path": out,
        "config": to_jsonable(config),
        "dependencies": {d: ctx.outputs[d] for d in node.deps},
        "kind": s.kind,
        "function": _describe_fn(s.fn) if s.fn is not None else None,
        "command": command,
        "description": s.description,
        "start_time": time.time(),
        **ctx.provenance,
    }
    # The info JSON is written once, at the end, with both times; while the step runs its
    # RUNNING status says who runs it and since when.
    write_status(storage, out, RUNNING, owner=_owner())
    job = Job(
        name=s.name,
        output_path=out,
        log_file=log_file,
        workdir=ctx.workdir,
        env=env,
        fn=s.fn,
        config=config,
        command=command,
        cores=cores,
        timeout=timeout,
    )
    return job, info


@dataclass(frozen=True)
class RecordedOutcome(Outcome):
    """An outcome whose markers were already written where the step ran (a Ray task)."""


def commit(
    ctx: RunContext, job: Job, info: dict[str, Any], outcome: Outcome, still_owner: Callable[[], bool] | None = None
) -> None:
    """Record how the step ended: SUCCESS only for a successful outcome, only by its holder.

    ``still_owner`` is asked right before anything is written (the step's output is complete
    by then); when it answers no, nothing is written, since the step belongs to another
    runner now, and :class:`~marinbuild.errors.LeaseLost` is raised.
    """
    if isinstance(outcome, RecordedOutcome):
        return  # written beside the work by the step's holder; writing again could clobber a newer run
    if still_owner is not None and not still_owner():
        raise LeaseLost(f"step {job.name} lost its lease; nothing recorded")
    storage = ctx.storage
    if not storage.is_local and os.path.exists(job.log_file):
        storage.put_file(job.log_file, log_path(job.output_path))
    record(storage, job.output_path, info, outcome, owner=_owner())


def record_failure(ctx: RunContext, node: Node, error: str) -> None:
    """Mark a step FAILED that could not even start (its claim is still held)."""
    write_status(ctx.storage, node.output_path, FAILED, error=error, owner=_owner())


def clear_output(storage: Storage, out: str) -> None:
    """Empty an output directory for a fresh start, keeping its lease (the caller holds it)."""
    for entry in storage.list_names(out):
        if entry != MARKER_DIR:
            storage.remove(Storage.join(out, entry))
    markers = Storage.join(out, MARKER_DIR)
    for entry in storage.list_names(markers):
        if not entry.startswith("lease"):
            storage.remove(Storage.join(markers, entry))


def record(storage: Storage, output: str, info: dict[str, Any], outcome: Outcome, owner: str | None = None) -> None:
    """Write the final info, then the status: the part of :func:`commit` a remote executor repeats."""
    error = None if outcome.ok else outcome.error
    info = {**info, "end_time": outcome.ended, "duration": outcome.duration}
    if error is not None:
        info["error"] = error
    write_info(storage, output, info)
    status = SUCCESS if outcome.ok else FAILED
    write_status(storage, output, status, error=error, duration=outcome.duration, owner=owner)


def to_jsonable(value: Any) -> Any:
    """A JSON-friendly rendering of a resolved config, for humans (not for identity)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    try:
        json.dumps(value)
        return value
    except TypeError:
        return repr(value)


def _describe_fn(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _local_log_file(node: Node) -> str:
    folder = os.path.join(tempfile.gettempdir(), "marinbuild-logs", f"{node.name.replace('/', '_')}-{node.identity}")
    return os.path.join(folder, "step.log")


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
