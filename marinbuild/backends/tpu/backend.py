"""The scheduler's backend for TPU steps: one thread per step driving its SSH gang.

A TPU step is admitted like any other (its allocation names the slices it got), then
:class:`TpuDispatch` runs it on every host of those slices through
:func:`~marinbuild.backends.tpu.retry_loop.run_tpu_step`, retrying preemptions within the step's
budgets. A shell step runs its command on every host; a function step runs
``python3 -m marinbuild.backends.worker`` there, which loads the synced Marinfile and calls the step
by name (the hosts need marinbuild installed, as they need the step's own libraries).
"""

from __future__ import annotations

import os
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.tpu.cluster import Cluster
from marinbuild.backends.tpu.retry_loop import TpuJob, run_tpu_step
from marinbuild.pyenv.launch import DECLARED_ENV_EXTRA, remote_prefix, spec_of

__all__ = ["RetryBudgets", "TpuDispatch"]


@dataclass(frozen=True)
class RetryBudgets:
    """Defaults for steps that do not set their own (``--max-retries-*`` flags)."""

    preemption: int = 100
    failure: int = 0


class TpuDispatch:
    """Backend for steps whose allocation holds TPU slices."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        marinfile: str,
        prefix: str,
        sync: bool,
        budgets: RetryBudgets,
        retries_of: Callable[[str], tuple[int | None, int | None]],
        console: Callable[[str], None],
        output: Callable[[str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.marinfile = marinfile
        self.prefix = prefix
        self.sync = sync
        self.budgets = budgets
        self.retries_of = retries_of
        self.console = console
        self.output = output

    retries_itself = True
    """Preemptions, failures and SSH trouble have budgets of their own here (no generic retries)."""

    def command_for(self, job: Job, slices: tuple[str, ...]) -> str:
        """What every host runs: the shell command, or the worker calling the function."""
        if job.command is not None:
            return job.command
        python = shlex.quote(self.cluster.slice(slices[0]).ssh.python if slices else "python3")
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
        return remote_prefix(environment, self.cluster.slice(slices[0]).ssh.python if slices else "python3")

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _TpuRun:
        preemption, failure = self.retries_of(job.name)
        slices = tuple(s for s in job.env.get("MARINBUILD_TPU_SLICES", "").split(",") if s)
        # The thread counts admission derived for this machine mean nothing on the hosts;
        # the same names set by the step itself (env_vars, env=) do.
        declared = job.extra.get(DECLARED_ENV_EXTRA, ()) if job.extra else ()
        env = {
            k: v for k, v in job.env.items()
            if k in declared or not k.startswith(("OMP_", "MKL_", "OPENBLAS_", "NUMEXPR_"))
        }
        tpu_job = TpuJob(
            name=job.name,
            output_path=job.output_path,
            command=self.command_for(job, slices),
            setup=self.setup_for(job, slices),
            env=env,
            slices=slices,
            max_retries_preemption=self.budgets.preemption if preemption is None else preemption,
            max_retries_failure=self.budgets.failure if failure is None else failure,
            previous_attempts=job.previous_attempts,
        )
        run = _TpuRun(self, tpu_job, job, on_done)
        if job.timeout is not None:
            # The wall-time limit covers every attempt: at the limit the gang is torn down.
            timer = threading.Timer(job.timeout, run.time_out)
            timer.daemon = True
            run.timer = timer
            timer.start()
        threading.Thread(target=run.main, name=f"tpu-{job.name}", daemon=True).start()
        return run


class _TpuRun:
    """One TPU step in flight: cancelling it tears its gang down."""

    def __init__(self, owner: TpuDispatch, tpu_job: TpuJob, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.owner = owner
        self.tpu_job = tpu_job
        self.job = job
        self.on_done = on_done
        self.cancelled = threading.Event()
        self.reason: str | None = None
        self.timed_out = False
        self.timer: threading.Timer | None = None

    def time_out(self) -> None:
        self.timed_out = True
        self.cancel(f"timeout: exceeded its wall time of {self.job.timeout:g} s")

    def main(self) -> None:
        started = time.time()
        workdir = os.path.dirname(self.owner.marinfile) if self.owner.sync else None
        try:
            result = run_tpu_step(
                self.tpu_job,
                self.owner.cluster,
                workdir=workdir,
                cancel=self.cancelled,
                console=self.owner.console,
                output=self.owner.output,
                # A local prefix inside the project is never shipped: outputs are not code.
                exclude=(self.owner.prefix,) if "://" not in self.owner.prefix else (),
            )
            ok, error = result.ok, result.error
            if not ok and error is None:
                error = f"TPU step ended {result.status}"
            if self.reason is not None:
                ok, error = False, self.reason
            summary = f"{len(result.attempts)} attempt(s): " + ", ".join(str(a.classification.value) for a in result.attempts)
        except Exception as e:  # a backend bug must still end the step, not hang the run
            ok, error, summary = False, f"{type(e).__name__}: {e}", "no attempt finished"
        os.makedirs(os.path.dirname(self.job.log_file), exist_ok=True)
        with open(self.job.log_file, "a") as log:
            log.write(f"{summary}; per-host logs in logs/slice_*_worker_*.log\n")
        if self.timer is not None:
            self.timer.cancel()
        cancelled = self.reason is not None and not self.timed_out
        self.on_done(Outcome(ok=ok, started=started, ended=time.time(), error=None if ok else error,
                             cancelled=cancelled, timed_out=self.timed_out))

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.cancelled.set()
