"""What one attempt of a gang came to: each host's outcome, and the attempt's as one line.

The cause of the attempt (:attr:`GangOutcome.classification`) is decided from the hosts'
observations by :func:`marinbuild.backends.tpu.preemption.classify_attempt`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass

from marinbuild.backends.base import Cause
from marinbuild.backends.tpu.preemption import HostObservation, classify_attempt

__all__ = ["GangOutcome", "HostOutcome", "said_once"]


@dataclass(frozen=True)
class HostOutcome:
    """What happened on one host; see :class:`marinbuild.backends.tpu.preemption.HostObservation`.

    ``exit_code`` -1 means the command ended without an exit status (a signal);
    ``torn_down`` that it was still running when the gang was torn down.
    """

    host: str
    slice_index: int
    worker_index: int
    exit_code: int | None = None
    connection_lost: bool = False
    reachable: bool | None = None
    metadata_preempted: bool | None = None
    infra_error: str | None = None
    survivors: tuple[int, ...] = ()
    note: str | None = None
    fatal: bool = False
    torn_down: bool = False
    unreached: bool = False
    """No SSH session could be opened to the host in this attempt."""
    answered_before: bool = False
    """The host answered SSH in an earlier attempt of the step."""
    answered: bool = False
    """An SSH session to the host was opened in this attempt."""

    def observation(self) -> HostObservation:
        return HostObservation(
            self.host, self.exit_code, self.connection_lost, self.reachable,
            self.metadata_preempted, self.infra_error, self.unreached, self.answered_before,
        )


@dataclass(frozen=True)
class GangOutcome:
    """The whole attempt: per-host outcomes, who failed first, and when things happened."""

    hosts: tuple[HostOutcome, ...]
    cancelled: bool
    started_at: float
    ended_at: float
    launched_at: float | None = None
    first_failed: str | None = None
    first_failure_at: float | None = None
    teardown_s: float | None = None
    synced_hosts: int = 0
    hung: bool = False
    """Torn down because no host made progress for the gang's ``progress_timeout``."""
    last_progress_at: float | None = None
    """When any host's log or progress file last changed (this machine's clock), for a hang."""
    progress_timeout: float | None = None

    @property
    def classification(self) -> Cause:
        return classify_attempt([h.observation() for h in self.hosts], cancelled=self.cancelled, hung=self.hung)

    @property
    def survivors(self) -> dict[str, tuple[int, ...]]:
        return {h.host: h.survivors for h in self.hosts if h.survivors}

    def summary(self) -> str:
        """One line saying why the attempt ended as it did."""
        cls = self.classification
        if cls is Cause.SUCCESS:
            return "all hosts exited 0"
        parts: list[str] = []
        if cls is Cause.HANG and self.last_progress_at is not None:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.last_progress_at))
            parts.append(f"hang: no progress on any host for {self.progress_timeout:g} s (last moved at {when})")
        for h in self.hosts:
            if h.infra_error:
                parts.append(h.infra_error)
            elif h.metadata_preempted:
                parts.append(f"{h.host}: preempted (GCE metadata)")
            elif h.reachable is False:
                parts.append(h.note or f"{h.host}: stopped answering SSH")
            elif h.connection_lost and h.exit_code is None and h.note:
                parts.append(h.note)  # lost to a host that still answers: say how
        if self.first_failed and not parts and cls is not Cause.HANG:
            first = next(h for h in self.hosts if h.host == self.first_failed)
            why = "lost its connection" if first.connection_lost else f"exited {first.exit_code}"
            parts.append(f"{first.host} {why} first")
        if self.cancelled:
            parts.insert(0, "cancelled")
        if self.survivors:
            parts.append(f"processes survived teardown: {self.survivors}")
        return "; ".join(said_once(parts)) or cls.value


def said_once(parts: Sequence[str], named: int = 3) -> list[str]:
    """``HOST: message`` parts saying the same of several hosts, said once with the host count
    (a slice of 64 hosts that all lost their connection is one line, not 64).

    >>> said_once(["a: stopped answering SSH (a:22)", "b: stopped answering SSH (b:22)", "c exited 1 first"])
    ['a: stopped answering SSH (a:22) (the same on 1 more host: b)', 'c exited 1 first']
    """
    alike: dict[str, list[tuple[str, str]]] = {}
    for part in parts:
        host, sep, rest = part.partition(": ")
        # The host named inside its own message too (``10.0.0.2:22``) is the same message of another host.
        key = re.sub(rf"(?<![\w.]){re.escape(host)}(?!\w|\.\w)", "\0", rest) if sep and host and " " not in host else part
        alike.setdefault(key, []).append((host, part))
    out: list[str] = []
    for group in alike.values():
        (_, first), others = group[0], [h for h, _ in group[1:]]
        if others:
            shown = ", ".join(others[:named]) + (", …" if len(others) > named else "")
            first += f" (the same on {len(others)} more host{'s' if len(others) != 1 else ''}: {shown})"
        out.append(first)
    return out
