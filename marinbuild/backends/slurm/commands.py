"""Slurm's command line as marinbuild uses it: sbatch, one squeue for all jobs, sacct, scancel.

Every call has a time limit and fails as one :class:`~marinbuild.errors.InfraError`-style line
(:class:`SlurmError`); ``squeue`` is asked about all of a run's jobs at once, never one per job.
A job's state becomes a :class:`~marinbuild.backends.base.Cause` with :func:`cause_of`.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Cause
from marinbuild.errors import MarinbuildError

__all__ = [
    "COMMENT_PREFIX",
    "JobState",
    "SlurmError",
    "accounting_on",
    "cancel",
    "cause_of",
    "query",
    "query_accounting",
    "submit",
    "wait_stopped",
]

COMMENT_PREFIX = "marinbuild"
"""A job's comment is ``marinbuild RUN_TAG OUTPUT_PATH``: the run it belongs to and the step's output."""
TIMEOUT_S = 60.0
_FIELDS = ("JobID", "Name", "State", "Reason", "Comment", "StartTime", "EndTime", "NodeList", "RestartCnt")

_CAUSES = {
    "COMPLETED": Cause.SUCCESS,
    "FAILED": Cause.FAILED,
    "OUT_OF_MEMORY": Cause.FAILED,
    "PREEMPTED": Cause.PREEMPTED,
    "NODE_FAIL": Cause.PREEMPTED,
    "BOOT_FAIL": Cause.PREEMPTED,
    "TIMEOUT": Cause.TIMEOUT,
    "DEADLINE": Cause.TIMEOUT,
    "CANCELLED": Cause.CANCELLED,
}
_ENDED = {*_CAUSES, "REVOKED", "SPECIAL_EXIT"}


class SlurmError(MarinbuildError):
    """A Slurm command failed or could not be run; the message is one line.

    ``refused``: Slurm (or the command itself) refused what was asked (an unknown partition, an
    argument sbatch does not know): asking again cannot help. Otherwise the trouble may pass
    (a controller away, munge down)."""

    def __init__(self, message: str, *, refused: bool = False) -> None:
        super().__init__(message)
        self.refused = refused


_PASSING = ("unable to contact slurm controller", "socket timed out", "temporarily unable", "zero bytes were transmitted",
            "connection refused", "connection timed out", "communication connection failure", "munge",
            "authentication", "credential", "slurmctld")
"""What a Slurm command says when the trouble is the cluster's, not the request's."""


def _slurm_said(text: str) -> str:
    """What a Slurm command printed on failing, as one line: its error lines without their
    ``sbatch: error:`` prefix and without ``Try "sbatch --help"``.

    >>> _slurm_said("sbatch: error: Invalid --time specification")
    'Invalid --time specification'
    >>> _slurm_said('''sbatch: unrecognized option '--foo'
    ... Try "sbatch --help" for more information''')
    "unrecognized option '--foo'"
    """
    lines = []
    for line in text.strip().splitlines():
        line = line.strip()
        if not line or (line.startswith("Try ") and "--help" in line):
            continue
        for prefix in ("error:", "fatal:"):
            head, sep, rest = line.partition(f" {prefix} ")
            if sep and " " not in head:
                line = rest
        head, sep, rest = line.partition(": ")
        if sep and head in ("sbatch", "squeue", "scancel", "sacct", "scontrol"):
            line = rest
        lines.append(line)
    return "; ".join(lines)[:500] or "no message"


@dataclass(frozen=True)
class JobState:
    """One job as ``squeue`` (or ``sacct``) shows it."""

    job_id: int
    name: str
    state: str
    reason: str = ""
    comment: str = ""
    start: float | None = None
    end: float | None = None
    nodes: str = ""
    restarts: int = 0

    @property
    def ended(self) -> bool:
        return self.state in _ENDED

    @property
    def tag(self) -> str | None:
        """The run tag in the job's comment; None for a job marinbuild did not submit."""
        words = self.comment.split(" ", 2)
        return words[1] if len(words) == 3 and words[0] == COMMENT_PREFIX else None

    @property
    def output_path(self) -> str | None:
        words = self.comment.split(" ", 2)
        return words[2] if len(words) == 3 and words[0] == COMMENT_PREFIX else None


def cause_of(state: str) -> Cause:
    """The cause of an attempt whose job ended in ``state`` (``CANCELLED by 0`` reads as CANCELLED).

    >>> cause_of("NODE_FAIL"), cause_of("OUT_OF_MEMORY"), cause_of("CANCELLED by 0")
    (<Cause.PREEMPTED: 'PREEMPTED'>, <Cause.FAILED: 'FAILED'>, <Cause.CANCELLED: 'CANCELLED'>)
    """
    return _CAUSES.get(state.split(" ", 1)[0], Cause.FAILED)


def _run(argv: Sequence[str], *, timeout: float = TIMEOUT_S, env: Mapping[str, str] | None = None,
         stdin: str | None = None) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False,
                              env=dict(env) if env is not None else None, input=stdin)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: is this a Slurm login node (slurm-client installed)?") from None
    if done.returncode != 0:
        why = _slurm_said(done.stderr or done.stdout)
        if any(p in why.lower() for p in _PASSING):
            raise SlurmError(f"{argv[0]} failed (exit {done.returncode}): {why}")
        # The command ran and said no: to its arguments (exit 255 from sbatch), or the controller
        # to the request ("Batch job submission failed: Invalid partition name specified").
        raise SlurmError(f"{argv[0]} failed (exit {done.returncode}): {why}", refused=True)
    return done.stdout


def submit(args: Sequence[str], script: str, env: Mapping[str, str], timeout: float = TIMEOUT_S) -> int | None:
    """Submit ``script`` with ``sbatch args``; the job id, or None when sbatch timed out (it may
    or may not have been submitted: reconcile by tag before sending it again)."""
    try:
        out = _run(["sbatch", "--parsable", *args], timeout=timeout, env=env, stdin=script)
    except subprocess.TimeoutExpired:
        return None
    return int(out.strip().split(";", 1)[0])


def query(job_ids: Iterable[int] | None = None, timeout: float = TIMEOUT_S) -> dict[int, JobState]:
    """Every job asked about (None: every job Slurm still shows) in one ``squeue``; a job Slurm no
    longer shows is absent."""
    ids = sorted(set(job_ids)) if job_ids is not None else None
    if ids is not None and not ids:
        return {}
    argv = ["squeue", "--states=all", "--noheader", "-O", ",".join(f"{f}:|" for f in _FIELDS)]
    if ids is not None:
        argv.append(f"--jobs={','.join(map(str, ids))}")
    try:
        out = _run(argv, timeout=timeout)
    except SlurmError as e:
        if ids is not None and "Invalid job id" in str(e):
            return {}  # every one of them is gone from squeue
        raise
    return {s.job_id: s for s in (_parse(line) for line in out.splitlines()) if s is not None}


def _parse(line: str) -> JobState | None:
    parts = line.rstrip("\n").split("|")
    if len(parts) < len(_FIELDS) or not parts[0].strip().isdigit():
        return None
    job, name, state, reason, comment, start, end, nodes, restarts = (p.strip() for p in parts[: len(_FIELDS)])
    return JobState(int(job), name, state, "" if reason == "None" else reason,
                    "" if comment == "(null)" else comment, _time(start), _time(end), nodes,
                    int(restarts) if restarts.isdigit() else 0)


def _time(text: str) -> float | None:
    try:
        return time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None


_accounting: dict[str, bool] = {}


def accounting_on() -> bool:
    """Whether the cluster keeps accounting (``sacct`` answers); asked once per process."""
    key = os.environ.get("SLURM_CONF", "")
    if key not in _accounting:
        try:
            shown = _run(["scontrol", "show", "config"])
        except (SlurmError, subprocess.TimeoutExpired):
            shown = ""
        storage = next((line.split("=", 1)[1].strip() for line in shown.splitlines()
                        if line.startswith("AccountingStorageType")), "accounting_storage/none")
        _accounting[key] = storage != "accounting_storage/none"
    return _accounting[key]


def query_accounting(job_ids: Iterable[int], timeout: float = TIMEOUT_S) -> dict[int, JobState]:
    """Jobs ``squeue`` no longer shows, from accounting, in one ``sacct``; {} where accounting is off."""
    ids = sorted(set(job_ids))
    if not ids or not accounting_on():
        return {}
    out = _run(["sacct", "--noheader", "--parsable2", "-X", f"--jobs={','.join(map(str, ids))}",
                "--format=JobID,JobName,State,Reason,Comment,Start,End,NodeList,Restarts"], timeout=timeout)
    found: dict[int, JobState] = {}
    for line in out.splitlines():
        state = _parse(line + "|")
        if state is not None:
            found[state.job_id] = state
    return found


def cancel(job_ids: Iterable[int], timeout: float = TIMEOUT_S, **flags: Any) -> None:
    """``scancel`` the jobs (one call for all); a job already gone is no error."""
    ids = sorted(set(job_ids))
    if not ids:
        return
    try:
        _run(["scancel", *(f"--{k}={v}" for k, v in flags.items()), *map(str, ids)], timeout=timeout)
    except SlurmError as e:
        if "Invalid job id" not in str(e):
            raise


STOP_WAIT_S = 180.0
"""How long a cancelled job may take to stop: Slurm's ``KillWait`` (30 s by default) between
SIGTERM and SIGKILL, and its ``UnkillableStepTimeout`` (60 s) after."""


def wait_stopped(job_ids: Iterable[int], timeout: float = STOP_WAIT_S, poll: float = 0.5) -> list[int]:
    """Wait until none of the (cancelled) jobs still runs anywhere: Slurm shows a job COMPLETING
    while its processes are being killed; the ids of those still not ended after ``timeout``."""
    waiting = sorted(set(job_ids))
    deadline = time.monotonic() + timeout
    while waiting:
        seen = query(waiting)
        waiting = [i for i in waiting if i in seen and not seen[i].ended]
        if not waiting or time.monotonic() >= deadline:
            break
        time.sleep(poll)
    return waiting
