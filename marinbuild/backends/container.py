"""Steps in a container image (``ResourceConfig(image=...)``), run with podman or docker.

An engine counts as working only when it really runs a trivial container of the step's
image (``ENGINE run --rm IMAGE true``): a docker client without a daemon, or an image that
cannot be pulled, is not one. :func:`working_engine` answers that once per image and run;
planning refuses a step whose image no engine here can run.

A job in a container (:class:`InContainers`) runs ``ENGINE run --rm`` with the project
folder and the step's output folder mounted at the same paths, the step's environment
variables passed with ``-e``, the project folder as working directory, and the host's
network. A shell step runs its command under ``/bin/sh -c``; a function step runs
``python -m marinbuild.backends.worker`` inside, so the image must hold marinbuild and the
step's libraries, as a TPU host must.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Mapping
from typing import Any

from marinbuild.backends.base import Backend, BackendHooks, Job, Outcome

__all__ = ["ENGINES", "InContainers", "container_argv", "working_engine"]

ENGINES = ("podman", "docker")
PROBE_TIMEOUT_S = 300.0
"""A first use may pull the image."""


@functools.cache
def working_engine(image: str) -> tuple[str | None, str]:
    """``(engine, "")`` for the first engine here that runs ``image``, else ``(None, why not)``."""
    reasons = []
    for engine in ENGINES:
        path = shutil.which(engine)
        if path is None:
            reasons.append(f"{engine}: not installed")
            continue
        try:
            done = subprocess.run(
                [path, "run", "--rm", image, "true"],
                capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            reasons.append(f"{engine}: {e}")
            continue
        if done.returncode == 0:
            return engine, ""
        first = next((ln.strip() for ln in done.stderr.splitlines() if ln.strip()), f"exit status {done.returncode}")
        reasons.append(f"{engine}: {first}")
    return None, "; ".join(reasons)


def container_argv(engine: str, image: str, job: Job, env: Mapping[str, str], command: str) -> list[str]:
    """The ``ENGINE run`` command line running ``command`` for ``job`` inside ``image``."""
    mounts = dict.fromkeys(p for p in (job.workdir, job.output_path) if "://" not in p and os.path.isabs(p))
    argv = [engine, "run", "--rm", "--network=host", "-w", job.workdir]
    for path in mounts:
        argv += ["-v", f"{path}:{path}"]
    for key, value in env.items():
        argv += ["-e", f"{key}={value}"]
    return [*argv, image, "/bin/sh", "-c", command]


class InContainers(BackendHooks):
    """A backend running the jobs of ``images`` (step name -> (engine, image)) in them; others pass through."""

    label = "container"

    def __init__(self, inner: Backend, images: Mapping[str, tuple[str, str]], marinfile: str, prefix: str) -> None:
        self.inner = inner
        self.images = images
        self.marinfile = marinfile
        self.prefix = prefix

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> Any:
        chosen = self.images.get(job.name)
        if chosen is None:
            return self.inner.start(job, on_done)
        engine, image = chosen
        command = job.command
        if command is None:
            command = shlex.join(["python", "-m", "marinbuild.backends.worker", "--file", self.marinfile,
                                  "--step", job.name, "--prefix", self.prefix])
        # Only what marinbuild and the step set goes in: the runner's own environment
        # (its PATH, its HOME) means nothing inside the image.
        argv = container_argv(engine, image, job, job.env, command)
        return self.inner.start(dataclasses.replace(job, command=shlex.join(argv), fn=None), on_done)
