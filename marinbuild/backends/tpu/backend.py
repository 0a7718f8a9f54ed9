"""The scheduler's backend for TPU steps: each attempt of a step driven over its SSH gang.

A TPU step is admitted like any other (its allocation names the slices it got), then the one
retry loop (:mod:`marinbuild.backends.retrying`) starts its attempts on :class:`TpuDispatch`,
which runs each on every host of those slices (:class:`~marinbuild.backends.tpu.attempts.TpuAttempts`)
and says how it ended. A shell step runs its command on every host; a function step runs
``python3 -m marinbuild.backends.worker`` there, which loads the synced Marinfile and calls the step
by name (the hosts need marinbuild installed, as they need the step's own libraries).
"""

from __future__ import annotations

import os
import shlex
import shutil
import tempfile
import threading
import weakref
from collections.abc import Callable
from typing import Any

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.environments import DECLARED_ENV_EXTRA, remote_prefix, spec_of
from marinbuild.backends.tpu.attempts import TpuAttempts, TpuJob, TpuStep
from marinbuild.backends.tpu.cluster import Cluster, SshSettings
from marinbuild.backends.tpu.on_demand import CreatedSlices, uses_created_slices
from marinbuild.backends.tpu.workdir_sync import PackedWorkdir, pack_workdir
from marinbuild.store.step_logs import append_note

__all__ = ["CREATED_PROGRESS_TIMEOUT", "TpuDispatch"]

CREATED_PROGRESS_TIMEOUT = 1800.0
"""The hang timeout of a step on created slices that sets none (nor the cluster file): 30 min."""


class TpuDispatch(TpuAttempts):
    """Backend for steps whose allocation holds TPU slices: one attempt per ``start``.

    The project is packed once per run (every step and attempt ships the same code). A step's
    ``progress_timeout``, else the cluster file's, is watched on every host by the gang; a step
    on slices created for it gets :data:`CREATED_PROGRESS_TIMEOUT` when neither sets one (a
    wedged job on a created slice bills until someone looks).
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        marinfile: str,
        prefix: str,
        sync: bool,
        console: Callable[[str], None],
        output: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(self._new_step)
        self.cluster = cluster
        self.marinfile = marinfile
        self.prefix = prefix
        self.sync = sync
        self.console = console
        self.output = output
        self._tmp = tempfile.mkdtemp(prefix="marinbuild-tpu-")
        weakref.finalize(self, shutil.rmtree, self._tmp, True)
        self._packed: PackedWorkdir | None = None
        self._pack_lock = threading.Lock()
        self.created = CreatedSlices(cluster, prefix=prefix, console=console) if cluster.gcp is not None else None

    def command_for(self, job: Job, slices: tuple[str, ...]) -> str:
        """What every host runs: the shell command, or the worker calling the function."""
        if job.command is not None:
            return job.command
        python = shlex.quote(self._ssh_of(slices).python)
        if spec_of(job) is not None:
            python = '"$MARINBUILD_ENV_DIR"/bin/python'  # set by the setup lines (remote_prefix)
        # Synced, the project is the command's working directory on each host; not synced,
        # it must already be there at the same path (a shared filesystem).
        marinfile = os.path.basename(self.marinfile) if self.sync else self.marinfile
        return f"{python} " + shlex.join(
            ["-m", "marinbuild.backends.worker", "--file", marinfile, "--step", job.name, "--prefix", self.prefix]
        )

    def setup_for(self, job: Job, slices: tuple[str, ...]) -> str:
        """Lines each host runs first: building (or finding) the step's Python environment there."""
        environment = spec_of(job)
        if environment is None:
            return ""
        return remote_prefix(environment, self._ssh_of(slices).python)

    def _ssh_of(self, slices: tuple[str, ...]) -> SshSettings:
        """Slice 0's SSH settings; the cluster file's ``[ssh]`` for slices created on demand."""
        if not slices or uses_created_slices(slices):
            return self.cluster.ssh
        return self.cluster.slice(slices[0]).ssh

    def run_attempt(self, step: TpuStep, job: Job, cancel: threading.Event) -> Outcome:
        """One attempt: on the step's static slices, or on slices created for it (``[gcp]``)."""
        if self.created is not None and uses_created_slices(step.job.slices):
            return self.created.run_attempt(step, job, cancel)
        return super().run_attempt(step, job, cancel)

    def tpu_job(self, job: Job) -> TpuJob:
        """The TPU view of a scheduler job (budgets are the retry loop's business, not the job's)."""
        slices = tuple(s for s in job.env.get("MARINBUILD_TPU_SLICES", "").split(",") if s)
        # The thread counts admission derived for this machine mean nothing on the hosts;
        # the same names set by the step itself (env_vars, env=) do.
        declared = job.extra.get(DECLARED_ENV_EXTRA, ()) if job.extra else ()
        env = {
            k: v for k, v in job.env.items()
            if (k in declared or not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "NUMEXPR_")))
            and k not in ("MARINBUILD_ATTEMPT", "MARINBUILD_PROGRESS")  # set per host and attempt
        }
        return TpuJob(
            name=job.name,
            output_path=job.output_path,
            command=self.command_for(job, slices),
            setup=self.setup_for(job, slices),
            env=env,
            slices=slices,
            previous_attempts=job.previous_attempts,
            lost_attempt=job.lost_attempt,
            progress_timeout=self._progress_timeout(job, slices),
        )

    def _progress_timeout(self, job: Job, slices: tuple[str, ...]) -> float | None:
        if job.progress_timeout is not None:
            return job.progress_timeout
        if self.cluster.progress_timeout is not None:
            return self.cluster.progress_timeout
        return CREATED_PROGRESS_TIMEOUT if uses_created_slices(slices) else None

    def _pack(self) -> PackedWorkdir | None:
        if not self.sync:
            return None
        with self._pack_lock:
            if self._packed is None:
                # A local prefix inside the project is never shipped: outputs are not code.
                exclude = (self.prefix,) if "://" not in self.prefix else ()
                self._packed = pack_workdir(os.path.dirname(self.marinfile), os.path.join(self._tmp, "pack"), exclude)
            return self._packed

    def _new_step(self, job: Job) -> TpuStep:
        staging = tempfile.mkdtemp(prefix="step-", dir=self._tmp)
        return TpuStep(self.tpu_job(job), self.cluster, packed=self._pack(), staging_dir=staging,
                       console=self.console, output=self.output)

    def amend_ledger(self, job: Job, entries: list[dict[str, Any]]) -> None:
        if self.created is not None:
            self.created.amend_ledger(job, entries)

    def capacity_wait(self, job: Job) -> float:
        """Seconds the step's queued resources waited before ACTIVE (read before ``amend_ledger`` lets them go)."""
        return self.created.waited(job) if self.created is not None else 0.0

    def step_ended(self, job: Job) -> None:
        if self.created is not None:
            self.created.step_ended(job)
        with self._lock:
            step = self._steps.pop(job.output_path, None)
        if step is not None:
            waited = self.capacity_wait(job)
            summary = step.summary()
            if waited >= 0.05:
                # The time on hosts and the wait for them are different costs: say both.
                head, sep, tail = summary.partition("; ")
                summary = f"{head}; {waited:.1f} s waiting for capacity before ACTIVE{sep}{tail}"
            append_note(job.log_file, summary)
            shutil.rmtree(step.staging_dir, ignore_errors=True)
