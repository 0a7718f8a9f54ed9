"""Each local step's own fence: a small shell process inside the step's process group.

The guardian (:mod:`.guardian`) kills a step when its runner dies or stops renewing the
step's lease, but it is one process beside the runner: ``pkill -9 -f marinbuild``, an OOM
kill of their cgroup or a suspended laptop takes both at once, and then nothing was left to
kill a step that had dropped its environment (``exec env -i …``,
``subprocess.run(..., env={...})``), which no token scan can find.

So every step also carries a *sentinel* of its own, started by the step's first process
before the step's command runs, in the step's process group (and its cgroup, where there is
one), depending on nothing outside it:

* it holds the read end of the step's *heartbeat pipe*. The runner keeps the write end open
  while the step runs; the kernel closes it when the runner exits, however it exits, so
  end-of-file means the runner is gone;
* each line on the pipe is the number of seconds the step's lease now covers (``-`` for
  none): the runner writes one after each successful renewal. A runner that stops
  renewing (suspended, cut off from its store) writes nothing, and the sentinel's timer,
  re-armed at each line, runs out;

and then it kills the whole group (and the cgroup): ``kill -KILL 0`` from inside, so no pid
is ever guessed. The first line doubles as the step's *gate*: the step's first process reads
it before anything else and exits without running anything (status 125) at end-of-file.

It is plain POSIX ``sh`` and ``sleep``, no interpreter to start: a shell step forks it from
its own shell (two forks of ``sh``, no exec), a function step spawns one ``sh``. The timer
is a subshell sleeping for the lease's time; a renewal kills it (its ``sleep`` is left to
run out, killed with the group at the latest) and starts the next. The sentinel ignores
SIGTERM, SIGINT and SIGHUP, which a step may send its own group while cleaning up; it
dies with the group's SIGKILL when the step ends.

What no sentinel can stop: a descendant that leaves the process group *and* drops its
environment, outside a cgroup. A cgroup (:mod:`.cgroups`) catches it.
"""

from __future__ import annotations

import math
import os
import shlex

from marinbuild.backends.deadlines import Deadline

__all__ = ["FENCE_FD", "NO_GATE", "fence_line", "fence_script", "gated_shell", "sentinel_argv", "write_line"]

FENCE_FD = 9
"""The descriptor the heartbeat pipe's read end is on, in the step and in its sentinel."""

NO_GATE = 125
"""Exit status of a step whose runner died before letting it through its gate."""

# Kill the cgroup first (it catches what left the group), then the group from inside it.
_KILL = '{ [ -z "$cg" ] || echo 1 > "$cg/cgroup.kill"; } 2>/dev/null; kill -KILL 0'

# The sentinel, with $l (seconds the lease covers, or "-") and $cg (a cgroup folder or "")
# set. Numbers only reach `sleep`: anything else on the pipe disarms the timer.
_BODY = (
    "trap '' HUP INT TERM QUIT PIPE; t=; "
    "while :; do "
    '[ -z "$t" ] || kill -KILL "$t" 2>/dev/null; t=; '
    f'case $l in [0-9]*) (sleep "$l"; {_KILL}) & t=$! ;; esac; '
    f"read -r l <&{FENCE_FD} || break; "
    "done; "
    f"{_KILL}"
)


def fence_script() -> str:
    """The sentinel's ``sh`` text, run as ``sh -c SCRIPT step-fence SECONDS CGROUP``."""
    return f'l=$1; cg=$2; {_BODY}'


def sentinel_argv(first: str, cgroup: str) -> list[str]:
    """``argv`` of a sentinel spawned on its own (function steps), fed ``first`` as its first line."""
    return ["/bin/sh", "-c", fence_script(), "step-fence", first, cgroup]


def gated_shell(command: str, cgroup: str) -> str:
    """A shell step's script: read the gate, fork the sentinel, let go of the pipe, run ``command``.

    The sentinel is forked twice over (``( … & )``) so that it is not one of the step's
    jobs: a step ending in a bare ``wait`` must not wait for it. It lets go of the step's
    output, which a reader may be waiting to see closed.
    """
    return (
        f"read -r _fence <&{FENCE_FD} || exit {NO_GATE}\n"
        f"( l=$_fence; cg={shlex.quote(cgroup)}; {{ {_BODY}; }} </dev/null >/dev/null 2>&1 & )\n"
        f"exec {FENCE_FD}<&-; unset _fence\n"
        f"{command}"
    )


def fence_line(deadline: Deadline | None) -> bytes:
    """The line telling a sentinel how long the step may run from now: seconds, or ``-``."""
    if deadline is None or math.isinf(deadline.monotonic):
        return b"-\n"
    return f"{deadline.remaining():.3f}\n".encode()


def write_line(fd: int, line: bytes) -> bool:
    """Send ``line`` down a heartbeat pipe; False when nobody reads it any more (the step is gone)."""
    try:
        os.write(fd, line)  # far below PIPE_BUF: one atomic write, never split
    except (BrokenPipeError, BlockingIOError, OSError):
        return False
    return True
