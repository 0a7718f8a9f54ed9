"""A cgroup (v2) per local step, where this process may make them: nothing a step starts escapes it.

A process group and a step token (:mod:`.containment`) find everything a step started
except a descendant that both leaves the group and drops its environment. A cgroup holds
every descendant whatever it does (only a process allowed to write to ``cgroup.procs``
elsewhere could move one out), and ``cgroup.kill`` SIGKILLs all of them at once.

So where the runner's own cgroup is on a cgroup v2 hierarchy and writable, and its
children have ``cgroup.kill`` (Linux 5.14), each step is moved into a cgroup of its own, a child of the
runner's, while it still waits at its gate: whatever it starts is born inside. The runner,
the guardian and the step's sentinel all kill through it. Elsewhere (cgroup v1 only, a
read-only hierarchy, an unprivileged runner without a delegated subtree) nothing changes.

Making and removing a cgroup costs about as much as starting a trivial step, so they are
kept: a step's cgroup, once empty, serves the next step, and they are removed when the
runner exits (those of a runner that died are removed by the next runner on the machine
that uses cgroups, once empty).

Example::

    cgroups = shared_cgroups()
    folder = cgroups.take()          # "" where there are no cgroups
    cgroups.enter(folder, pid)       # before the step may run
    ...
    cgroups.kill(folder)
    cgroups.give_back(folder)
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import os
import threading
import time

__all__ = [
    "StepCgroups",
    "cgroup_emptied",
    "cgroup_folder",
    "cgroup_holds",
    "kill_cgroup",
    "runner_cgroups",
    "runners_cgroup",
    "shared_cgroups",
]

_PREFIX = "marinbuild-step-"
_names = itertools.count()  # one sequence per process: two pools never pick the same name
_OFF = "MARINBUILD_CGROUPS"
"""Set to ``0`` to run steps without cgroups even where they could be made."""


def cgroup_folder(pid: int | str = "self") -> str | None:
    """The cgroup v2 folder of process ``pid`` as this process sees it; None when there is none."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
        with open("/proc/self/mountinfo") as f:
            mounts = f.read().splitlines()
    except OSError:
        return None
    path = next((line[3:] for line in lines if line.startswith("0::")), None)
    if path is None or path.endswith(" (deleted)"):
        return None
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        if rest.split(" ", 1)[0] == "cgroup2":
            parts = fields.split()
            root, mount = parts[3], parts[4]
            if root == "/":
                return os.path.join(mount, path.lstrip("/")).rstrip("/") or "/"
    return None


def _cgroup2_mounts() -> list[str]:
    """Where cgroup v2 hierarchies are mounted, as this process sees them."""
    try:
        with open("/proc/self/mountinfo") as f:
            mounts = f.read().splitlines()
    except OSError:
        return []
    found = []
    for line in mounts:
        fields, _, rest = line.partition(" - ")
        if rest.split(" ", 1)[0] == "cgroup2":
            found.append(fields.split()[4])
    return found


def _stem(pid: int, started: str) -> str:
    return f"{_PREFIX}{pid}.{started or 'x'}-"


def runners_cgroup(folder: str, pid: int, started: str) -> bool:
    """Whether ``folder`` is a step cgroup of the runner ``pid`` that started at ``started``.

    What a runner taking a step over may kill on the word of a lease file: a folder named
    for that runner (``marinbuild-step-PID.START-N``, which only that runner makes), on a
    cgroup v2 hierarchy, reached without a link. Any other path a lease names is left alone.
    """
    if not folder or not started or not os.path.isabs(folder):
        return False
    norm = os.path.normpath(folder)
    if norm != folder or os.path.realpath(norm) != norm:
        return False
    name = os.path.basename(norm)
    stem = _stem(pid, started)
    if not (name.startswith(stem) and name[len(stem):].isdigit()):
        return False
    return any(norm.startswith(mount.rstrip("/") + "/") for mount in _cgroup2_mounts())


def runner_cgroups(pid: int, started: str, parents: list[str]) -> list[str]:
    """The step cgroups of the runner ``pid`` (started at ``started``) found in the folders ``parents``."""
    stem = _stem(pid, started)
    found: list[str] = []
    for parent in dict.fromkeys(p for p in parents if p):
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        found += [os.path.join(parent, n) for n in names if n.startswith(stem) and n[len(stem):].isdigit()]
    return [f for f in found if runners_cgroup(f, pid, started)]


def cgroup_emptied(folder: str, rounds: int = 500) -> bool:
    """Wait (a few milliseconds a round) until the cgroup ``folder`` holds no process; False if it still does."""
    for _ in range(rounds):
        if _populated(folder) is not True:
            return True
        time.sleep(0.002)
    return False


def _write(path: str, text: str) -> None:
    # Raw descriptors: these files are written at every step's start and end, where a text
    # file object's set-up (fstat, ioctl, two seeks) costs more than the write.
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode(errors="replace")
    finally:
        os.close(fd)


def kill_cgroup(folder: str) -> bool:
    """SIGKILL every process in the cgroup ``folder``; False when that cannot be done."""
    if not folder:
        return False
    try:
        _write(os.path.join(folder, "cgroup.kill"), "1")
    except OSError:
        return False
    return True


def cgroup_holds(folder: str, pid: int) -> bool:
    """Whether process ``pid`` is in the cgroup ``folder`` now."""
    try:
        with open(os.path.join(folder, "cgroup.procs")) as f:
            return str(pid) in f.read().split()
    except OSError:
        return False


def _ticks_started(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _populated(folder: str) -> bool | None:
    try:
        events = _read_small(os.path.join(folder, "cgroup.events"))
    except OSError:
        return None
    for line in events.splitlines():
        if line.startswith("populated "):
            return line.split()[1] != "0"
    return None


class StepCgroups:
    """The cgroups of this runner's steps: made under ``parent`` on demand, reused once empty."""

    def __init__(self, parent: str | None) -> None:
        self.parent = parent
        self._lock = threading.Lock()
        self._free: list[str] = []
        self._draining: list[str] = []
        self._all: set[str] = set()
        pid = os.getpid()
        self._stem = _stem(pid, _ticks_started(pid) or "")
        if parent is not None:
            self._sweep()
            atexit.register(self.remove_all)

    @property
    def usable(self) -> bool:
        return self.parent is not None

    def take(self) -> str:
        """An empty cgroup for a step, or ``""`` where there are none (or making one failed)."""
        if self.parent is None:
            return ""
        with self._lock:
            if self._draining:
                still: list[str] = []
                for folder in self._draining:
                    (self._free if _populated(folder) is False else still).append(folder)
                self._draining = still
            if self._free:
                return self._free.pop()
            folder = os.path.join(self.parent, f"{self._stem}{next(_names)}")
        try:
            os.mkdir(folder)
        except OSError:
            return ""
        with self._lock:
            self._all.add(folder)
        if not os.path.exists(os.path.join(folder, "cgroup.kill")):
            # A kernel before 5.14: the cgroup would hold the step but could not kill it.
            self.parent = None
            self.remove_all()
            return ""
        return folder

    def enter(self, folder: str, pid: int) -> bool:
        """Move ``pid`` (a step still at its gate) into ``folder``; False when it could not be."""
        if not folder:
            return False
        try:
            _write(os.path.join(folder, "cgroup.procs"), str(pid))
        except OSError:
            return False
        return True

    def kill(self, folder: str) -> bool:
        """SIGKILL everything in the step's cgroup."""
        return kill_cgroup(folder)

    def give_back(self, folder: str) -> None:
        """The step is over and its cgroup killed: reuse it once empty."""
        if not folder:
            return
        with self._lock:
            (self._free if _populated(folder) is False else self._draining).append(folder)

    def remove_all(self) -> None:
        """Remove this runner's cgroups (those still holding processes are killed first)."""
        with self._lock:
            folders, self._all = list(self._all), set()
            self._free, self._draining = [], []
        for folder in folders:
            if _populated(folder):
                kill_cgroup(folder)
        # The killed take a moment to die, and rmdir refuses a cgroup still holding one: waited
        # for (briefly), so that nothing of a step outlives the runner's exit, nor its cgroup.
        deadline = time.monotonic() + 2
        for folder in folders:
            while _populated(folder) and time.monotonic() < deadline:
                time.sleep(0.002)
            with contextlib.suppress(OSError):
                os.rmdir(folder)

    def _sweep(self) -> None:
        # Cgroups left by runners that died: removed once empty (rmdir refuses a populated one).
        assert self.parent is not None
        try:
            names = os.listdir(self.parent)
        except OSError:
            return
        for name in names:
            if not name.startswith(_PREFIX):
                continue
            owner = name[len(_PREFIX):].rsplit("-", 1)[0]
            pid_text, _, started = owner.partition(".")
            if pid_text.isdigit() and _ticks_started(int(pid_text)) == started:
                continue  # its runner still runs
            with contextlib.suppress(OSError):
                os.rmdir(os.path.join(self.parent, name))


def _usable_parent() -> str | None:
    if os.environ.get(_OFF, "") == "0":
        return None
    folder = cgroup_folder()
    # The root cgroup has no cgroup.kill of its own; its children do (checked on the first one).
    if folder is None or not os.access(folder, os.W_OK) or not os.access(os.path.join(folder, "cgroup.procs"), os.W_OK):
        return None
    return folder


_shared: StepCgroups | None = None
_shared_lock = threading.Lock()


def shared_cgroups() -> StepCgroups:
    """This runner's step cgroups, found on first use."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = StepCgroups(_usable_parent())
        return _shared
