"""A runner that stalls between its lease check and its commit cannot commit: the store refuses it.

The stale runner's requests are held (a partition: ``tests/gcs_server.py`` holds one
process's requests; on local disk the runner is blocked on the record's lock and
SIGSTOPped there) until its lease has passed to a second runner that finishes the step.
Let through, its commit is refused by the store (a generation precondition; the lease's
compare-and-swap on local disk): the second runner's status and info stand, and the first
runner reports that it lost the step's lease.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from marinbuild.store.markers import read_info, read_status
from marinbuild.store.storage import Storage
from tests.helpers import marinbuild, start_marinbuild, write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

MARINFILE = """
from marinbuild import step, versioned

step("train", cmd="echo start >> {log}; sleep 1; echo end >> {log}", config={{"v": versioned(1)}})
"""

LEASES = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "2"}


def wait_for(what: str, condition: object, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if callable(condition) and condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"gave up waiting for {what}")


def lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def test_a_partitioned_runner_s_commit_on_gs_is_refused_and_the_taker_s_status_kept(
    gcs_emulator: Emulator, gcs_prefix: str, project: Path, tmp_path: Path
) -> None:
    log = tmp_path / "steps.log"
    write_marinfile(project, MARINFILE.format(log=log))
    env = {**gcs_emulator.env, **LEASES, "MARIN_PREFIX": gcs_prefix}
    first = start_marinbuild("run", "train", cwd=project, env=env)
    try:
        wait_for("the first runner's step to start", lambda: lines(log) == ["start"])
        # From its commit's first write on (the final info JSON), nothing of it reaches the store.
        gcs_emulator.control("hold", pid=first.pid, at=r"POST /upload/\S+ object=\S+/\.marinbuild/info\.json$")
        wait_for("the commit to be held", lambda: gcs_emulator.control("held", pid=first.pid)["waiting"] > 0)
        held_since = time.time()
        second = marinbuild("run", "train", cwd=project, env=env, timeout=120)
        assert second.returncode == 0, second.stdout + second.stderr
        assert lines(log) == ["start", "end", "start", "end"]  # taken over after the expiry, run again
        status = json.loads(marinbuild("status", "--json", cwd=project, env=env).stdout)
        taker = status[0]
    finally:
        gcs_emulator.control("release", pid=first.pid)
    out, err = first.communicate(timeout=120)
    assert "lost its lease" in out + err, out + err
    after = json.loads(marinbuild("status", "--json", cwd=project, env=env).stdout)[0]
    assert after["status"] == "SUCCESS" and after == taker  # the taker's status stands
    storage = Storage.for_prefix(gcs_prefix)
    marker = read_status(storage, after["output_path"])
    assert marker is not None and marker.owner is not None and not marker.owner.endswith(f":{first.pid}")
    info = read_info(storage, after["output_path"])
    assert info is not None and info["start_time"] > held_since and "end_time" in info  # the taker's info


def _blocked_on(path: Path, pid: int) -> bool:
    """Whether ``pid`` waits for a POSIX lock on ``path`` (a ``->`` line of /proc/locks)."""
    inode = os.stat(path).st_ino
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        if "->" in fields and str(pid) in fields and any(f.endswith(f":{inode}") for f in fields):
            return True
    return False


_GATED = """
from marinbuild import step, versioned

step("train", cmd="echo start >> {log}; sleep 1; echo end >> {log}; until [ -e {gate} ]; do sleep 0.02; done",
     config={{"v": versioned(1)}})
"""

_FCNTL = {"x86_64": "72", "aarch64": "25"}
"""The number of the ``fcntl`` system call, as ``/proc/PID/syscall`` names it."""
_FUTEX = {"x86_64": "202", "aarch64": "98"}


def _syscall(pid: int, tid: int) -> tuple[str, str]:
    """The system call thread ``tid`` of ``pid`` waits in, and its wait channel ("" where gone)."""
    try:
        call = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        wchan = Path(f"/proc/{pid}/task/{tid}/wchan").read_text()
    except OSError:
        return "", ""
    return (call[0] if call else ""), wchan


def _waits_in_fcntl(pid: int) -> bool:
    """Whether the run loop of ``pid`` (its main thread, which commits on local disk) waits for the
    step's lock: in ``fcntl`` itself, or on the lock's mutex while a lease renewal of another thread
    waits in ``fcntl`` (the renewal may reach the lock first). Either way the commit is granted the
    lock only after the test lets it go."""
    machine = os.uname().machine

    def in_fcntl(tid: int) -> bool:
        call, wchan = _syscall(pid, tid)
        return call == _FCNTL.get(machine) or wchan == "fcntl_setlk"

    if in_fcntl(pid):
        return True
    try:
        others = [int(t) for t in os.listdir(f"/proc/{pid}/task") if int(t) != pid]
    except OSError:
        return False
    return _syscall(pid, pid)[0] == _FUTEX.get(machine) and any(in_fcntl(t) for t in others)


def test_a_stopped_runner_s_commit_on_local_disk_is_refused_and_the_taker_s_status_kept(
    project: Path, tmp_path: Path
) -> None:
    import fcntl

    log = tmp_path / "steps.log"
    gate = tmp_path / "gate"
    prefix = tmp_path / "prefix"
    write_marinfile(project, _GATED.format(log=log, gate=gate))
    env = {**LEASES, "MARIN_PREFIX": str(prefix)}
    first = start_marinbuild("run", "train", cwd=project, env=env)
    stopped = False
    try:
        # The step waits at its end until the test holds the step's lock; the lease's renewals
        # may wait for it too (one lock guards the step's lease and records).
        wait_for("the first runner's step to run", lambda: lines(log) == ["start", "end"])
        lock = next(prefix.glob("train-*/.marinbuild/lease.lock"))
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)  # the runner's commit waits here, after its lease check
            gate.touch()
            wait_for("the commit to wait for the lock",
                     lambda: _blocked_on(lock, first.pid) and _waits_in_fcntl(first.pid))
            os.kill(first.pid, signal.SIGSTOP)
            stopped = True
            # Stopped while it waits, not after it was granted the lock (kill returns before it stops).
            wait_for("the runner to stop", lambda: Path(f"/proc/{first.pid}/stat").read_text().split()[2] == "T")
        finally:
            os.close(fd)
        second = marinbuild("run", "train", cwd=project, env=env, timeout=120)
        assert second.returncode == 0, second.stdout + second.stderr
        assert lines(log) == ["start", "end", "start", "end"]
        taker = json.loads(marinbuild("status", "--json", cwd=project, env=env).stdout)[0]
        info = json.loads(next(prefix.glob("train-*/.marinbuild/info.json")).read_text())
    finally:
        if stopped:
            os.kill(first.pid, signal.SIGCONT)
    out, err = first.communicate(timeout=120)
    assert "lost its lease" in out + err, out + err
    after = json.loads(marinbuild("status", "--json", cwd=project, env=env).stdout)[0]
    assert after["status"] == "SUCCESS" and after == taker
    assert json.loads(next(prefix.glob("train-*/.marinbuild/info.json")).read_text()) == info  # the taker's
    assert "end_time" in info
