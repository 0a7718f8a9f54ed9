"""No first-heartbeat window, and a lease file that names strangers kills nobody: real runners, real signals.

Each test is a reproduction. The runner, its guardian and the step's sentinel are
SIGKILLed together (as ``pkill -9`` of everything carrying the step's token does) before
the lease's first renewal, while the step runs from a process that dropped its
environment; or a function step's helper that left the step's group and environment
outlives its forked leader. A second runner takes the step over: the recorded ``PID TIME``
lines of the two attempts never overlap. And a hand-written lease naming an unrelated
process group and cgroup, with a dead owner on this machine, makes the runner that takes it
over kill nothing.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from marinbuild.backends.local.cgroups import cgroup_folder, shared_cgroups
from marinbuild.backends.local.containment import process_start

from .helpers import (
    alive,
    marinbuild,
    missing_tool,
    plan_json,
    start_marinbuild,
    status_of,
    wait_dead,
    wait_for_text,
    write_marinfile,
)
from .test_never_twice import assert_never_overlapping, beats, guardians_of, wait_until

# A first renewal 30 s after the step starts: the whole test happens before it.
FIRST_BEAT_LATE = {"MARINBUILD_LEASE_HEARTBEAT": "30", "MARINBUILD_LEASE_EXPIRY": "120",
                   "MARINBUILD_LEASE_POLL": "0.2"}
FAST = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "2", "MARINBUILD_LEASE_POLL": "0.2"}
RENEWING_WITH_SLACK = {**FAST, "MARINBUILD_LEASE_EXPIRY": "6"}
"""Renewals as often as FAST's, but a fence 5.5 s after the last one: a busy machine can stall the
runner's renewals past FAST's 1.5 s, and its fence then kills the step, helper and all, before the
test kills the runner."""
NO_CGROUPS = {"MARINBUILD_CGROUPS": "0"}

SH_STEP = """
from marinbuild import step
step("long", cmd='''if [ -e {project}/ran ]; then n=5; else n=3000; fi; touch {project}/ran
exec env -i N=$n /bin/sh -c '{inner}'
''')
"""

FN_STEP = """
import os, subprocess
from marinbuild import step

def work(cfg):
    n = 5 if os.path.exists("{project}/ran") else 3000
    open("{project}/ran", "w").close()
    {how}(["/bin/sh", "-c", 'echo $$ > {project}/step.pid; {beats}'], env={{"PATH": "/usr/bin:/bin", "N": str(n)}}{extra})
    {then}

step("long", fn=work)
"""


def _members_with_token(pgid: int) -> list[int]:
    """The processes of group ``pgid`` that still carry a step token: the step's sentinel and its timer."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            env = Path(f"/proc/{name}/environ").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and b"MARINBUILD_STEP_TOKEN=" in env:
            found.append(int(name))
    return found


def _kill_runner_guardian_and_sentinel(runner: subprocess.Popen[str], pgid: int) -> None:
    assert wait_until(lambda: len(guardians_of(runner.pid)) == 1)
    (guardian,) = guardians_of(runner.pid)
    sentinel = _members_with_token(pgid)
    assert sentinel, "the step's sentinel was not found"
    # Stopped first, all three, so that none of them sees another die and kills the step
    # (on a loaded machine the test may be descheduled between two kills); then killed, the
    # runner last. Its death orphans the step's process group, and the kernel then sends
    # SIGHUP and SIGCONT to a group holding a stopped process: a sentinel still stopped would
    # be let go, see its runner gone and kill the step's cgroup before its own SIGKILL came.
    for pid in (runner.pid, guardian, *sentinel):
        _signal(pid, signal.SIGSTOP)
    for pid in (*sentinel, guardian, runner.pid):
        _signal(pid, signal.SIGKILL)
    runner.communicate(timeout=30)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _lease(project: Path) -> dict:
    out = Path(plan_json(project, env=FAST)["long"]["output_path"])
    return json.loads((out / ".marinbuild" / "lease").read_text())


@pytest.mark.parametrize("cgroups", ["on", "off"])
def test_a_step_whose_runner_guardian_and_sentinel_die_before_the_first_renewal_is_killed_by_its_taker(
        project: Path, cgroups: str) -> None:
    log = project / "beats.log"
    inner = f"echo $$ > {project}/step.pid; {beats(log, '$N', 0.05)}"
    write_marinfile(project, SH_STEP.format(project=project, inner=inner))
    env = {**FIRST_BEAT_LATE, **(NO_CGROUPS if cgroups == "off" else {})}
    runner = start_marinbuild("run", cwd=project, env=env)
    wait_for_text(log, 60)
    step_pid = int(wait_for_text(project / "step.pid"))
    lease = _lease(project)
    # One write only, the step's record, before it passed its gate; no renewal yet.
    assert lease["beat"] == 1 and lease.get("step", {}).get("pid") == step_pid, lease
    _kill_runner_guardian_and_sentinel(runner, step_pid)
    assert alive(step_pid), "nothing but the taker is left to kill the step"

    second = marinbuild("run", cwd=project, env={**FAST, **(NO_CGROUPS if cgroups == "off" else {})})
    assert second.returncode == 0, second.stdout + second.stderr
    spans = assert_never_overlapping(log)
    assert step_pid in spans and len(spans) == 2
    assert status_of(plan_json(project, env=FAST)["long"]["output_path"])["status"] == "SUCCESS"


def _cgroups_usable() -> str | None:
    if os.environ.get("MARINBUILD_CGROUPS") == "0" or not shared_cgroups().usable:
        return "no writable cgroup v2 hierarchy with cgroup.kill here"
    return None


def test_a_function_steps_helper_in_a_session_of_its_own_without_its_environment_is_killed_by_the_taker(
        project: Path) -> None:
    why = _cgroups_usable()
    if why is not None:
        missing_tool(why)
    log = project / "beats.log"
    write_marinfile(project, FN_STEP.format(
        project=project, beats=beats(log, "$N", 0.05), how="helper = subprocess.Popen",
        extra=", start_new_session=True", then="helper.wait()"))
    runner = start_marinbuild("run", cwd=project, env=RENEWING_WITH_SLACK)
    wait_for_text(log, 60)
    helper = int(wait_for_text(project / "step.pid"))
    assert wait_until(lambda: "cgroup" in _lease(project).get("step", {}))
    lease = _lease(project)
    leader = lease["step"]["pid"]
    assert os.getpgid(helper) != leader  # it left the step's group, and its environment
    _kill_runner_guardian_and_sentinel(runner, leader)
    # The forked leader dies with its runner (its death signal); the helper lives on.
    assert wait_until(lambda: not alive(leader))
    assert alive(helper)

    second = marinbuild("run", cwd=project, env=FAST)
    assert second.returncode == 0, second.stdout + second.stderr
    spans = assert_never_overlapping(log)
    assert helper in spans and len(spans) == 2
    assert status_of(plan_json(project, env=FAST)["long"]["output_path"])["status"] == "SUCCESS"


def _dead_pid() -> int:
    gone = subprocess.Popen(["true"])
    gone.wait()
    return gone.pid


def _machine() -> tuple[str, str]:
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    return boot, os.readlink("/proc/self/ns/pid")


def test_a_forged_lease_naming_an_unrelated_group_and_cgroup_kills_nothing(project: Path) -> None:
    write_marinfile(project, 'from marinbuild import step\nstep("long", cmd="echo done > {output}/data")\n')
    out = Path(plan_json(project)["long"]["output_path"])
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    folder = ""
    try:
        parent = cgroup_folder() if _cgroups_usable() is None else None
        if parent is not None:
            # A cgroup of someone else's, holding the stranger: a lease may name any path.
            folder = os.path.join(parent, f"not-marinbuild-{os.getpid()}")
            os.mkdir(folder)
            Path(folder, "cgroup.procs").write_text(str(stranger.pid))
        boot, ns = _machine()
        now = time.time()
        forged = {
            "owner": {"host": socket.gethostname(), "pid": _dead_pid(), "started": "1", "nonce": "forged",
                      "machine": f"{boot}/{ns}"},
            "step": {"host": socket.gethostname(), "pid": stranger.pid, "pgid": stranger.pid,
                     "started": process_start(stranger.pid), "boot_id": boot, "pid_ns": ns, "cgroup": folder},
            "acquired": now, "renewed": now, "beat": 3, "expiry": 60.0,
        }
        (out / ".marinbuild").mkdir(parents=True)
        (out / ".marinbuild" / "lease").write_text(json.dumps(forged))

        result = marinbuild("run", cwd=project, env=FAST)
        assert result.returncode == 0, result.stdout + result.stderr
        assert (out / "data").read_text() == "done\n"  # the lease was taken over: its owner is gone
        assert not wait_dead(stranger.pid, 2), "the stranger named by a forged lease was killed"
        if folder:
            assert str(stranger.pid) in Path(folder, "cgroup.procs").read_text().split()
    finally:
        stranger.kill()
        stranger.wait()
        if folder:
            wait_until(lambda: not Path(folder, "cgroup.procs").read_text().split(), 10)
            os.rmdir(folder)
