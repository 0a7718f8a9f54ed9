"""Attempts of a step on TPU slices over SSH: one attempt run and classified at a time.

The TPU backend, like every backend, runs one attempt and says how it ended (success,
failure, preemption, SSH trouble, hang); the one retry loop
(:mod:`marinbuild.backends.retrying`) decides whether another follows, with the budgets of
the step. :class:`TpuStep` keeps what lasts from one attempt to the next (the packed
project, the hosts that answered before, the per-host logs); :class:`TpuAttempts` is the
backend the loop wraps, and :meth:`TpuAttempts.run_attempt` is the hook where hosts are had
for an attempt::

    job = TpuJob(name="train", output_path="gs://b/train-3f2a", command="python train.py",
                 env={"SEED": "0"}, slices=("pod-a",))
    result = run_tpu_step(job, load_cluster("cluster.toml"), workdir=".",
                          cancel=threading.Event(), console=print)
    result.status   # "SUCCESS", "FAILED", "PREEMPTED", "INFRA", "HANG" or "CANCELLED"

Every host gets ``MARINBUILD_*`` variables (and ``MEGASCALE_*`` for more than one slice)
describing its place in the gang, computed from this attempt's hosts; see :func:`host_env`.
"""

from __future__ import annotations

import os
import queue
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from marinbuild.backends.base import HELD_EXTRA, BackendHooks, Cause, Job, Outcome, wall_time_exceeded
from marinbuild.backends.retrying import RetryBudgets, Retrying
from marinbuild.backends.retrying import backoff_delay as backoff_delay  # the one policy, re-exported
from marinbuild.backends.tpu.attempt_logs import AttemptLogs
from marinbuild.backends.tpu.cluster import Cluster, SliceSpec
from marinbuild.backends.tpu.gang import TOKEN_VAR, Gang, HostPlan
from marinbuild.backends.tpu.gang_outcome import GangOutcome, HostOutcome
from marinbuild.backends.tpu.preemption import is_preempted
from marinbuild.backends.tpu.provision_plan import is_created_slice
from marinbuild.backends.tpu.ssh import HostTarget, export_env, resolve_target
from marinbuild.backends.tpu.workdir_sync import PackedWorkdir, pack_workdir
from marinbuild.errors import ClusterConfigError, MarinbuildError, StepDefinitionError
from marinbuild.redact import redact_env, scrub, secret_values
from marinbuild.store.attempt_ledger import iso_time, write_progress_note
from marinbuild.store.step_logs import attempt_header
from marinbuild.store.storage import Storage
from marinbuild.tpu_types import tpu_topology

__all__ = [
    "AttemptCancel",
    "ProvisioningFailed",
    "TpuAttempt",
    "TpuAttempts",
    "TpuJob",
    "TpuResult",
    "TpuStatus",
    "TpuStep",
    "backoff_delay",
    "cut_short",
    "host_env",
    "run_tpu_step",
]

TpuStatus = Literal["SUCCESS", "FAILED", "PREEMPTED", "INFRA", "PROVISIONING", "HANG", "TIMEOUT", "CANCELLED"]


@dataclass(frozen=True)
class TpuJob:
    """A step to run on TPU hosts.

    ``output_path`` is the step's output directory (fsspec URL or absolute local path);
    ``command`` is one shell command line run on every host, in the synced workdir;
    ``slices`` are the allocated slice names, slice 0 first.
    """

    name: str
    output_path: str
    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    slices: tuple[str, ...] = ()
    budgets: RetryBudgets = field(default_factory=RetryBudgets)
    """How many retries each cause may take (:class:`~marinbuild.backends.retrying.RetryBudgets`)."""
    setup: str = ""
    """Shell lines every host runs before ``command`` in the same shell (building the
    step's Python environment); kept out of ``attempts.json``."""
    previous_attempts: tuple[Mapping[str, Any], ...] | None = None
    """What earlier runs recorded in the ledger, when already read (``Job.previous_attempts``)."""
    lost_attempt: bool = False
    """An earlier run's attempt was never recorded (``Job.lost_attempt``)."""
    progress_timeout: float | None = None
    """Seconds without progress on any host (logs and ``$MARINBUILD_PROGRESS``) before a hang."""


@dataclass(frozen=True)
class TpuAttempt:
    """One attempt as recorded in ``attempts.json``."""

    number: int
    classification: Cause
    started_at: float
    ended_at: float
    first_failed_host: str | None
    message: str
    hosts: tuple[HostOutcome, ...]
    teardown_s: float | None = None
    synced_hosts: int = 0
    last_progress_at: float | None = None
    """For a hang: when a host's log or progress file last changed (this machine's clock)."""
    fatal: bool = False
    """A refused host key or login: retrying cannot help."""

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {h.host: h.exit_code for h in self.hosts}

    @property
    def exit_code(self) -> int | None:
        """The ledger's one exit code: 0 on success, else the first failed host's."""
        if self.classification is Cause.SUCCESS:
            return 0
        return self.exit_codes.get(self.first_failed_host or "") if self.first_failed_host else None

    @property
    def preempted_hosts(self) -> tuple[str, ...]:
        return tuple(h.host for h in self.hosts if is_preempted(h.observation()))

    def details(self) -> dict[str, Any]:
        """What the ledger entry holds beyond every backend's fields."""
        out: dict[str, Any] = {
            "host": self.first_failed_host or (self.hosts[0].host if self.hosts else None),
            "first_failed_host": self.first_failed_host,
            "exit_codes": self.exit_codes,
            "preempted_hosts": list(self.preempted_hosts),
            "teardown_s": None if self.teardown_s is None else round(self.teardown_s, 3),
            "synced_hosts": self.synced_hosts,
            "hosts": [
                {
                    "host": h.host,
                    "slice": h.slice_index,
                    "worker": h.worker_index,
                    "exit_code": h.exit_code,
                    "connection_lost": h.connection_lost,
                    "reachable": h.reachable,
                    "metadata_preempted": h.metadata_preempted,
                    "infra_error": h.infra_error,
                    "torn_down": h.torn_down,
                    "survivors": list(h.survivors),
                }
                for h in self.hosts
            ],
        }
        if self.last_progress_at is not None:
            out["last_progress_at"] = iso_time(self.last_progress_at)
        return out


@dataclass(frozen=True)
class TpuResult:
    """How the step ended: the last attempt's class, every attempt, and why it failed."""

    status: TpuStatus
    attempts: tuple[TpuAttempt, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"


class ProvisioningFailed(MarinbuildError):
    """No hosts could be had for an attempt (no capacity, a queued resource FAILED).

    Raised from :meth:`TpuAttempts.run_attempt` by whatever acquires hosts; the attempt is
    then a ``PROVISIONING`` one, retried until the step's ``provision_timeout``. (Any other
    :class:`~marinbuild.errors.MarinbuildError` raised there ends the step: no retry.)
    """


def host_env(
    *,
    slice_index: int,
    worker_index: int,
    num_slices: int,
    workers_per_slice: int,
    coordinator_host: str,
    coordinator_port: int,
    megascale_port: int,
    output_path: str,
    attempt: int,
) -> dict[str, str]:
    """The variables telling one host where it sits in the gang.

    >>> env = host_env(slice_index=1, worker_index=2, num_slices=2, workers_per_slice=4,
    ...                coordinator_host="10.0.0.2", coordinator_port=8476, megascale_port=8081,
    ...                output_path="gs://b/out", attempt=1)
    >>> env["MARINBUILD_PROCESS_ID"], env["MEGASCALE_COORDINATOR_ADDRESS"]
    ('6', '10.0.0.2:8081')
    """
    env = {
        "MARINBUILD_SLICE_ID": str(slice_index),
        "MARINBUILD_WORKER_ID": str(worker_index),
        "MARINBUILD_NUM_SLICES": str(num_slices),
        "MARINBUILD_PROCESS_ID": str(slice_index * workers_per_slice + worker_index),
        "MARINBUILD_NUM_PROCESSES": str(num_slices * workers_per_slice),
        "MARINBUILD_COORDINATOR_ADDRESS": f"{coordinator_host}:{coordinator_port}",
        "MARINBUILD_OUTPUT": output_path,
        "MARINBUILD_ATTEMPT": str(attempt),
    }
    if num_slices > 1:
        env.update(
            MEGASCALE_COORDINATOR_ADDRESS=f"{coordinator_host}:{megascale_port}",
            MEGASCALE_NUM_SLICES=str(num_slices),
            MEGASCALE_PORT=str(megascale_port),
            MEGASCALE_SLICE_ID=str(slice_index),
        )
    return env


def _check_slices(name: str, specs: Sequence[SliceSpec]) -> None:
    if not specs:
        raise ClusterConfigError(f"step {name!r}: no TPU slice was allocated to it")
    counts = {s.name: len(s.hosts) for s in specs}
    if len(set(counts.values())) > 1:
        raise ClusterConfigError(f"step {name!r}: slices of one step need equal host counts, got {counts}")


class TpuStep:
    """One TPU step across its attempts: what stays the same from one attempt to the next.

    Bad input (an unknown slice, an invalid variable name) raises a
    :class:`~marinbuild.errors.UserError` here, before any host is touched. ``staging_dir``
    keeps the per-host logs of a step whose output is not on this machine's disk.
    """

    def __init__(
        self,
        job: TpuJob,
        cluster: Cluster,
        *,
        packed: PackedWorkdir | None,
        staging_dir: str,
        console: Callable[[str], None],
        output: Callable[[str], None] | None = None,
    ) -> None:
        self.job = job
        self.cluster = cluster
        # Slices created on demand (``@gcp/...``) have no spec until an attempt creates them.
        self.specs = tuple(cluster.slice(n) for n in job.slices if not is_created_slice(n))
        if self.specs:
            _check_slices(job.name, self.specs)
        try:
            export_env(job.env)
        except ValueError as e:
            raise StepDefinitionError(f"step {job.name!r}: {e}") from None
        self.packed = packed
        self.staging_dir = staging_dir
        self.console = console
        self.output = output
        self.secrets = secret_values(job.env)
        self.logs = AttemptLogs(job.output_path, os.path.join(staging_dir, "staging"))
        self.token = secrets.token_hex(6)
        self.answered: set[str] = set()  # hosts that answered SSH in an attempt: silence later is preemption
        self.attempts: list[TpuAttempt] = []
        self.ended_as: dict[int, Cause] = {}
        """How each attempt ended as the retry loop counts it (a wall time turns a cancel into a
        TIMEOUT), those that never reached a host (no slice provisioned) included."""

    def ledger_head(self) -> dict[str, Any]:
        """What ``attempts.json`` says about the step at its top: command, env, static slices."""
        return {
            "command": scrub(self.job.command, self.secrets),
            "env": redact_env(self.job.env),
            "slices": [{"name": s.name, "tpu_type": s.tpu_type, "hosts": list(s.hosts)} for s in self.specs],
        }

    def held(self, specs: Sequence[SliceSpec]) -> dict[str, Any]:
        return {"cores": 0, "tpu_type": specs[0].tpu_type, "slices": len(specs),
                "tpu_chips": sum(tpu_topology(s.tpu_type).chips for s in specs),
                "tpu_hosts": sum(len(s.hosts) for s in specs)}

    def attempt(
        self,
        number: int,
        cancel: threading.Event,
        slices: Sequence[SliceSpec] | None = None,
        targets: Sequence[Sequence[HostTarget]] | None = None,
        verdict: Callable[[TpuAttempt], TpuAttempt] | None = None,
    ) -> TpuAttempt:
        """Run attempt ``number`` on every host of ``slices`` (default: the step's static slices).

        ``verdict`` may reclassify the attempt before it is printed and recorded (created
        slices: the TPU API saying a node was preempted outranks what the hosts saw).

        ``targets`` (per slice, per worker) replaces the addresses resolved from the slices'
        host lists, e.g. with host keys reported by the TPU API. Every ``MARINBUILD_*`` and
        ``MEGASCALE_*`` value is computed from these hosts. Never raises for host trouble.
        """
        job = self.job
        specs = tuple(slices) if slices is not None else self.specs
        _check_slices(job.name, specs)
        hosts = [list(t) for t in targets] if targets is not None else [
            [resolve_target(h, s.ssh) for h in s.hosts] for s in specs
        ]
        slice0 = specs[0]
        coordinator = slice0.internal_addresses[0] if slice0.internal_addresses else hosts[0][0].hostname
        workers = len(slice0.hosts)
        prefix = f"[{job.name}] "
        plans = [
            HostPlan(
                slice_name=spec.name, slice_index=s, worker_index=w, entry=entry, target=hosts[s][w], settings=spec.ssh,
                env={
                    **job.env,
                    **host_env(
                        slice_index=s, worker_index=w, num_slices=len(specs), workers_per_slice=workers,
                        coordinator_host=coordinator, coordinator_port=slice0.ssh.coordinator_port,
                        megascale_port=slice0.ssh.megascale_port, output_path=job.output_path, attempt=number,
                    ),
                    TOKEN_VAR: f"{self.token}-a{number}-s{s}-w{w}",
                },
            )
            for s, spec in enumerate(specs)
            for w, entry in enumerate(spec.hosts)
        ]
        self.console(f"{prefix}attempt {number} on {', '.join(s.name for s in specs)}")
        outcome = Gang(
            plans,
            command=job.setup + job.command,
            logs=self.logs,
            workdir=self.packed,
            console=self.console if self.output is None else self.output,  # slice 0 worker 0's lines
            console_prefix=prefix,
            cancel=cancel,
            max_parallel=self.cluster.max_parallel,
            secrets=self.secrets,
            log_header=attempt_header(number, time.time(), "{host}", "tpu"),  # the gang fills in each host
            answered_before=frozenset(self.answered),
            lease_of=job.output_path,
            progress_timeout=job.progress_timeout,
            on_moved=self._note_progress(number),
        ).run()
        self.answered.update(h.host for h in outcome.hosts if h.answered)
        attempt = self._attempt(number, outcome)
        if verdict is not None:
            attempt = verdict(attempt)
        self.attempts.append(attempt)
        self.logs.publish()
        self.console(f"{prefix}attempt {number}: {attempt.classification.value}: {attempt.message}")
        return attempt

    def _note_progress(self, number: int) -> Callable[[float], None] | None:
        timeout, out = self.job.progress_timeout, self.job.output_path
        if timeout is None:
            return None
        return lambda last: write_progress_note(out, number, last, timeout)

    def _attempt(self, number: int, outcome: GangOutcome) -> TpuAttempt:
        return TpuAttempt(
            number=number,
            classification=outcome.classification,
            started_at=outcome.started_at,
            ended_at=outcome.ended_at,
            first_failed_host=outcome.first_failed or next(
                (h.host for h in outcome.hosts if h.infra_error or h.reachable is False or h.connection_lost), None
            ),
            message=scrub(outcome.summary(), self.secrets),
            hosts=outcome.hosts,
            teardown_s=outcome.teardown_s,
            synced_hosts=outcome.synced_hosts,
            last_progress_at=outcome.last_progress_at,
            fatal=any(h.fatal for h in outcome.hosts),
        )

    def outcome_of(self, attempt: TpuAttempt, specs: Sequence[SliceSpec] | None = None) -> Outcome:
        """The attempt as the retry loop sees it: its cause, and its ledger fields."""
        cls = attempt.classification
        error = None if cls is Cause.SUCCESS else f"attempt {attempt.number} {cls.value}: {attempt.message}"
        held = self.held(specs if specs is not None else self.specs)
        return Outcome(
            ok=cls is Cause.SUCCESS, started=attempt.started_at, ended=attempt.ended_at, error=error,
            returncode=attempt.exit_code, cancelled=cls is Cause.CANCELLED, cause=cls,
            details={**attempt.details(), HELD_EXTRA: held}, fatal=attempt.fatal,
        )

    def summary(self) -> str:
        """One line for the step's log once it ended: every attempt, hosts reached or not, as the ledger has it."""
        ended = {a.number: a.classification for a in self.attempts} | self.ended_as
        classes = ", ".join(ended[n].value for n in sorted(ended))
        return f"{len(ended)} attempt(s): {classes or 'none finished'}; per-host logs in logs/slice_*_worker_*.log"


class AttemptCancel(threading.Event):
    """Set to stop an attempt; ``timed_out`` when the step's wall time ran out.

    The difference matters to what the attempt still does on its way out: a runner stopping
    (Ctrl-C, SIGTERM) waits only so long for its steps, a step whose wall time ran out does
    not (the run goes on), so only the former cuts short the deletes of its slices.
    """

    def __init__(self) -> None:
        super().__init__()
        self.timed_out = False


def cut_short(cancel: threading.Event) -> bool:
    """Whether ``cancel`` stops its attempt in a hurry: set, and not by the step's wall time."""
    return cancel.is_set() and not (isinstance(cancel, AttemptCancel) and cancel.timed_out)


class TpuAttempts(BackendHooks):
    """The backend the retry loop wraps for TPU steps: each ``start`` runs one attempt.

    ``step_for(job)`` gives the :class:`TpuStep` of a job, the same one for every attempt of
    the step; :meth:`step_ended` lets it go. The gang watches progress on every host
    (``watches_progress``), so the loop does not watch local files for it.

    **The per-attempt hook.** :meth:`run_attempt` runs one attempt and classifies it. To run
    each attempt on hosts of its own (a queued resource created for it and deleted after),
    override it and wrap the acquisition around :meth:`TpuStep.attempt`::

        def run_attempt(self, step, job, cancel):
            # raises ProvisioningFailed when no capacity: retried until provision_timeout
            with provisioner.slices_for(job, cancel) as (specs, targets):   # waits for ACTIVE
                attempt = step.attempt(job.attempt, cancel, specs, targets)
            outcome = step.outcome_of(attempt, specs)
            # the API may know better than SSH: a PREEMPTED node makes it a preemption
            if provisioner.was_preempted(job):
                outcome = dataclasses.replace(outcome, cause=Cause.PREEMPTED)
            return outcome

    The hosts are released when the block ends, whatever the attempt's outcome; the loop then
    decides, from the outcome's cause, whether another attempt follows (on new hosts).
    """

    label = "tpu"

    def watches_progress(self, job: Job) -> bool:
        return True

    def __init__(self, step_for: Callable[[Job], TpuStep]) -> None:
        self._step_for = step_for
        self._steps: dict[str, TpuStep] = {}
        self._lock = threading.Lock()

    def step(self, job: Job) -> TpuStep:
        """The step's state, made at its first attempt."""
        with self._lock:
            found = self._steps.get(job.output_path)
            if found is None:
                found = self._steps[job.output_path] = self._step_for(job)
            return found

    def made(self, job: Job) -> TpuStep | None:
        """The step's state if an attempt made it, else None (never makes one)."""
        with self._lock:
            return self._steps.get(job.output_path)

    def ledger_head(self, job: Job) -> Mapping[str, Any]:
        try:
            return self.step(job).ledger_head()
        except MarinbuildError:
            return {}  # the first attempt reports the problem

    def step_ended(self, job: Job) -> None:
        with self._lock:
            self._steps.pop(job.output_path, None)

    def run_attempt(self, step: TpuStep, job: Job, cancel: threading.Event) -> Outcome:
        """Run attempt ``job.attempt`` of ``step`` and classify it (the hook; see the class doc)."""
        return step.outcome_of(step.attempt(job.attempt, cancel))

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _TpuAttemptRun:
        run = _TpuAttemptRun(self, job, on_done)
        threading.Thread(target=run.main, name=f"tpu-{job.name}-{job.attempt}", daemon=True).start()
        return run


class _TpuAttemptRun:
    """One attempt in flight: cancelling it tears its gang down."""

    def __init__(self, owner: TpuAttempts, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.owner = owner
        self.job = job
        self.on_done = on_done
        self.cancelled = AttemptCancel()
        self.reason: str | None = None
        self.timed_out = False
        self.timer: threading.Timer | None = None
        if job.timeout is not None:
            self.timer = threading.Timer(job.timeout, self.time_out)
            self.timer.daemon = True
            self.timer.start()

    def time_out(self) -> None:
        self.timed_out = self.cancelled.timed_out = True  # before the cancel is seen
        self.cancel(wall_time_exceeded(self.job))

    def main(self) -> None:
        started = time.time()
        try:
            outcome = self.owner.run_attempt(self.owner.step(self.job), self.job, self.cancelled)
        except ProvisioningFailed as e:  # no hosts this time: retried until provision_timeout
            outcome = Outcome(ok=False, started=started, ended=time.time(), error=str(e), cause=Cause.PROVISIONING)
        except MarinbuildError as e:  # bad input: one line, and no retry can help
            outcome = Outcome(ok=False, started=started, ended=time.time(), error=str(e), fatal=True)
        except Exception as e:  # a backend bug must still end the step, not hang the run
            outcome = Outcome(ok=False, started=started, ended=time.time(), error=f"{type(e).__name__}: {e}", fatal=True)
        if self.timer is not None:
            self.timer.cancel()
        if self.reason is not None and not outcome.ok:
            cause = Cause.TIMEOUT if self.timed_out else Cause.CANCELLED
            outcome = Outcome(ok=False, started=outcome.started, ended=outcome.ended, error=self.reason,
                              returncode=outcome.returncode, timed_out=self.timed_out, cancelled=not self.timed_out,
                              cause=cause, details=outcome.details)
        step = self.owner.made(self.job)
        if step is not None:  # None: its state could not be made, and the outcome says why
            step.ended_as[self.job.attempt] = outcome.kind
        self.on_done(outcome)

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.cancelled.set()


def run_tpu_step(
    job: TpuJob,
    cluster: Cluster,
    *,
    workdir: str | None,
    cancel: threading.Event,
    console: Callable[[str], None],
    exclude: Sequence[str] = (),
    output: Callable[[str], None] | None = None,
) -> TpuResult:
    """Run ``job`` on its slices until it succeeds, is cancelled, or a budget runs out.

    Blocking: the TPU backend driven by the one retry loop, with the job's own budgets
    (``job.budgets``, one :class:`~marinbuild.backends.retrying.RetryBudgets`); a refused host key or login is never retried. Set ``cancel`` to
    stop it (every host is torn down and the result is CANCELLED). ``workdir`` (when given)
    is packed and synced to every host, less the folders in ``exclude``. ``console`` gets a
    line per attempt; ``output`` (default ``console``) the lines slice 0 worker 0 prints.
    Bad input raises a :class:`marinbuild.errors.UserError` before any host is touched.
    """
    with tempfile.TemporaryDirectory(prefix="marinbuild-tpu-") as tmp:
        packed = pack_workdir(workdir, os.path.join(tmp, "pack"), exclude) if workdir is not None else None
        step = TpuStep(job, cluster, packed=packed, staging_dir=tmp, console=console, output=output)
        loop = Retrying(TpuAttempts(lambda _job: step), lambda _name: job.budgets)
        plain = Job(name=job.name, output_path=job.output_path, log_file=os.path.join(tmp, "step.log"), workdir=".",
                    env=dict(job.env), command=job.command, previous_attempts=job.previous_attempts,
                    lost_attempt=job.lost_attempt,
                    progress_timeout=job.progress_timeout)
        done: queue.SimpleQueue[Outcome] = queue.SimpleQueue()
        run = loop.start(plain, done.put)
        while True:
            try:
                outcome = done.get(timeout=0.1)
                break
            except queue.Empty:
                if cancel.is_set():
                    run.cancel("cancelled")
        Storage.for_prefix(job.output_path).write_many(dict(outcome.records))
    status = outcome.kind.value
    return TpuResult(status, tuple(step.attempts), None if outcome.ok else outcome.error)  # type: ignore[arg-type]
