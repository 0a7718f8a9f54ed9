"""A guardian process that kills the runner's steps when the runner dies, however it dies.

A step must not outlive the runner holding its lease: nobody would renew the lease, and
a second runner taking it over would run the step twice at once. The kernel can kill a
child when its parent dies (``PR_SET_PDEATHSIG``), but only the child can ask for it: a
shell step had to be started through ``setpriv``, an extra program that doubled the CPU
cost of starting a trivial step (0.85 → 1.8 ms measured), and the step's own children
were not covered.

Instead each runner starts one small guardian process, in a session of its own so that
Ctrl-C in the terminal does not reach it, and tells it through a pipe which process
groups it starts (``+PGID``) and reaps (``-PGID``). The kernel closes the pipe when the
runner exits, even on SIGKILL; the guardian then kills every group still listed, so the
whole group of a step dies, grandchildren included. A step forked for a function still
sets the death signal itself, which covers the instant between its start and its
registration.

Example::

    guardian = shared_guardian()
    guardian.adopt(pid)      # right after starting a step in its own session
    guardian.release(pid)    # after reaping it
"""

from __future__ import annotations

import os
import sys
import threading

__all__ = ["Guardian", "shared_guardian"]

# Run with -I -S: no site packages to import, so it starts in a few milliseconds.
_GUARDIAN = r"""
import os, signal, sys
for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
    signal.signal(sig, signal.SIG_IGN)
groups, pending = set(), b""
fd = int(sys.argv[2])
while True:
    chunk = os.read(fd, 65536)
    if not chunk:
        break
    *lines, pending = (pending + chunk).split(b"\n")
    for line in lines:
        (groups.add if line[:1] == b"+" else groups.discard)(int(line[1:]))
for pgid in groups:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
"""


class Guardian:
    """The runner's end of the pipe to its guardian process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pipe = -1
        self._pid = 0

    def adopt(self, pgid: int) -> None:
        """Have the process group ``pgid`` killed if this runner dies before releasing it."""
        with self._lock:
            if self._pipe < 0 or not _alive(self._pid):
                self._start()
            self._send(f"+{pgid}\n")

    def release(self, pgid: int) -> None:
        """The group ``pgid`` was reaped: forget it (its number may be reused)."""
        with self._lock:
            if self._pipe >= 0:
                self._send(f"-{pgid}\n")

    def _send(self, line: str) -> None:
        os.write(self._pipe, line.encode())  # far below PIPE_BUF: one atomic write

    def _start(self) -> None:
        if self._pipe >= 0:
            os.close(self._pipe)
        read_end, write_end = os.pipe()  # neither end is inherited through exec
        try:
            os.set_inheritable(read_end, True)
            self._pid = os.posix_spawn(
                sys.executable,
                [sys.executable, "-I", "-S", "-c", _GUARDIAN, "marinbuild-guardian", str(read_end)],
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
        self._pipe = write_end

    def close_in_child(self) -> None:
        """In a forked step: let go of the pipe, so that only the runner keeps it open."""
        if self._pipe >= 0:
            os.close(self._pipe)
            self._pipe = -1


def _alive(pid: int) -> bool:
    # Reaps the guardian if it died (it is our child), so it can be started again.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return False
    return done == 0


_shared = Guardian()


def shared_guardian() -> Guardian:
    """The guardian of this process (its process starts with the first adopted step)."""
    return _shared
