"""A guardian process that kills the runner's steps when the runner dies or stops renewing.

A step must not outlive the runner holding its lease, nor its lease: nobody would renew
it, and a second runner taking it over would run the step twice at once. The guardian is
the part that makes sure of it from outside the runner, so that it still works when the
runner is SIGKILLed, crashes, or is suspended (SIGSTOP, Ctrl-Z), when nothing in the
runner runs at all.

Each runner starts one small guardian process, in a session of its own so that Ctrl-C or
Ctrl-Z in the terminal does not reach it, and tells it through a pipe about each step:

* ``+TOKEN PGID MONO WALL [CGROUP]``: a step, its process group, its deadline (see
  :mod:`marinbuild.backends.deadlines`) and its cgroup where it has one (:mod:`.cgroups`),
  sent *before* the step may run;
* ``=TOKEN MONO WALL``: a later deadline, after each successful renewal of its lease;
* ``-TOKEN``: the step was reaped and its leftovers killed: forget it.

The guardian SIGKILLs a step's process group, and every process carrying its token
(:mod:`.containment`: those that left the group), when its deadline passes, and every
step still listed when the pipe reaches its end: the kernel closes the runner's end when
the runner exits, however it exits. A step with a cgroup is killed through ``cgroup.kill``
too: at the pipe's end always (the runner, which reuses its steps' cgroups, is gone), at a
deadline only while the step's first process is still in it (so that a cgroup already
handed to a later step is never killed).

The guardian is one of two fences: each step also carries its own sentinel (:mod:`.fence`),
which still works when the runner and the guardian are killed or stopped together.

The runner watches its guardian (the reaper waits on it like on a step) and starts a new
one at once if it dies, telling it every step still running.

Example::

    guardian = shared_guardian()
    guardian.adopt(token, pgid, deadline)   # after spawning a step, before letting it run
    guardian.extend(token, later)           # after each renewal of the step's lease
    guardian.release(token)                 # after reaping it
"""

from __future__ import annotations

import os
import sys
import threading

from marinbuild.backends.deadlines import Deadline
from marinbuild.backends.local.containment import TOKEN_VAR
from marinbuild.backends.local.reaper import shared_reaper

__all__ = ["Guardian", "shared_guardian"]

# Run with -I -S: no site packages to import, so it starts in a few milliseconds.
_GUARDIAN = r"""
import os, select, signal, sys, time
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGTSTP, signal.SIGPIPE):
    signal.signal(sig, signal.SIG_IGN)
VAR = sys.argv[3].encode()
fd = int(sys.argv[2])
steps, pending = {}, b""

def scan(token):
    needle = b"\0" + VAR + b"=" + token + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/" + name + "/environ", "rb") as f:
                    if needle in b"\0" + f.read() + b"\0":
                        found.append(int(name))
            except OSError:
                pass
    return found

def holds(cg, pid):
    try:
        with open(cg + "/cgroup.procs") as f:
            return str(pid) in f.read().split()
    except OSError:
        return False

def kill(token, pgid, cg=b"", ended=False):
    if cg and (ended or holds(cg.decode(), pgid)):
        try:
            with open(cg.decode() + "/cgroup.kill", "w") as f:
                f.write("1")
        except OSError:
            pass
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    for _ in range(50):
        left = scan(token)
        if not left:
            return
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)

while True:
    now_m, now_w = time.monotonic(), time.time()
    for token in [t for t, (_, m, w, _) in steps.items() if m <= now_m or w <= now_w]:
        pgid, _, _, cg = steps.pop(token)
        kill(token, pgid, cg)
    timeout = None
    if steps:
        # Wake at least every second: a wall clock that jumped (a VM thawed) is noticed soon.
        timeout = max(0.0, min(1.0, min(min(m - now_m, w - now_w) for _, m, w, _ in steps.values())))
    if not select.select([fd], [], [], timeout)[0]:
        continue
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\n")
    for line in lines:
        kind, words = line[:1], line[1:].split()
        if kind == b"+":
            steps[words[0]] = (int(words[1]), float(words[2]), float(words[3]), words[4] if len(words) > 4 else b"")
        elif kind == b"=" and words[0] in steps:
            pgid, _, _, cg = steps[words[0]]
            steps[words[0]] = (pgid, float(words[1]), float(words[2]), cg)
        elif kind == b"-":
            steps.pop(words[0], None)
for token, (pgid, _, _, cg) in steps.items():
    kill(token, pgid, cg, ended=True)
"""


class Guardian:
    """The runner's end of the pipe to its guardian process, and the steps it was told of."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe = -1
        self._pid = 0
        self._steps: dict[str, tuple[int, Deadline, str]] = {}
        self.restarts = 0
        """How many times a guardian that died was replaced."""

    @property
    def pid(self) -> int:
        """The guardian process now (0 before the first step)."""
        return self._pid

    def adopt(self, token: str, pgid: int, deadline: Deadline | None = None, cgroup: str = "") -> None:
        """Have ``pgid``, ``token`` (and ``cgroup``) killed if this runner dies, or once ``deadline`` passes.

        Returns once the guardian will hear of it whatever happens to this process next:
        the line is in the pipe, which the guardian reads to its end.
        """
        deadline = deadline or Deadline.never()
        with self._lock:
            self._steps[token] = (pgid, deadline, cgroup)
            self._send(_adopt_line(token, pgid, deadline, cgroup))

    def extend(self, token: str, deadline: Deadline) -> None:
        """The step's lease was renewed: it may run until ``deadline``."""
        with self._lock:
            if token in self._steps:
                pgid, _, cgroup = self._steps[token]
                self._steps[token] = (pgid, deadline, cgroup)
                self._send(f"={token} {deadline.words()}\n")

    def release(self, token: str) -> None:
        """The step was reaped and its leftovers killed: forget it (its pgid may be reused)."""
        with self._lock:
            if self._steps.pop(token, None) is not None and self._pipe >= 0:
                self._send(f"-{token}\n")

    def _send(self, line: str) -> None:
        if self._pipe < 0:
            self._start()
        try:
            os.write(self._pipe, line.encode())  # far below PIPE_BUF: one atomic write
        except BrokenPipeError:
            self._restart()  # it died and the reaper has not said so yet; the new one hears everything

    def _restart(self) -> None:
        self.restarts += 1
        self._start()
        # One write per step: each line is atomic, and the guardian reads lines as they come.
        for token, (pgid, deadline, cgroup) in self._steps.items():
            os.write(self._pipe, _adopt_line(token, pgid, deadline, cgroup).encode())

    def _start(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        read_end, write_end = os.pipe()  # neither end is inherited through exec
        try:
            os.set_inheritable(read_end, True)
            pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", _GUARDIAN, "marinbuild-guardian", str(read_end), TOKEN_VAR],
                os.environ,
                setsid=True,
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                ],
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        self._pipe, self._pid = write_end, pid
        _as_batch(pid)
        shared_reaper().watch(pid, lambda status: self._died(pid))

    def _died(self, pid: int) -> None:
        # From the reaper's thread: the guardian is gone (the OOM killer, a stray kill -9).
        with self._lock:
            if pid != self._pid:
                return  # an earlier one, already replaced
            if self._pipe >= 0:
                os.close(self._pipe)
                self._pipe = -1
            if self._steps:
                self._restart()

    def close_in_child(self) -> None:
        """In a forked step: let go of the pipe, so that only the runner keeps it open."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1
        self._steps = {}


def _as_batch(pid: int) -> None:
    """Run the guardian under ``SCHED_BATCH``: every line the runner writes wakes it, and a normal
    process woken would preempt the runner on its core, a context switch at each step's start
    and end; a batch one reads its lines at its turn (a tick later at most) and still kills on
    time. Where the policy is refused, it stays a normal process."""
    try:
        os.sched_setscheduler(pid, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):
        pass


def _adopt_line(token: str, pgid: int, deadline: Deadline, cgroup: str) -> str:
    # A cgroup folder with a space in its path is left out: the line is split on spaces.
    tail = f" {cgroup}" if cgroup and " " not in cgroup else ""
    return f"+{token} {pgid} {deadline.words()}{tail}\n"


_shared = Guardian()


def shared_guardian() -> Guardian:
    """The guardian of this process (its process starts with the first adopted step)."""
    return _shared
