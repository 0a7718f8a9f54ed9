"""``marinbuild logs STEP``: print (or follow) what a step printed, by attempt, and per host for TPU steps.

Without ``--attempt`` the latest attempt is shown; each attempt's text begins with its
header line (attempt, time, host, backend; see :mod:`marinbuild.store.step_logs`). A TPU
step has one log per host: every host's part is shown one after the other, or one host's
with ``--host`` (its address as the cluster file gives it, or ``slice_SS_worker_WW``).
``-f`` follows the log while the step runs and returns when it has ended.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import PrefixOpt, VerboseOpt, complete_steps, step_targets
from marinbuild.cli.printing import err
from marinbuild.errors import UserError

if TYPE_CHECKING:
    from marinbuild.project import Project
    from marinbuild.store.step_logs import LogFile, LogPart

__all__ = ["logs_command"]

_POLL_S = 0.2


@handles_errors
def logs_command(
    step: Annotated[str, typer.Argument(help="The step: its name or its output path.", autocompletion=complete_steps)],
    file: Annotated[str, typer.Option("--file", help="The Marinfile to load.")] = "Marinfile.py",
    prefix: PrefixOpt = None,
    follow: Annotated[bool, typer.Option("-f", "--follow", help="Keep printing what the step appends until it has ended.")] = False,
    attempt: Annotated[int | None, typer.Option("--attempt", min=1, help="This attempt's log instead of the latest one.")] = None,
    host: Annotated[str | None, typer.Option("--host", help="A TPU or Slurm step's log on this host only (address, slice_SS_worker_WW, a Slurm node, node_NN).")] = None,
    verbose: VerboseOpt = False,
) -> None:
    """Print a step's log: the latest attempt, or --attempt N; TPU steps per host (--host)."""
    from marinbuild.cli.startup import opened_project
    from marinbuild.planner import select

    project = opened_project(file, prefix)
    names = select(project.graph, step_targets(project, [step]))
    if len(names) != 1:
        raise UserError(f"{step!r} names {len(names)} steps; logs shows one: {', '.join(names[:5])}")
    name = names[0]
    output = _output_with_logs(project, name)
    files = _chosen_files(project, name, output, host)
    parts = _parts(project, files)
    shown = _select_attempt(name, parts, attempt)
    for i, (log_file, part) in enumerate(shown):
        if log_file.host is not None and (len(shown) > 1 or host is None):
            sys.stdout.write(f"--- {_host_label(log_file, part)} ---\n")
        text = part.text
        sys.stdout.write(text if text.endswith("\n") or not text else text + "\n")
        if i + 1 < len(shown):
            sys.stdout.write("\n")
    sys.stdout.flush()
    if follow:
        target = shown[-1][0] if shown else files[-1]
        on_disk = project.storage.local_file(target.path)
        if on_disk is None:
            err.print("marinbuild: note: -f follows logs on a local prefix only; a remote log is uploaded when its run ends", markup=False)
            return
        _follow(project, output, on_disk, attempt)


def _output_with_logs(project: Project, name: str) -> str:
    """The current identity's output when it has logs, else the latest earlier identity's (said on stderr)."""
    from marinbuild.history import RunIndex, earlier_info
    from marinbuild.store.storage import Storage

    node = project.graph.nodes[name]
    storage = project.storage
    if storage.list_names(Storage.join(node.output_path, "logs")):
        return node.output_path
    info = earlier_info(storage, node, RunIndex(storage, project.graph, [name]))
    earlier = info.get("output_path") if info else None
    if isinstance(earlier, str) and storage.list_names(Storage.join(earlier, "logs")):
        err.print(f"marinbuild: note: {name} never ran as it is now ({node.identity}); showing its run at {earlier}", markup=False)
        return earlier
    raise UserError(f"no log of step {name}: it never ran under {project.graph.prefix}")


def _chosen_files(project: Project, name: str, output: str, host: str | None) -> list[LogFile]:
    from marinbuild.store.step_logs import log_files

    found = log_files(project.storage, output)
    per_host = [f for f in found if f.host is not None]
    if host is None:
        return per_host or found
    if not per_host:
        raise UserError(f"step {name} has no per-host logs (only TPU and Slurm steps do); drop --host")
    chosen = [f for f in per_host if f.host == host]
    if chosen:
        return chosen
    by_header = [f for f in per_host if any(p.host == host for _, p in _parts(project, [f]))]
    if by_header:
        return by_header
    hosts = sorted({f.host for f in per_host if f.host} | {p.host for _, p in _parts(project, per_host) if p.host})
    raise UserError(f"step {name} has no log for host {host!r}; hosts: {', '.join(hosts)}")


def _parts(project: Project, files: list[LogFile]) -> list[tuple[LogFile, LogPart]]:
    from marinbuild.store.step_logs import attempts_in

    out: list[tuple[LogFile, LogPart]] = []
    for f in files:
        try:
            text = project.storage.read_text(f.path)
        except (OSError, UnicodeDecodeError):
            text = None
        if text:
            out.extend((f, part) for part in attempts_in(text))
    return out


def _select_attempt(
    name: str, parts: list[tuple[LogFile, LogPart]], attempt: int | None
) -> list[tuple[LogFile, LogPart]]:
    numbered = [p.attempt for _, p in parts if p.attempt is not None]
    if attempt is None:
        if not numbered:
            return parts  # a log written before attempts had headers: all of it
        attempt = max(numbered)
    chosen = [(f, p) for f, p in parts if p.attempt == attempt]
    if not chosen:
        known = ", ".join(str(n) for n in sorted(set(numbered))) or "none"
        raise UserError(f"no attempt {attempt} in the logs of {name}; attempts logged: {known}")
    return chosen


def _host_label(f: LogFile, part: LogPart) -> str:
    return f"host {part.host} ({f.host})" if part.host and part.host != f.host else f"host {f.host}"


def _follow(project: Project, output: str, path: str, attempt: int | None) -> None:
    """Print what is appended to ``path`` until the step's status is no longer RUNNING and the log is quiet."""
    from marinbuild.store.markers import RUNNING, read_status

    try:
        offset = os.path.getsize(path)
    except OSError:
        offset = 0
    while True:
        running = (record := read_status(project.storage, output)) is not None and record.status == RUNNING
        offset, grew = _copy_new(path, offset)
        if not running and not grew:
            return
        if not grew:
            time.sleep(_POLL_S)


def _copy_new(path: str, offset: int) -> tuple[int, bool]:
    from marinbuild.store.storage import open_regular

    try:
        # O_NOFOLLOW: a link planted while following is not read through either.
        with os.fdopen(open_regular(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            if os.fstat(f.fileno()).st_size < offset:
                offset = 0  # moved aside for a new run: this is the new run's log
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset, False
    if data:
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()
    return offset + len(data), bool(data)
