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

It is a few lines of shell, no interpreter to start, in one of two forms, chosen once per
run (:func:`find_shell`):

* **bash** (4 or later) on ``PATH``: the step's shell is bash, started as ``sh`` (its POSIX
  mode, which reads no start-up file such as ``$BASH_ENV``), and the sentinel is one fork of
  it, left out of the step's jobs (``disown``) so that a step ending in a bare ``wait`` does
  not wait for it. Its timer is bash's own ``read -t``: one loop of ``read -t SECONDS`` on the
  pipe ends at end-of-file (status 1) or when no line came in time (status above 128), so
  neither the sentinel's start nor a renewal forks anything. A function step spawns one bash.
* **/bin/sh** elsewhere (dash, Debian's ``/bin/sh``, has no ``read -t``): a shell step forks
  the sentinel from its own shell twice over (``( … & )``, out of the step's jobs), and its
  timer is a subshell sleeping for the lease's time; a renewal kills it (its ``sleep`` is
  left to run out, killed with the group at the latest) and starts the next. A function
  step spawns one ``sh``.

Both ignore SIGTERM, SIGINT, SIGHUP, SIGQUIT and SIGPIPE, which a step may send its own group
while cleaning up; they die with the group's SIGKILL when the step ends.

What no sentinel can stop: a descendant that leaves the process group *and* drops its
environment, outside a cgroup. A cgroup (:mod:`.cgroups`) catches it.
"""

from __future__ import annotations

import math
import os
import shlex
from dataclasses import dataclass

from marinbuild.backends.deadlines import Deadline

__all__ = ["FENCE_FD", "NO_GATE", "PORTABLE", "Shell", "fence_line", "find_shell", "write_line"]

FENCE_FD = 9
"""The descriptor the heartbeat pipe's read end is on, in the step and in its sentinel."""

NO_GATE = 125
"""Exit status of a step whose runner died before letting it through its gate."""

# Kill the cgroup first (it catches what left the group), then the group from inside it.
_KILL = '{ [ -z "$cg" ] || echo 1 > "$cg/cgroup.kill"; } 2>/dev/null; kill -KILL 0'

# The portable sentinel, with $l (seconds the lease covers, or "-") and $cg (a cgroup folder
# or "") set. Numbers only reach `sleep`: anything else on the pipe disarms the timer.
_SH_BODY = (
    "trap '' HUP INT TERM QUIT PIPE; t=; "
    "while :; do "
    '[ -z "$t" ] || kill -KILL "$t" 2>/dev/null; t=; '
    f'case $l in [0-9]*) (sleep "$l"; {_KILL}) & t=$! ;; esac; '
    f"read -r l <&{FENCE_FD} || break; "
    "done; "
    f"{_KILL}"
)

# The same with bash's `read -t` as the timer. A number with no digit but 0 has run out (bash
# would read `-t 0` as "poll once"); anything else but a number disarms the timer, as above.
# A read ends the loop at end-of-file (1), at its time-out (> 128) and on a malformed time.
_BASH_BODY = (
    "trap '' HUP INT TERM QUIT PIPE; "
    "while case $l in "
    "[0-9]*) case $l in *[1-9]*) read -r -t \"$l\" l ;; *) false ;; esac ;; "
    "*) read -r l ;; "
    f"esac; do :; done <&{FENCE_FD}; "
    f"{_KILL}"
)


@dataclass(frozen=True)
class Shell:
    """The shell a run's local steps and their sentinels run under (see the module's docstring).

    >>> PORTABLE.step_argv("echo hi", "")[:2]
    ['/bin/sh', '-c']
    >>> Shell("/usr/bin/bash", bash=True).step_argv("echo hi", "")[:2]
    ['sh', '-c']
    """

    path: str
    """The executable: bash, or ``/bin/sh``."""
    bash: bool

    def step_argv(self, command: str, cgroup: str) -> list[str]:
        """``argv`` of a shell step's first process (to start ``path``): gate, sentinel, ``command``."""
        return [self._name, "-c", self.gated(command, cgroup)]

    def gated(self, command: str, cgroup: str) -> str:
        """A shell step's script: read the gate, fork the sentinel, let go of the pipe, run ``command``.

        The sentinel is not one of the step's jobs: a step ending in a bare ``wait`` must not
        wait for it. It lets go of the step's output, which a reader may be waiting to see closed.
        """
        values = f"l=$_fence; cg={shlex.quote(cgroup)}"
        if self.bash:
            sentinel = f"{{ {values}; {_BASH_BODY}; }} </dev/null >/dev/null 2>&1 & disown"
        else:
            sentinel = f"( {values}; {{ {_SH_BODY}; }} </dev/null >/dev/null 2>&1 & )"
        return (
            f"read -r _fence <&{FENCE_FD} || exit {NO_GATE}\n"
            f"{sentinel}\n"
            f"exec {FENCE_FD}<&-; unset _fence\n"
            f"{command}"
        )

    def sentinel_argv(self, first: str, cgroup: str) -> list[str]:
        """``argv`` of a sentinel spawned on its own (function steps), fed ``first`` as its first line."""
        body = _BASH_BODY if self.bash else _SH_BODY
        return [self._name, "-c", f"l=$1; cg=$2; {body}", "step-fence", first, cgroup]

    @property
    def _name(self) -> str:
        # Named sh, bash keeps to POSIX and reads no start-up file ($BASH_ENV) before the gate.
        return "sh" if self.bash else self.path


PORTABLE = Shell("/bin/sh", bash=False)
"""The sentinel of ``/bin/sh`` and ``sleep``: what runs where there is no bash 4."""


def find_shell(search_path: str | None = None) -> Shell:
    """Bash 4 or later on ``search_path`` (default: ``$PATH``), else :data:`PORTABLE`.

    Asked once per run: the first ``bash`` on the path is started once to tell its version
    (``read -t`` takes fractions of a second from bash 4 on).
    """
    import subprocess  # only where a run starts steps

    for folder in (os.environ.get("PATH", os.defpath) if search_path is None else search_path).split(os.pathsep):
        candidate = os.path.join(folder or ".", "bash")
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            break
    else:
        return PORTABLE
    try:
        done = subprocess.run(["sh", "-c", 'echo "${BASH_VERSINFO-0}"'], executable=candidate, env={},
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
        major = int(done.stdout.strip() or 0)
    except (OSError, ValueError, subprocess.SubprocessError):
        return PORTABLE
    return Shell(os.path.abspath(candidate), bash=True) if done.returncode == 0 and major >= 4 else PORTABLE


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
