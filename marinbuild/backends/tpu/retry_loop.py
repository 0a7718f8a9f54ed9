"""Running a step on TPU slices over SSH: attempts, retries on preemption, ``attempts.json``.

The scheduler calls :func:`run_tpu_step` in a thread with the slices it allocated::

    job = TpuJob(name="train", output_path="gs://b/train-3f2a", command="python train.py",
                 env={"SEED": "0"}, slices=("pod-a",))
    result = run_tpu_step(job, load_cluster("cluster.toml"), workdir=".",
                          cancel=threading.Event(), console=print)
    result.status   # "SUCCESS", "FAILED", "PREEMPTED", "INFRA" or "CANCELLED"

Every host gets ``MARINBUILD_*`` variables (and ``MEGASCALE_*`` for more than one slice)
describing its place in the gang; see :func:`host_env`.
"""

from __future__ import annotations

import os
import secrets
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from marinbuild.backends.tpu.cluster import Cluster, SliceSpec
from marinbuild.backends.tpu.gang import TOKEN_VAR, AttemptLogs, Gang, GangOutcome, HostOutcome, HostPlan
from marinbuild.backends.tpu.preemption import AttemptClass, is_preempted
from marinbuild.backends.tpu.ssh import export_env, resolve_target
from marinbuild.backends.tpu.workdir_sync import PackedWorkdir, pack_workdir
from marinbuild.errors import ClusterConfigError, StepDefinitionError
from marinbuild.execution.accounting import HELD_EXTRA, attempt_extras
from marinbuild.execution.retries import AttemptLedger
from marinbuild.redact import redact_env, scrub, secret_values
from marinbuild.store.retry import RetryPolicy
from marinbuild.store.step_logs import attempt_header
from marinbuild.tpu_types import tpu_topology

__all__ = [
    "RETRY_BASE_DELAY_ENV",
    "Attempt",
    "TpuJob",
    "TpuResult",
    "TpuStatus",
    "backoff_delay",
    "host_env",
    "run_tpu_step",
]

TpuStatus = Literal["SUCCESS", "FAILED", "PREEMPTED", "INFRA", "CANCELLED"]
RETRY_BASE_DELAY_ENV = "MARINBUILD_RETRY_BASE_DELAY"
_DEFAULT_BASE_DELAY_S = 5.0
_MAX_DELAY_S = 120.0


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
    max_retries_preemption: int = 100
    max_retries_failure: int = 0
    max_retries_infra: int = 2
    """Retries of an attempt that failed for SSH or setup trouble (a host that never
    answered, a failed upload): a few, since a wrong port or a down host rarely heals."""
    setup: str = ""
    """Shell lines every host runs before ``command`` in the same shell (building the
    step's Python environment); kept out of ``attempts.json``."""
    previous_attempts: tuple[Mapping[str, Any], ...] | None = None
    """What earlier runs recorded in the ledger, when already read (``Job.previous_attempts``)."""


@dataclass(frozen=True)
class Attempt:
    """One attempt as recorded in ``attempts.json``."""

    number: int
    classification: AttemptClass
    started_at: float
    ended_at: float
    first_failed_host: str | None
    message: str
    hosts: tuple[HostOutcome, ...]
    teardown_s: float | None = None
    synced_hosts: int = 0

    @property
    def exit_codes(self) -> dict[str, int | None]:
        return {h.host: h.exit_code for h in self.hosts}

    @property
    def exit_code(self) -> int | None:
        """The ledger's one exit code: 0 on success, else the first failed host's."""
        if self.classification is AttemptClass.SUCCESS:
            return 0
        return self.exit_codes.get(self.first_failed_host or "") if self.first_failed_host else None

    @property
    def preempted_hosts(self) -> tuple[str, ...]:
        return tuple(h.host for h in self.hosts if is_preempted(h.observation()))

    def to_json(self) -> dict[str, Any]:
        return {
            "attempt": self.number,
            "class": self.classification.value,
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "duration_s": round(self.ended_at - self.started_at, 3),
            "exit_code": self.exit_code,
            "host": self.first_failed_host or (self.hosts[0].host if self.hosts else None),
            "first_failed_host": self.first_failed_host,
            "exit_codes": self.exit_codes,
            "preempted_hosts": list(self.preempted_hosts),
            "message": self.message,
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


@dataclass(frozen=True)
class TpuResult:
    """How the step ended: the last attempt's class, every attempt, and why it failed."""

    status: TpuStatus
    attempts: tuple[Attempt, ...]
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "SUCCESS"


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


def backoff_delay(retry: int, base: float | None = None) -> float:
    """Seconds to wait before retry number ``retry`` (1-based): doubling, capped, jittered.

    The base is ``$MARINBUILD_RETRY_BASE_DELAY`` (default 5 s).  Jitter keeps many steps
    preempted together from all coming back at the same instant.
    """
    if base is None:
        base = float(os.environ.get(RETRY_BASE_DELAY_ENV, _DEFAULT_BASE_DELAY_S))
    return RetryPolicy(base=base, cap=_MAX_DELAY_S, floor=0.5).delay(retry)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds")


def _resolve_slices(job: TpuJob, cluster: Cluster) -> list[SliceSpec]:
    if not job.slices:
        raise ClusterConfigError(f"step {job.name!r}: no TPU slice was allocated to it")
    specs = [cluster.slice(n) for n in job.slices]
    counts = {s.name: len(s.hosts) for s in specs}
    if len(set(counts.values())) > 1:
        raise ClusterConfigError(
            f"step {job.name!r}: slices of one step need equal host counts, got {counts}"
        )
    return specs


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

    Blocking; run it in a thread and set ``cancel`` to stop it (every host is torn down
    and the result is CANCELLED).  A preempted attempt draws on
    ``max_retries_preemption``, a FAILED one on ``max_retries_failure``, an INFRA one
    (a host that never answered SSH, a failed upload) on ``max_retries_infra``;
    a refused host key or login is never retried.  ``workdir`` (when given) is packed and
    synced to every host, less the folders in ``exclude`` (the run's local prefix).
    ``console`` gets a line per attempt; ``output`` (default ``console``) the lines slice 0
    worker 0 prints.  Bad input (unknown slice, invalid env
    variable name) raises a :class:`marinbuild.errors.UserError` before any host is touched.
    """
    specs = _resolve_slices(job, cluster)
    try:
        export_env(job.env)
    except ValueError as e:
        raise StepDefinitionError(f"step {job.name!r}: {e}") from None
    secrets_ = secret_values(job.env)
    prefix = f"[{job.name}] "
    targets = [[resolve_target(h, s.ssh) for h in s.hosts] for s in specs]
    slice0 = specs[0]
    coordinator_host = (
        slice0.internal_addresses[0] if slice0.internal_addresses else targets[0][0].hostname
    )
    workers = len(slice0.hosts)
    record = AttemptLedger(job.output_path, job.name, head={
        "command": scrub(job.command, secrets_),
        "env": redact_env(job.env),
        "slices": [{"name": s.name, "tpu_type": s.tpu_type, "hosts": list(s.hosts)} for s in specs],
    }, previous=job.previous_attempts)
    run_token = secrets.token_hex(6)
    held = {"cores": 0, "tpu_type": specs[0].tpu_type, "slices": len(specs),
            "tpu_chips": sum(tpu_topology(s.tpu_type).chips for s in specs), "tpu_hosts": sum(len(s.hosts) for s in specs)}
    attempts: list[Attempt] = []
    preemptions = failures = infra = 0
    answered: set[str] = set()  # hosts that answered SSH in an attempt: silence later is preemption

    with tempfile.TemporaryDirectory(prefix="marinbuild-tpu-") as tmp:
        packed: PackedWorkdir | None = None
        if workdir is not None:
            packed = pack_workdir(workdir, os.path.join(tmp, "pack"), exclude)
        logs = AttemptLogs(job.output_path, os.path.join(tmp, "staging"))
        while True:
            number = record.next_number
            plans = [
                HostPlan(
                    slice_name=spec.name,
                    slice_index=s,
                    worker_index=w,
                    entry=entry,
                    target=targets[s][w],
                    settings=spec.ssh,
                    env={
                        **job.env,
                        **host_env(
                            slice_index=s, worker_index=w, num_slices=len(specs),
                            workers_per_slice=workers, coordinator_host=coordinator_host,
                            coordinator_port=slice0.ssh.coordinator_port,
                            megascale_port=slice0.ssh.megascale_port,
                            output_path=job.output_path, attempt=number,
                        ),
                        TOKEN_VAR: f"{run_token}-a{number}-s{s}-w{w}",
                    },
                )
                for s, spec in enumerate(specs)
                for w, entry in enumerate(spec.hosts)
            ]
            console(f"{prefix}attempt {number} on {', '.join(job.slices)}")
            outcome = Gang(
                plans,
                command=job.setup + job.command,
                logs=logs,
                workdir=packed,
                console=console if output is None else output,  # slice 0 worker 0's lines
                console_prefix=prefix,
                cancel=cancel,
                max_parallel=cluster.max_parallel,
                secrets=secrets_,
                log_header=attempt_header(number, time.time(), "{host}", "tpu"),  # the gang fills in each host
                answered_before=frozenset(answered),
                lease_of=job.output_path,
            ).run()
            answered.update(h.host for h in outcome.hosts if h.answered)
            attempt = _attempt(number, outcome, secrets_)
            attempts.append(attempt)
            record.append({**attempt.to_json(), **attempt_extras({HELD_EXTRA: held}, "tpu")})
            logs.publish()
            cls = attempt.classification
            console(f"{prefix}attempt {number}: {cls.value}: {attempt.message}")
            if cls is AttemptClass.SUCCESS:
                return TpuResult("SUCCESS", tuple(attempts))
            if cls is AttemptClass.CANCELLED:
                return TpuResult("CANCELLED", tuple(attempts), "cancelled")
            error = f"attempt {number} {cls.value}: {attempt.message}"
            if cls is AttemptClass.PREEMPTED:
                preemptions += 1
                if preemptions > job.max_retries_preemption:
                    return TpuResult("PREEMPTED", tuple(attempts), f"{error} (preemption budget spent)")
            elif cls is AttemptClass.INFRA:
                infra += 1
                # A refused host key or login cannot get better by retrying.
                if any(h.fatal for h in outcome.hosts) or infra > job.max_retries_infra:
                    return TpuResult("INFRA", tuple(attempts), error)
            else:
                failures += 1
                if failures > job.max_retries_failure:
                    return TpuResult("FAILED", tuple(attempts), error)
            delay = backoff_delay(len(attempts))
            console(f"{prefix}retrying in {delay:.1f} s")
            if cancel.wait(delay):
                return TpuResult("CANCELLED", tuple(attempts), "cancelled while waiting to retry")


def _attempt(number: int, outcome: GangOutcome, secrets_: tuple[str, ...]) -> Attempt:
    return Attempt(
        number=number,
        classification=outcome.classification,
        started_at=outcome.started_at,
        ended_at=outcome.ended_at,
        first_failed_host=outcome.first_failed or next(
            (h.host for h in outcome.hosts
             if h.infra_error or h.reachable is False or h.connection_lost), None
        ),
        message=scrub(outcome.summary(), secrets_),
        hosts=outcome.hosts,
        teardown_s=outcome.teardown_s,
        synced_hosts=outcome.synced_hosts,
    )
