"""What happens around one execution of a step: before it and after it.

Before: the output directory is prepared, the info JSON and a ``RUNNING`` status are
written, and the config is resolved into a :class:`~marinbuild.backend.Job`. After: a
``SUCCESS`` status is written only when the step returned successfully, otherwise
``FAILED`` with the error; a remote store receives the log at the end.
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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .backend import Job, Outcome
from .graph import Node
from .markers import FAILED, RUNNING, SUCCESS, log_path, write_info, write_status
from .resolve import render_command, resolve_config
from .storage import Storage

__all__ = ["RunContext", "commit", "prepare"]


@dataclass(frozen=True)
class RunContext:
    """Facts about this run that every step's info records."""

    storage: Storage
    workdir: str
    marinfile: str
    outputs: Mapping[str, str]
    """Output path of every step in the graph, by name."""

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
    """Write the info and RUNNING markers and build the job; returns the job and its info."""
    s = node.step
    out = node.output_path
    storage = ctx.storage
    if s.fresh_output:
        storage.remove(out)
    storage.makedirs(out)
    config = resolve_config(s.config, out, ctx.outputs)
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


def commit(ctx: RunContext, job: Job, info: dict[str, Any], outcome: Outcome) -> None:
    """Record how the step ended: SUCCESS only for a successful outcome."""
    storage = ctx.storage
    if not storage.is_local and os.path.exists(job.log_file):
        storage.put_file(job.log_file, log_path(job.output_path))
    info = {**info, "end_time": outcome.ended, "duration": outcome.duration}
    if outcome.ok:
        write_info(storage, job.output_path, info)
        write_status(storage, job.output_path, SUCCESS, duration=outcome.duration)
    else:
        info["error"] = outcome.error
        write_info(storage, job.output_path, info)
        write_status(storage, job.output_path, FAILED, error=outcome.error, duration=outcome.duration)


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
    return f"{socket.gethostname()}:{os.getpid()}"


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
    return out.stdout.strip() or None if out.returncode == 0 else None
