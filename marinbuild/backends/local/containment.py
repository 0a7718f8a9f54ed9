"""Finding and killing every process a local step started, wherever it went.

A step runs in a process group of its own, but a child may leave it (``setsid``,
``Popen(process_group=0)``, a daemon). Every process of a step therefore carries
``MARINBUILD_STEP_TOKEN`` in its environment, inherited by whatever it starts; the token
names the runner process (pid and start time, as its lease's owner does) and the step's
output path, so both the runner and a runner taking the step over compute the same one.
Finding the token in ``/proc/PID/environ`` finds a process that left the group, as the
TPU teardown does on its hosts.

A full scan reads every process's environment (about 8 ms for 100 processes on a busy
2-core machine), so the scan after each step looks only at the pids handed out since the
step started: every descendant of a step was created after it, and Linux hands out pids
in increasing order until it wraps around.

A process that empties its own environment and leaves the group escapes this; a step's
cgroup (:mod:`.cgroups`), where there is one, catches it. A process that empties its
environment but stays in the group is killed with the group: by the runner, its guardian,
its own sentinel (:mod:`.fence`), or a runner taking the step over on this machine
(:func:`kill_step_group`, from the process recorded in the lease, once a member of the
group shows that it is the step's: its token, or the step's log as its output).
"""

from __future__ import annotations

import functools
import hashlib
import os
import signal
import stat
import time
from collections.abc import Callable

__all__ = [
    "TOKEN_VAR",
    "carries_token",
    "file_ids",
    "kill_step_group",
    "kill_token",
    "last_pid",
    "process_start",
    "processes_with",
    "runner_prefix",
    "step_token",
    "writes_to",
]

TOKEN_VAR = "MARINBUILD_STEP_TOKEN"

# Beyond this the pid counter may have gone all the way round: look at every process.
_NARROW_FOR = 600.0


def runner_prefix(pid: int, started: str) -> str:
    """The start of every token of the runner ``pid`` started at ``started`` (clock ticks)."""
    return f"{pid}.{started or 'x'}."


def step_token(output_path: str, pid: int | None = None, started: str | None = None) -> str:
    """The token of the step writing ``output_path``, run by ``pid`` (this process by default)."""
    if pid is None:
        pid, started = os.getpid(), _own_start()
    digest = hashlib.sha256(output_path.encode()).hexdigest()[:20]
    return runner_prefix(pid, started or "") + digest


@functools.cache
def _own_start() -> str:
    return process_start(os.getpid()) or ""


def process_start(pid: int) -> str | None:
    """Process ``pid``'s start time in clock ticks since boot (``/proc/PID/stat``); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def last_pid() -> int | None:
    """The pid most recently handed out in this pid namespace, where the kernel says."""
    try:
        with open("/proc/sys/kernel/ns_last_pid") as f:
            return int(f.read())
    except (OSError, ValueError):
        return None


def _candidates(since_pid: int | None, since: float | None) -> list[int] | range:
    last = last_pid()
    if since_pid is None or last is None or since is None or time.monotonic() - since > _NARROW_FOR:
        return [int(n) for n in os.listdir("/proc") if n.isdigit()]
    if 0 <= last - since_pid < 256:
        return range(since_pid, last + 1)  # a few pids since: trying each beats listing /proc
    pids = [int(n) for n in os.listdir("/proc") if n.isdigit()]
    if last >= since_pid:
        return [p for p in pids if since_pid <= p <= last]
    return [p for p in pids if p >= since_pid or p <= last]  # wrapped around once


def processes_with(token: str, *, prefix: bool = False, since_pid: int | None = None,
                   since: float | None = None) -> list[int]:
    """Live processes whose environment holds ``token`` (or a token starting with it).

    ``since_pid`` and ``since`` (a ``time.monotonic()``) narrow the scan to pids handed out
    from ``since_pid`` on, when that was recently enough for the pid counter not to have
    gone round. Zombies have no environment left and are not found.
    """
    needle = f"\0{TOKEN_VAR}={token}".encode() + (b"" if prefix else b"\0")
    me = os.getpid()
    found = []
    for pid in _candidates(since_pid, since):
        if pid == me:
            continue
        env = _environ(pid)
        if env is None:
            continue
        if needle in env if prefix else needle in env + b"\0":
            found.append(pid)
    return found


def _environ(pid: int) -> bytes | None:
    """A process's environment, led by a NUL; None when it is gone or not ours to read."""
    for _ in range(3):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read()
        except OSError:  # gone, or another user's: a runner cannot have started it
            return None
        if env:
            return b"\0" + env
        # Empty: a zombie or a kernel thread, or a read that lost a race with the process's
        # memory map (the kernel then returns nothing); asked again before being believed.
    return b"\0"


def kill_token(token: str, *, prefix: bool = False, since_pid: int | None = None, since: float | None = None,
               rounds: int = 50, settle: int = 1) -> list[int]:
    """SIGKILL every process holding ``token``, again until none is left; the survivors.

    A process may fork while it is being killed, so the scan repeats until it finds
    nothing ``settle`` times in a row (at most ``rounds`` scans).
    """
    left: list[int] = []
    clear = 0
    for _ in range(rounds):
        left = processes_with(token, prefix=prefix, since_pid=since_pid, since=since)
        if not left:
            clear += 1
            if clear >= settle:
                return []
            continue
        clear = 0
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
    return left


def kill_step_group(pid: int, pgid: int, started: str, proven: Callable[[int], bool], rounds: int = 50) -> list[int]:
    """SIGKILL the process group of a step whose first process was ``pid``; the survivors.

    For a runner taking over a step whose runner ran on this machine, in this pid namespace:
    the group holds what dropped the step's token. A lease file may have been written by
    anyone, so its numbers alone decide nothing: the group is killed only when one of its
    live members is ``proven`` to be the step's (it carries the step's token, or writes the
    step's log), and ``started`` tells the step's first process from a later one given the
    same pid (a pid is not handed out again while a process group of that number has
    members, so a ``pgid`` whose leader is gone still names the step's group, or none).
    """
    if pid <= 1 or pgid <= 1:
        return []
    leader = process_start(pgid)
    if leader is not None and (pgid != pid or leader != started):
        return []  # the pgid's number belongs to another process now
    if not any(proven(member) for member in _members(pgid)):
        return []  # nothing shows that this group is the step's
    left: list[int] = []
    for _ in range(rounds):
        try:
            os.killpg(pgid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        left = _members(pgid)
        if not left:
            return []
        time.sleep(0.002)
    return left


def carries_token(pid: int, token: str) -> bool:
    """Whether process ``pid``'s environment holds the step token ``token``."""
    env = _environ(pid)
    return env is not None and f"\0{TOKEN_VAR}={token}\0".encode() in env + b"\0"


def file_ids(folder: str) -> frozenset[tuple[int, int]]:
    """Device and inode of each regular file in ``folder`` that has no other name (a step's logs)."""
    ids = set()
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stat.S_ISREG(st.st_mode) and st.st_nlink == 1:  # another name could be anyone's file
                    ids.add((st.st_dev, st.st_ino))
    except OSError:
        pass
    return frozenset(ids)


def writes_to(pid: int, ids: frozenset[tuple[int, int]]) -> bool:
    """Whether process ``pid``'s standard output or error is one of the files ``ids``."""
    if not ids:
        return False
    for fd in (1, 2):
        try:
            st = os.stat(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in ids:
            return True
    return False


def _members(pgid: int) -> list[int]:
    """Live (not zombie) processes in process group ``pgid``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] not in ("Z", "X") and int(fields[2]) == pgid:
            found.append(int(name))
    return found
