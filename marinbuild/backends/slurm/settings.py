"""The ``[slurm]`` table of a cluster file, and a step's own ``slurm={...}`` over it.

::

    [slurm]
    partition = "gpu"
    account = "lab"
    qos = "normal"
    constraint = "a100"
    reservation = "maint"
    extra = ["--exclusive"]      # further sbatch arguments, as given
    poll_interval = 30           # seconds between the one squeue of all the run's jobs
    requeue = false              # true: Slurm requeues a preempted job, one attempt continuing

Every key is optional; an unknown one is refused in one line naming the file (or the step).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from marinbuild.errors import ClusterConfigError

__all__ = ["DEFAULT_POLL_INTERVAL", "SLURM_KEYS", "SlurmSettings", "parse_slurm"]

DEFAULT_POLL_INTERVAL = 30.0
_STRINGS = ("partition", "account", "qos", "constraint", "reservation")
SLURM_KEYS = (*_STRINGS, "extra", "poll_interval", "requeue")
"""The keys ``[slurm]`` and a step's ``slurm={...}`` take, in the order the docs list them."""


@dataclass(frozen=True)
class SlurmSettings:
    """How marinbuild submits a step's jobs (see the module docstring)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    reservation: str | None = None
    extra: tuple[str, ...] = ()
    poll_interval: float = DEFAULT_POLL_INTERVAL
    requeue: bool = False

    def over(self, raw: Mapping[str, Any], where: str) -> SlurmSettings:
        """These settings with ``raw`` (a step's ``slurm={...}``) over them, checked as the table is."""
        return replace(self, **_fields(raw, where))


def parse_slurm(raw: Any, where: str) -> SlurmSettings:
    """The ``[slurm]`` table ``raw`` read from ``where``; a one-line ClusterConfigError for a bad one."""
    if not isinstance(raw, Mapping):
        raise ClusterConfigError(f"{where}: [slurm] must be a table")
    return SlurmSettings(**_fields(raw, where))


def _fields(raw: Mapping[str, Any], where: str) -> dict[str, Any]:
    unknown = sorted(set(raw) - set(SLURM_KEYS))
    if unknown:
        raise ClusterConfigError(
            f"{where}: unknown [slurm] key(s) {', '.join(map(repr, unknown))} (known: {', '.join(SLURM_KEYS)})"
        )
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _STRINGS:
            if not isinstance(value, str) or not value or any(c.isspace() for c in value):
                raise ClusterConfigError(f"{where}: [slurm] {key} must be a word, got {value!r}")
            out[key] = value
        elif key == "extra":
            if not isinstance(value, list | tuple) or not all(isinstance(v, str) and v for v in value):
                raise ClusterConfigError(f"{where}: [slurm] extra must be a list of sbatch arguments, got {value!r}")
            out[key] = tuple(value)
        elif key == "poll_interval":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and 0 < value < math.inf
            if not ok:
                raise ClusterConfigError(f"{where}: [slurm] poll_interval must be seconds over 0, got {value!r}")
            out[key] = float(value)
        else:  # requeue
            if not isinstance(value, bool):
                raise ClusterConfigError(f"{where}: [slurm] requeue must be true or false, got {value!r}")
            out[key] = value
    return out
