"""A step's logs: one header per attempt, earlier runs kept apart, and reading them back by attempt and host.

Everything a step prints goes to ``OUTPUT/logs/step.log`` (a TPU step also writes one
log per host, ``logs/slice_SS_worker_WW.log``). Each attempt's text starts with a header
line naming the attempt, the time it began, the host and the backend::

    === marinbuild attempt 3 2026-11-23T22:50:01.123+00:00 host box backend local ===

A new run of a step does not append to the last run's text: :func:`start_run_log` moves
it aside first, to ``logs/step.<time>.log``. :func:`attempts_in` splits a log into its
attempts again; ``marinbuild logs`` reads them through :func:`log_files`.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from marinbuild.store.errors import UserError
from marinbuild.store.markers import log_path
from marinbuild.store.storage import Storage, open_regular, unlink_quietly

__all__ = [
    "HEADER_PREFIX",
    "LOG_NOTE_EXTRA",
    "LogPart",
    "append_note",
    "attempt_header",
    "attempts_in",
    "begin_step_log",
    "is_header",
    "log_files",
    "open_log",
    "staged_log",
    "start_run_log",
    "write_header",
]

HEADER_PREFIX = "=== marinbuild attempt "
_HEADER = re.compile(
    r"^=== marinbuild attempt (?P<attempt>\d+) (?P<time>\S+)(?: host (?P<host>\S+))?(?: backend (?P<backend>\S+))? ===$"
)


def attempt_header(attempt: int, when: float, host: str, backend: str) -> str:
    """The line that opens an attempt's log (with its newline).

    >>> attempt_header(2, 0, "box", "local")
    '=== marinbuild attempt 2 1970-01-01T00:00:00.000+00:00 host box backend local ===\\n'
    """
    stamp = datetime.fromtimestamp(when, UTC).isoformat(timespec="milliseconds")
    return f"{HEADER_PREFIX}{attempt} {stamp} host {_word(host)} backend {_word(backend)} ===\n"


def _word(text: str) -> str:
    return "".join(c if c.isprintable() and not c.isspace() else "_" for c in text) or "?"


def is_header(line: str) -> bool:
    """Whether ``line`` is an attempt header (cheap: a prefix test first)."""
    return line.startswith(HEADER_PREFIX) and _HEADER.match(line.rstrip("\r\n")) is not None


@dataclass(frozen=True)
class LogPart:
    """One attempt's text in a log; ``attempt`` is None for text written before any header."""

    attempt: int | None
    time: str | None
    host: str | None
    backend: str | None
    text: str


def attempts_in(text: str) -> list[LogPart]:
    """Split a log into its attempts, in the order written (the header line is kept in each part).

    >>> parts = attempts_in("old\\n" + attempt_header(1, 0, "h", "local") + "hi\\n")
    >>> [(p.attempt, p.text.splitlines()[-1]) for p in parts]
    [(None, 'old'), (1, 'hi')]
    """
    parts: list[LogPart] = []
    current: list[str] = []
    head: re.Match[str] | None = None

    def close() -> None:
        if head is None and not "".join(current).strip():
            return
        parts.append(
            LogPart(
                int(head["attempt"]) if head else None,
                head["time"] if head else None,
                head["host"] if head else None,
                head["backend"] if head else None,
                "".join(current),
            )
        )

    for line in text.splitlines(keepends=True):
        found = _HEADER.match(line.rstrip("\r\n")) if line.startswith(HEADER_PREFIX) else None
        if found is not None:
            close()
            head, current = found, []
        current.append(line)
    close()
    return parts


LOG_NOTE_EXTRA = "log_note"
"""A job's ``extra`` key holding marinbuild's line for the log right under the run's first attempt
header (``t resumes from partial output of an earlier failed run …``): before the step's own first
line, and inside the attempt that ``marinbuild logs`` shows."""


def write_header(log_file: str, attempt: int, host: str, backend: str) -> None:
    """Append an attempt's header to a local log file (best effort: a log is never worth a failed step)."""
    try:
        _append(log_file, attempt_header(attempt, time.time(), host, backend))
    except OSError:
        pass


def append_note(log_file: str, line: str) -> None:
    """Append one line of marinbuild's own to a local log file (best effort, as :func:`write_header`)."""
    try:
        _append(log_file, line + "\n")
    except OSError:
        pass


def open_log(log_file: str, extra_flags: int = os.O_CLOEXEC) -> int:
    """A raw descriptor appending to a local log file, its folder made only when missing.

    Raw: a log is opened at every step's start, where a text file object's set-up (fstat,
    ioctl, seeks) costs more than the write.
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | extra_flags
    try:
        fd = open_regular(log_file, flags)  # a FIFO planted there would block the step's start
    except FileNotFoundError:
        os.makedirs(os.path.dirname(log_file), exist_ok=True)
        fd = open_regular(log_file, flags)
    if not extra_flags & os.O_CLOEXEC:
        os.set_inheritable(fd, True)
    os.set_blocking(fd, True)
    return fd


def _append(log_file: str, text: str) -> None:
    fd = open_log(log_file)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def start_run_log(log_file: str) -> None:
    """Before a new run of a step: move its last run's local log aside, so the new one starts empty.

    The old text goes to ``step.<UTC time>.log`` beside it (local stores); where the log is
    only a local staging copy of a remote one (which the end of the run uploads), it was
    already uploaded and is removed.
    """
    try:
        if os.path.getsize(log_file) == 0:
            return
    except OSError:
        return
    folder, base = os.path.split(log_file)
    stem = base.removesuffix(".log")
    stamp = datetime.fromtimestamp(os.path.getmtime(log_file), UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    try:
        os.replace(log_file, os.path.join(folder, f"{stem}.{stamp}.log"))
    except OSError:
        pass


def begin_step_log(storage: Storage, output: str) -> str:
    """The local file a step's output is appended to in this run, started empty.

    On local disk it is the step's log itself (the last run's moved aside, :func:`start_run_log`);
    for a remote store a staging copy, uploaded when the run ends (:func:`staged_log`).
    """
    path = log_path(output)
    log_file = storage.staging_path(path)
    if storage.staged_in_place(path):
        start_run_log(log_file)
    else:
        unlink_quietly(log_file)  # an earlier run's copy, uploaded when that run ended
    return log_file


def staged_log(storage: Storage, output: str, log_file: str, inline_limit: int) -> dict[str, bytes]:
    """A remote step log's staged copy, to be written together with the info JSON (one round
    trip) when at most ``inline_limit`` bytes; a larger one is uploaded now, streamed. Nothing
    for a log written in place."""
    path = log_path(output)
    if storage.staged_in_place(path) or not os.path.exists(log_file):
        return {}
    if os.path.getsize(log_file) <= inline_limit:
        with open(open_regular(log_file), "rb") as f:
            return {path: f.read()}
    storage.put_file(log_file, path)
    return {}


@dataclass(frozen=True)
class LogFile:
    """One log file of a step: its path, and the host it belongs to (None: the step's own log)."""

    path: str
    host: str | None
    order: str
    """Sort key: earlier runs' files before the current one."""


_HOST_LOG = re.compile(r"^slice_(\d+)_worker_(\d+)(?:\.(\S+))?\.log$")
_STEP_LOG = re.compile(r"^step(?:\.(\S+))?\.log$")
_NODE_LOG = re.compile(r"^node_(\d+)(?:\.(\S+))?\.log$")
"""A node's log of a step run on several nodes (a Slurm job's ``srun``), by the node's rank."""


def log_files(storage: Storage, output: str) -> list[LogFile]:
    """The step's log files under ``OUTPUT/logs``, oldest run first (host logs named ``slice_SS_worker_WW``,
    node logs ``node_NN``).

    A symbolic link planted there (``logs/step.log -> /etc/shadow``), or a ``logs`` folder that
    is one, is refused with a :class:`UserError` naming it: ``logs`` prints files of the
    output, never what a link points at.
    """
    folder = Storage.join(output, "logs")
    _refuse_link(storage, folder)
    out: list[LogFile] = []
    for name in storage.list_names(folder):
        step = _STEP_LOG.match(name)
        host = _HOST_LOG.match(name)
        if step is not None:
            _refuse_link(storage, Storage.join(folder, name))
            out.append(LogFile(Storage.join(folder, name), None, step[1] or "~"))  # "~" sorts after every stamp
        elif host is not None:
            _refuse_link(storage, Storage.join(folder, name))
            out.append(LogFile(Storage.join(folder, name), f"slice_{host[1]}_worker_{host[2]}", host[3] or "~"))
        elif (node := _NODE_LOG.match(name)) is not None:
            _refuse_link(storage, Storage.join(folder, name))
            out.append(LogFile(Storage.join(folder, name), f"node_{node[1]}", node[2] or "~"))
    return sorted(out, key=lambda f: (f.host or "", f.order))


def _refuse_link(storage: Storage, path: str) -> None:
    if storage.is_local and os.path.islink(path):  # object stores have no links
        raise UserError(f"{path} is a symbolic link; logs are never read through one")
