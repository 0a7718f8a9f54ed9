"""The lease policy: heartbeat, expiry and poll interval, their defaults, bounds and sources.

A runner's flags come first, then the ``MARINBUILD_LEASE_*`` variables, then the defaults;
a waiter clamps whatever expiry a lease promises into :data:`MIN_EXPIRY`..:data:`MAX_EXPIRY`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from marinbuild.store.errors import UserError

__all__ = [
    "DEFAULT_EXPIRY",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_POLL",
    "MAX_EXPIRY",
    "MIN_EXPIRY",
    "MIN_HEARTBEAT",
    "LeaseSettings",
    "lease_flag_problem",
]

DEFAULT_HEARTBEAT = 10.0
"""Seconds between renewals (``MARINBUILD_LEASE_HEARTBEAT``, ``--lease-heartbeat``)."""
DEFAULT_EXPIRY = 60.0
"""Seconds a lease must be seen unchanged before it is taken over (``MARINBUILD_LEASE_EXPIRY``)."""
MIN_HEARTBEAT = 0.1
"""Shortest heartbeat a runner accepts (``--lease-heartbeat``): below it renewals of a remote
store overlap and a loaded machine misses them, so every step would be fenced."""
DEFAULT_POLL = 5.0
MIN_EXPIRY = 1.0
"""Shortest expiry a waiter honours, whatever a lease says (clamping up only makes it wait longer)."""
MAX_EXPIRY = 3600.0
"""Longest expiry a waiter honours, and the longest a runner may be given: a lease from
another host that says ``Infinity`` or ``1e12`` is taken over after an hour unrenewed."""
"""Upper bound on seconds between two looks at a step leased elsewhere (``MARINBUILD_LEASE_POLL``)."""


@dataclass(frozen=True)
class LeaseSettings:
    """Heartbeat, expiry and poll interval, in seconds.

    >>> LeaseSettings.resolve(heartbeat=1, expiry=5, env={}).poll
    1.0
    """

    heartbeat: float = DEFAULT_HEARTBEAT
    expiry: float = DEFAULT_EXPIRY
    poll: float = DEFAULT_POLL

    @property
    def fence_after(self) -> float:
        """Seconds without a successful renewal after which a holder gives its step up."""
        return max(self.heartbeat, self.expiry - self.heartbeat)

    @property
    def kill_after(self) -> float:
        """Seconds after the last successful renewal was sent by which the step must be dead.

        Halfway between the holder's fence (its own SIGTERM) and the earliest takeover: the
        guardian outside the runner SIGKILLs whatever is left then.
        """
        return (self.fence_after + self.expiry) / 2

    @property
    def fence_read_interval(self) -> float:
        """How often a fence beside remote work (a Ray task, a Slurm job) reads the lease: twice a heartbeat.

        Such a fence kills its step once the lease names another runner, or once it has seen
        no renewal for :attr:`fence_after`: a renewal is seen at most this long after it was
        written, so the step is dead before ``fence_after`` plus this interval, which is within
        the expiry after which a waiter takes over.
        """
        return self.heartbeat / 2

    @property
    def remote_kill_after(self) -> float:
        """Seconds a fence beside remote work waits, from the last renewal it saw, before it kills the step."""
        return self.fence_after

    @classmethod
    def resolve(
        cls, heartbeat: float | None = None, expiry: float | None = None, env: Mapping[str, str] | None = None
    ) -> LeaseSettings:
        """Flags first, then ``MARINBUILD_LEASE_*`` variables, then the defaults."""
        env = os.environ if env is None else env
        beat = (
            heartbeat if heartbeat is not None else _env_seconds(env, "MARINBUILD_LEASE_HEARTBEAT", DEFAULT_HEARTBEAT)
        )
        exp = expiry if expiry is not None else _env_seconds(env, "MARINBUILD_LEASE_EXPIRY", DEFAULT_EXPIRY)
        poll = _env_seconds(env, "MARINBUILD_LEASE_POLL", min(DEFAULT_POLL, beat))
        if not 0 < poll < math.inf:  # NaN fails every comparison
            raise UserError(f"lease poll interval must be positive (got {poll:g} s)")
        problem = lease_flag_problem(beat, exp)
        if problem is not None:
            raise UserError(problem)
        return cls(heartbeat=float(beat), expiry=float(exp), poll=float(poll))


def lease_flag_problem(heartbeat: float | None = None, expiry: float | None = None) -> str | None:
    """What is wrong with a lease heartbeat and expiry (either may be None: not given); None if nothing.

    The bounds: a heartbeat of at least :data:`MIN_HEARTBEAT`; an expiry between
    :data:`MIN_EXPIRY` and :data:`MAX_EXPIRY`, and at least twice the heartbeat.

    >>> lease_flag_problem(1e-9)
    'lease heartbeat (1e-09 s) must be at least 0.1 s: a renewal reads and writes the store, and one that cannot keep up fences every step'
    >>> lease_flag_problem(2, 60) is None
    True
    """
    if heartbeat is not None:
        if not 0 < heartbeat < math.inf:  # NaN fails every comparison
            return f"lease heartbeat must be positive (got {heartbeat:g} s)"
        if heartbeat < MIN_HEARTBEAT:
            return (
                f"lease heartbeat ({heartbeat:g} s) must be at least {MIN_HEARTBEAT:g} s: a renewal reads and writes "
                "the store, and one that cannot keep up fences every step"
            )
    if expiry is not None:
        if not expiry >= MIN_EXPIRY:  # NaN fails every comparison
            return f"lease expiry ({expiry:g} s) must be at least {MIN_EXPIRY:g} s: waiters honour no shorter one"
        if expiry > MAX_EXPIRY:
            return (
                f"lease expiry ({expiry:g} s) must be at most {MAX_EXPIRY:g} s: waiters take a lease over after that "
                "long unrenewed, whatever it says"
            )
        if heartbeat is not None and expiry < 2 * heartbeat:
            return (
                f"lease expiry ({expiry:g} s) must be at least twice the heartbeat ({heartbeat:g} s), "
                "or a slow renewal would look like a dead runner"
            )
    return None


def _env_seconds(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise UserError(f"{name} must be a number of seconds, not {raw!r}") from None
