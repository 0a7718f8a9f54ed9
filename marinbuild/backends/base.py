"""The interface between the run and whatever executes a step: a backend, and a kind of backend.

A backend starts a :class:`Job` and reports its :class:`Outcome` through a callback, from
any thread; the scheduler never waits on a backend directly. ``cancel`` asks a running job
to stop (Ctrl-C, a lost lease, a wall-time limit). A :class:`Grant` is what admission
reserved for the job: cores to pin, environment, wall-time limit.

A backend runs **one attempt** of a job; retrying is the business of the one retry loop
(:mod:`marinbuild.backends.retrying`), which wraps every backend. An attempt's
:class:`Outcome` says how it ended (:class:`Cause`), and the loop draws on that cause's
budget. What else the loop asks of a backend is declared, with its default, on
:class:`BackendHooks`, which backends derive from (one that does not gets the defaults).

A **kind** of backend (local, Ray, Slurm, TPU slices over SSH) is what a run is told about
it: its name for ``--backend``, the cluster-file tables and run options it reads, and, once
planning shows it the steps, which steps it takes, what it refuses of their fields, whether
this machine's pools admit them, what it does before the run and the backend that runs them.
That half lives in :mod:`marinbuild.backends.kinds` (:class:`BackendKind`,
:class:`PlacedKind`), which a plan loads without this module, and is named here too. Kinds
are found by name in :mod:`marinbuild.backends.registry`; the session in ``execution/`` knows
no kind by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

# The kinds' half of the interface lives in its own module, which planning loads without this
# one (its dataclasses are a run's); named here too, where a backend from outside finds them.
from marinbuild.backends.kinds import BackendKind, PlacedKind, PlanInput, check_replicas

if TYPE_CHECKING:
    from marinbuild.resources import Request
    from marinbuild.store.lease_settings import LeaseSettings

__all__ = [
    "HELD_EXTRA",
    "PROGRESS_VAR",
    "Backend",
    "BackendHooks",
    "BackendKind",
    "Cause",
    "Grant",
    "Job",
    "Outcome",
    "PlacedKind",
    "PlanInput",
    "Running",
    "WireInput",
    "check_replicas",
    "hooks_of",
]

HELD_EXTRA = "held"
"""The key of :attr:`Job.extra` holding what the step holds while it runs (for accelerator-hours)."""
PROGRESS_VAR = "MARINBUILD_PROGRESS"
"""The variable naming the file a step touches or appends to, to show it is making progress."""


class Cause(StrEnum):
    """How one attempt ended; each retryable cause draws on a budget of its own.

    The values are what ``attempts.json`` records as an attempt's ``class``.
    """

    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    """The program failed: the (small) failure budget, ``max_retries_failure``."""
    PREEMPTED = "PREEMPTED"
    """A host or worker was taken away: the (large) preemption budget."""
    INFRA = "INFRA"
    """SSH, sync or launch trouble not caused by the program: ``max_retries_infra``."""
    PROVISIONING = "PROVISIONING"
    """No hosts could be had (capacity): retried until ``provision_timeout``, counted apart."""
    HANG = "HANG"
    """No progress (log and progress file unchanged) for ``progress_timeout``: ``max_retries_hang``."""
    TIMEOUT = "TIMEOUT"
    """Ran out of wall time: never retried."""
    CANCELLED = "CANCELLED"
    """The run was asked to stop: never retried."""


@dataclass(frozen=True)
class Grant:
    """What admission handed a step: the allocation to release later, and what it implies."""

    allocation: Any = None
    cores: tuple[int, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    timeout: float | None = None
    group: str | None = None


@dataclass(frozen=True)
class Job:
    """Everything a backend needs to execute one step once."""

    name: str
    output_path: str
    log_file: str
    """A local file receiving the step's stdout and stderr."""
    workdir: str
    env: Mapping[str, str]
    fn: Callable[[Any], Any] | None = None
    config: Any = None
    command: str | None = None
    cores: tuple[int, ...] = ()
    timeout: float | None = None
    attempt: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)
    previous_attempts: tuple[Mapping[str, Any], ...] | None = None
    """Attempts earlier runs of the step recorded in its ledger, read while it was prepared
    (off the run loop: on a remote store a read is a round trip); None: not read yet."""
    lost_attempt: bool = False
    """An earlier run started an attempt it never recorded (its runner was killed, leaving the
    step RUNNING): that attempt's number is not given again (``MARINBUILD_ATTEMPT`` names
    checkpoints and log folders)."""
    progress_timeout: float | None = None
    """Seconds without progress (log and ``$MARINBUILD_PROGRESS`` unchanged) after which the
    attempt is killed as a hang; None: never."""
    walltime: float | None = None
    """The step's declared wall time, when ``timeout`` is only what is left of it for this
    attempt (the retry loop counts wall time across attempts); None: ``timeout`` is the whole."""
    retries: Mapping[str, Any] | None = None
    """The retry loop's counts before this attempt (``{"failure": {"used": 1, "max": 3}, ...}``):
    the step's final counts if this attempt is its last, for a backend that writes the final
    status marker itself (a Ray task, beside the work)."""


def wall_time_exceeded(job: Job) -> str:
    """The one-line error of a job killed at its wall time, naming the wall time the step
    declared rather than the remainder its attempt was given."""
    declared = job.walltime if job.walltime is not None else job.timeout
    return f"timeout: exceeded its wall time of {declared:g} s"


@dataclass(frozen=True)
class Outcome:
    """How a job ended. ``error`` is one line for the summary when ``ok`` is false."""

    ok: bool
    started: float
    ended: float
    error: str | None = None
    returncode: int | None = None
    timed_out: bool = False
    cancelled: bool = False
    host: str | None = None
    """Where it ran, when not this machine (a Ray node)."""
    records: Mapping[str, str] = field(default_factory=dict)
    """Files to write with the step's record, before its final status (path -> text): the
    attempt ledger, so that it costs no round trip of its own."""
    cause: Cause | None = None
    """How the attempt ended, when the backend knows more than ``ok``/``timed_out``/``cancelled``
    say (a preemption, SSH trouble); see :attr:`kind`."""
    details: Mapping[str, Any] = field(default_factory=dict)
    """More fields for this attempt's ledger entry (the TPU backend: every host's exit code)."""
    fatal: bool = False
    """No retry can help (a refused host key): the loop stops whatever the budget."""
    retries: Mapping[str, Any] | None = None
    """Set by the retry loop on a step's last outcome: what the run used of each retry budget
    (``{"failure": {"used": 1, "max": 3}, ...}``), recorded in the step's final status marker."""
    capacity_wait: float = 0.0
    """Set by the retry loop on a step's last outcome: seconds the step waited for machines to
    be made for it (not part of :attr:`duration`), which the run's done line names apart."""

    @property
    def kind(self) -> Cause:
        """The attempt's cause: the backend's own, else read from the flags."""
        if self.cause is not None:
            return self.cause
        if self.ok:
            return Cause.SUCCESS
        if self.timed_out:
            return Cause.TIMEOUT
        if self.cancelled:
            return Cause.CANCELLED
        return Cause.FAILED

    @property
    def duration(self) -> float:
        return self.ended - self.started


class Running(Protocol):
    def cancel(self, reason: str) -> None:
        """Stop the job; its outcome still arrives through the callback."""


class Backend(Protocol):
    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Running:
        """Start ``job`` without blocking; call ``on_done`` exactly once when it ends."""


class BackendHooks:
    """What the retry loop asks of a backend beyond ``start``, each with the answer of a backend
    that needs nothing more (a local process). Backends derive from this class and override
    what differs; the loop calls these and never looks for other names."""

    label: ClassVar[str] = "local"
    """The backend's name in ``attempts.json`` (``backend``) and in each attempt's log header."""
    announces_start: ClassVar[bool] = False
    """An attempt may wait for resources after ``start`` (a Ray task queued for a node, a Slurm
    job pending) and rewrites the step's ``RUNNING`` marker once it really starts; the loop's
    hang clock starts there, so waiting is never taken for a hang."""

    def watches_progress(self, job: Job) -> bool:
        """Whether the backend looks after hangs of ``job`` itself (the TPU gang watches every
        host's log and progress file); otherwise the loop watches ``job.log_file`` and the
        ``$MARINBUILD_PROGRESS`` file on this machine."""
        return False

    def requeued(self, job: Job) -> bool:
        """Whether the attempt, silent now, lost its worker and waits to run again within the
        same attempt (Ray reruns a task whose worker died; Slurm requeues a job): asked before
        a silent attempt is called a hang, which then is not, and its clock starts again."""
        return False

    def ledger_head(self, job: Job) -> Mapping[str, Any]:
        """Fields the backend adds at the top of the step's ``attempts.json``."""
        return {}

    def step_ended(self, job: Job) -> None:
        """Called once after the step's last attempt (per-step state may go), before its ledger is written."""

    def capacity_wait(self, job: Job) -> float:
        """Called right after :meth:`step_ended`: seconds the step's attempts waited for machines
        made for them to exist (shown apart from the step's duration); 0 for a backend that makes none."""
        return 0.0

    def amend_ledger(self, job: Job, entries: list[dict[str, Any]]) -> None:
        """Called right after :meth:`step_ended`; may correct earlier attempts' entries with what
        only the step's end settled (a queued resource whose delete failed at its attempt's end,
        deleted at the step's)."""

    def header_host(self, job: Job) -> str:
        """Where the attempt's log header says it runs: this machine, unless the backend knows better."""
        import socket

        return socket.gethostname()


_NO_HOOKS = BackendHooks()


def hooks_of(backend: Any) -> BackendHooks:
    """The hooks of ``backend``: its own when it derives from :class:`BackendHooks`, else the defaults."""
    return backend if isinstance(backend, BackendHooks) else _NO_HOOKS


@dataclass(frozen=True)
class WireInput:
    """What a kind is given to build its backend once the run starts."""

    project: Any
    requests: Mapping[str, Request]
    images: Mapping[str, tuple[str, str]]
    """Step name -> (engine, image) for the steps planning put in containers on this machine."""
    lease: LeaseSettings
    """The one lease policy: a fence beside remote work reads and kills by it."""
    echo: Callable[[str], None]
    """Lines for the user beside the reporter's events."""
    output: Callable[[str], None]
    """Where a remote host's output lines go (nowhere unless the run prints step output)."""
    sync: bool = True
    """Copy the project directory to remote hosts before a step runs there."""
    fresh_output: bool = False
