"""Running a step in its environment: locally, on TPU hosts over SSH, and on Ray.

A job that needs an environment carries its :class:`~marinbuild.pyenv.spec.EnvSpec` in
``job.extra["environment"]`` (put there by ``prepare``).

* Local (:class:`WithEnvironments`, wrapping the local backend): the environment is built
  (or found) in a thread, so the scheduler never waits on uv; then a shell step runs with the
  environment's ``bin`` first on ``PATH`` and ``VIRTUAL_ENV`` set, and a function step runs
  as ``ENV/bin/python -m marinbuild.backends.worker`` (the Marinfile loaded again there, its
  folder importable). A build that fails fails the step with the resolver's last lines
  (in its log, and the last of them in the error), and is not retried.
* TPU over SSH (:func:`remote_prefix`): the host builds or finds the environment itself,
  running :mod:`marinbuild.pyenv.builder`'s source with its own ``python3`` before the
  step's command; every host of the gang does so at once.
* Ray (:func:`runtime_env_of`): the task's ``runtime_env`` carries the requirements and Ray
  installs them on the node.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import shlex
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marinbuild.backends.base import Backend, Job, Outcome
from marinbuild.pyenv import builder
from marinbuild.pyenv.builder import EnvBuildError, ensure
from marinbuild.pyenv.spec import EnvSpec

__all__ = ["DECLARED_ENV_EXTRA", "ENV_EXTRA", "EnvFailure", "WithEnvironments", "env_variables", "remote_prefix", "runtime_env_of", "spec_of"]

ENV_EXTRA = "environment"
"""The key of ``Job.extra`` holding the step's EnvSpec."""
DECLARED_ENV_EXTRA = "declared_env"
"""The key of ``Job.extra`` naming the variables the step itself set (``env_vars``, ``env=``):
a backend that drops variables meant for this machine keeps these."""


@dataclasses.dataclass(frozen=True)
class EnvFailure(Outcome):
    """The step's environment could not be built: the step never started, and retrying cannot help."""

    fatal: bool = True


def spec_of(job: Job) -> EnvSpec | None:
    """The environment ``job`` must run in, if any."""
    spec = job.extra.get(ENV_EXTRA) if job.extra else None
    return spec if isinstance(spec, EnvSpec) else None


def env_variables(env_dir: Path, base_path: str | None) -> dict[str, str]:
    """What a process running in ``env_dir`` gets: its ``bin`` first on PATH, ``VIRTUAL_ENV``."""
    path = f"{env_dir / 'bin'}{os.pathsep}{base_path}" if base_path else str(env_dir / "bin")
    return {"PATH": path, "VIRTUAL_ENV": str(env_dir)}


_BOX = " \u00d7\u2570\u2500\u25b6\u2502"  # the frame uv draws around its error messages


def _failure_line(spec: EnvSpec, error: EnvBuildError) -> str:
    lines = [ln.strip(_BOX) for ln in error.tail.splitlines() if ln.strip(_BOX)]
    detail = lines[-1] if lines else str(error)
    return f"environment {spec.short} could not be built: {detail}"


class WithEnvironments:
    """A backend running every job that needs an environment inside it; other jobs pass through.

    ``marinfile`` and ``prefix`` let a function step be called by name under the environment's
    interpreter (:mod:`marinbuild.backends.worker`).
    """

    def __init__(self, inner: Backend, marinfile: str, prefix: str, root: Path | None = None) -> None:
        self.inner = inner
        self.marinfile = marinfile
        self.prefix = prefix
        self.root = root

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        spec = spec_of(job)
        if spec is None:
            if job.fn is not None and _fork_unsafe():
                job = self.in_fresh_interpreter(job)
            return self.inner.start(job, on_done)
        run = _EnvRun(self, job, spec, on_done)
        threading.Thread(target=run.main, name=f"env-{job.name}", daemon=True).start()
        return run

    def job_in(self, job: Job, env_dir: Path) -> Job:
        """``job`` rewritten to run in the environment at ``env_dir``."""
        env = {**job.env, **env_variables(env_dir, job.env.get("PATH") or os.environ.get("PATH"))}
        if job.command is not None:
            return dataclasses.replace(job, env=env)
        command = shlex.join([
            str(env_dir / "bin" / "python"), "-m", "marinbuild.backends.worker",
            "--file", self.marinfile, "--step", job.name, "--prefix", self.prefix,
        ])
        return dataclasses.replace(job, env=env, command=command, fn=None)


    def in_fresh_interpreter(self, job: Job) -> Job:
        """A function step rewritten to be called by name in a new interpreter (this runner cannot fork it)."""
        command = shlex.join([sys.executable, "-m", "marinbuild.backends.worker", "--file", self.marinfile,
                              "--step", job.name, "--prefix", self.prefix])
        return dataclasses.replace(job, command=command, fn=None)


def _fork_unsafe() -> bool:
    """Whether a forked copy of this runner could crash: it opened ``gs://`` and gRPC is loaded.

    gcsfs's default filesystem asks the storage control API (gRPC) about each bucket; a
    process forked after gRPC started crashes in gRPC's poller as soon as it uses gRPC
    itself (a function step opening ``gs://`` with gcsfs's defaults does), and gRPC's fork
    support skips a process whose threads are inside gRPC. Such a runner's function steps
    are called by name in a new interpreter instead (:mod:`marinbuild.backends.worker`).
    """
    from marinbuild.store.fsspec_store import gcs_opened

    return gcs_opened() and "grpc" in sys.modules


class _EnvRun:
    """A job waiting for its environment, then running in it; cancellable in either phase."""

    def __init__(self, owner: WithEnvironments, job: Job, spec: EnvSpec, on_done: Callable[[Outcome], None]) -> None:
        self.owner = owner
        self.job = job
        self.spec = spec
        self.on_done = on_done
        self._lock = threading.Lock()
        self._handle: Any = None
        self._reason: str | None = None

    def main(self) -> None:
        started = time.time()
        log = Path(self.job.log_file)
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            env_dir = ensure(self.spec.requirements, root=self.owner.root, key=self.spec.key, log=log)
        except EnvBuildError as e:
            with open(log, "a") as f:
                f.write(f"marinbuild: environment {self.spec.key} could not be built:\n{e}\n{e.tail}\n")
            self.on_done(EnvFailure(ok=False, started=started, ended=time.time(), error=_failure_line(self.spec, e)))
            return
        except Exception as e:  # a bug or a full disk must still end the step, not hang the run
            self.on_done(EnvFailure(ok=False, started=started, ended=time.time(), error=f"environment: {type(e).__name__}: {e}"))
            return
        on_done = self.on_done if self.job.command is not None else self._quoting_the_step
        with self._lock:
            reason = self._reason
            if reason is None:
                self._handle = self.owner.inner.start(self.owner.job_in(self.job, env_dir), on_done)
        if reason is not None:
            self.on_done(Outcome(ok=False, started=started, ended=time.time(), error=reason, cancelled=True))

    def _quoting_the_step(self, outcome: Outcome) -> None:
        """A function step's error as the step raised it, not the worker's exit status."""
        if not outcome.ok and outcome.returncode == 1 and not outcome.cancelled:
            line = _last_failure_line(self.job.log_file)
            if line is not None:
                outcome = dataclasses.replace(outcome, error=line)
        self.on_done(outcome)

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self._reason is None:
                self._reason = reason
            handle = self._handle
        if handle is not None:
            handle.cancel(reason)


def _last_failure_line(log_file: str) -> str | None:
    """What the worker said the step failed with (its last line), if it said so."""
    from marinbuild.backends.worker import FAILED_LINE

    try:
        with open(log_file, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 8192))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    lines = [ln for ln in tail.splitlines() if ln.startswith(FAILED_LINE)]
    return lines[-1][len(FAILED_LINE):] if lines else None


def remote_prefix(spec: EnvSpec, python: str = "python3") -> str:
    """Shell lines that make a remote host build or find ``spec``'s environment and enter it.

    The builder's source travels inline and runs under the host's ``python``; it prints the
    environment's folder, which goes first on PATH. A host that cannot build it ends the
    step with exit status 3 and the resolver's last lines in its log.
    """
    source = inspect.getsource(builder)
    requirements = json.dumps(list(spec.requirements))
    return (
        f"MARINBUILD_ENV_DIR=$({shlex.quote(python)} -c {shlex.quote(source)} ensure {shlex.quote(requirements)}) || exit 3\n"
        'export VIRTUAL_ENV="$MARINBUILD_ENV_DIR" PATH="$MARINBUILD_ENV_DIR/bin:$PATH"\n'
    )


def runtime_env_of(spec: EnvSpec) -> dict[str, Any]:
    """The part of a Ray task's ``runtime_env`` that installs ``spec``'s requirements."""
    return {"pip": {"packages": list(spec.requirements), "pip_check": False}}
