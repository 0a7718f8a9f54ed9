"""A step's attempt as a Slurm job: the ``sbatch`` arguments its resources and settings map to.

==========================  ======================================================
marinbuild                  sbatch
==========================  ======================================================
cores (``Cores(n)``, cpu=)  ``--cpus-per-task=n``
memory (``Memory``, ram=)   ``--mem=<MiB>M`` (per node)
GPUs ``Gpus(n, "A100")``    ``--gres=gpu:a100:n`` (type lower-cased; ``auto``: ``--gres=gpu:n``)
wall time (``WTime(T)``)    ``--time=H:MM:SS`` (Slurm counts whole minutes, rounding up)
``replicas=N``              ``--nodes=N --ntasks-per-node=1`` (the step started once per node)
``[slurm]`` table           ``--partition``, ``--account``, ``--qos``, ``--constraint``,
                            ``--reservation``, then ``extra`` as given
``requeue``                 ``--requeue`` (true) or ``--no-requeue`` (false, the default)
==========================  ======================================================
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from marinbuild.backends.slurm.settings import SlurmSettings
from marinbuild.resources import Request

__all__ = ["sbatch_args", "wall_time"]


def wall_time(seconds: float) -> str:
    """``--time`` for a wall time in seconds.

    >>> wall_time(90), wall_time(3600 * 30 + 1)
    ('0:01:30', '30:00:01')
    """
    s = max(1, math.ceil(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def sbatch_args(
    settings: SlurmSettings,
    request: Request,
    *,
    replicas: int = 1,
    timeout: float | None = None,
    name: str,
    comment: str,
    output: str,
    workdir: str,
) -> list[str]:
    """The ``sbatch`` arguments of one attempt (see the module docstring).

    >>> from marinbuild.resources import Cores, Gpus, Memory
    >>> sbatch_args(SlurmSettings(partition="gpu"), Request.of(Cores(4) & Memory("2g") & Gpus(2, "A100")),
    ...             replicas=2, timeout=600, name="s", comment="c", output="/o", workdir="/w")[5:]
    ['--no-requeue', '--nodes=2', '--ntasks-per-node=1', '--cpus-per-task=4', '--mem=2048M', '--gres=gpu:a100:2', '--time=0:10:00', '--partition=gpu']
    """
    args = [f"--job-name={name}", f"--comment={comment}", f"--output={output}", "--open-mode=append",
            f"--chdir={workdir}"]
    args.append("--requeue" if settings.requeue else "--no-requeue")
    args += [f"--nodes={replicas}", "--ntasks-per-node=1"]
    if request.cores is not None:
        args.append(f"--cpus-per-task={max(1, request.N)}")
    if request.memory is not None:
        args.append(f"--mem={max(1, math.ceil(request.nbytes / 2**20))}M")
    if request.gpus is not None and request.gpus.n:
        kind = request.gpus.gpu_type
        args.append(f"--gres=gpu:{kind.lower()}:{request.gpus.n}" if kind and kind != "auto" else f"--gres=gpu:{request.gpus.n}")
    if timeout is not None:
        args.append(f"--time={wall_time(timeout)}")
    for key in ("partition", "account", "qos", "constraint", "reservation"):
        value = getattr(settings, key)
        if value:
            args.append(f"--{key}={value}")
    args += list(settings.extra)
    return args


def job_name(step: str) -> str:
    """The job's name as ``squeue`` shows it: the step's, recognisably marinbuild's."""
    return f"mb:{step}"[:120]


def comment_of(tag: str, output_path: str) -> str:
    return f"marinbuild {tag} {output_path}"


def joined(args: Sequence[str]) -> str:
    import shlex

    return shlex.join(args)
