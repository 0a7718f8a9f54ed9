"""Who holds a lease: the runner process (:class:`Owner`) and the step it started (:class:`StepProcess`).

A pid means the same process only on the same machine in the same pid namespace, and only
while its start time (from ``/proc``) is the one recorded: a reused pid is another process.
"""

from __future__ import annotations

import functools
import os
import socket
from dataclasses import dataclass

__all__ = ["Owner", "StepProcess", "owner_alive", "process_running"]


@dataclass(frozen=True)
class Owner:
    """A runner process. ``machine`` (boot id and pid namespace) says which pids it can see."""

    host: str
    pid: int
    started: str
    """The process's start time in clock ticks since boot: tells a reused pid apart."""
    nonce: str
    machine: str = ""

    def __str__(self) -> str:
        return f"{self.host}:{self.pid}"

    @classmethod
    def current(cls, nonce: str | None = None) -> Owner:
        """This process, with a fresh random nonce unless one is given."""
        pid = os.getpid()
        return cls(
            host=socket.gethostname(),
            pid=pid,
            started=_start_time(pid) or "",
            nonce=nonce or os.urandom(8).hex(),
            machine=_machine(),
        )

    def same(self, other: Owner) -> bool:
        return self.nonce == other.nonce and self.pid == other.pid and self.host == other.host


@functools.cache
def _machine() -> str:
    """Boot id and pid namespace: two processes see each other's pids only when both match."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.readlink('/proc/self/ns/pid')}"
    except OSError:
        return ""


def _start_time(pid: int) -> str | None:
    """Start time of a live process from ``/proc``; None when there is no such process."""
    try:
        # Raw reads: read at every step's start, where a text file object's set-up (fstat,
        # ioctl, two seeks) costs more than the read.
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        try:
            raw = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = raw.decode(errors="replace").rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):  # a zombie has finished; only its exit status is left
        return None
    return fields[19]


def process_running(pid: int) -> bool:
    """Whether ``pid`` is a live process here (a zombie is not: it only waits to be reaped)."""
    return _start_time(pid) is not None


def owner_alive(owner: Owner) -> bool | None:
    """Whether the owner's process still runs: None when it is on another machine."""
    if owner.host != socket.gethostname() or owner.machine != _machine():
        return None
    if not owner.machine:  # no /proc here: the pid alone has to do
        try:
            os.kill(owner.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    started = _start_time(owner.pid)
    return started is not None and started == owner.started


@dataclass(frozen=True)
class StepProcess:
    """The first process of the step run under a lease, as its runner saw it when it started.

    A runner taking the step over on this machine, in this pid namespace (:meth:`here`),
    kills its process group; the start time (clock ticks since boot) tells the first
    process from a later one given the same pid. Containers on one host share a boot id but
    not their pids, so the pid namespace is compared too, and a pgid from elsewhere is
    never signalled.
    """

    host: str
    pid: int
    pgid: int
    started: str
    boot_id: str
    pid_ns: str
    """``/proc/self/ns/pid`` of the runner that started it, e.g. ``pid:[4026531836]``."""
    cgroup: str = ""
    """Its cgroup (v2) folder, where it has one."""

    @classmethod
    def of(cls, pid: int, pgid: int, cgroup: str = "") -> StepProcess:
        """A process this runner started, in its own pid namespace."""
        boot, _, ns = _machine().partition("/")
        return cls(socket.gethostname(), pid, pgid, _start_time(pid) or "", boot, ns, cgroup)

    def here(self) -> bool:
        """Whether its pids mean the same processes here: same host, boot and pid namespace."""
        boot, _, ns = _machine().partition("/")
        return bool(boot and ns) and (self.host, self.boot_id, self.pid_ns) == (socket.gethostname(), boot, ns)
