"""A step never runs twice at once, whatever happens to its runner: real runners, real signals.

Each test is written from a reproduction of a way the promise broke. Steps append
``PID TIME`` lines to a log beside the project; the assertions are on those recorded
times and pids (two executions of one step never overlap), never on how long anything took.
"""

from __future__ import annotations

import fcntl
import itertools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .helpers import (
    alive,
    cli_env,
    marinbuild,
    missing_tool,
    plan_json,
    start_marinbuild,
    status_of,
    wait_dead,
    wait_for_text,
    write_marinfile,
)

REPO = Path(__file__).resolve().parent.parent

# Short leases: a takeover after 2 s unrenewed; the runner fences itself after 1.5 s and
# its guardian kills the step's processes after 1.75 s.
FAST = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "2", "MARINBUILD_LEASE_POLL": "0.2"}


def beats(log: Path, count: int | str, pause: float) -> str:
    """Shell lines appending ``PID TIME`` to ``log`` ``count`` times."""
    return f"i=0; while [ $i -lt {count} ]; do echo $$ $(date +%s.%N) >> {log}; sleep {pause}; i=$((i+1)); done"


def executions(log: Path) -> dict[int, tuple[float, float]]:
    """First and last recorded time of each pid in ``log``."""
    spans: dict[int, tuple[float, float]] = {}
    for line in log.read_text().splitlines():
        pid_text, t_text = line.split()
        pid, t = int(pid_text), float(t_text)
        first, last = spans.get(pid, (t, t))
        spans[pid] = (min(first, t), max(last, t))
    return spans


def assert_never_overlapping(log: Path) -> dict[int, tuple[float, float]]:
    spans = executions(log)
    ordered = sorted(spans.items(), key=lambda item: item[1][0])
    for (pid_a, (_, end_a)), (pid_b, (start_b, _)) in itertools.pairwise(ordered):
        assert end_a < start_b, f"pid {pid_a} still ran at {end_a} after pid {pid_b} started at {start_b}"
    return spans


def guardians_of(runner: int) -> list[int]:
    """The guardian processes whose parent is ``runner``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
            ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if b"marinbuild-guardian" in cmdline and ppid == runner and alive(int(name)):
            found.append(int(name))
    return found


def wait_until(predicate, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


# -- finding 1: the launch gap, and a zombie owner taken over while its step lives --------


def test_a_step_killing_its_runner_at_once_never_runs_beside_its_takeover(project):
    """Each of 20 steps SIGKILLs its runner as its first action; the next runner takes it over.

    The killed runner stays a zombie (nobody reaps it here) while the next one starts, so a
    takeover must also make sure the dead runner's step is gone. An attempt that survived
    its runner would beat for seconds, well past the start of the next runner's attempt.
    """
    logs = project / "logs"
    logs.mkdir()
    steps = "\n".join(
        f'step("s{i:02d}", cmd="n=3; if [ ! -e {logs}/killed{i} ]; then touch {logs}/killed{i}; n=100; '
        f'kill -KILL $PPID; fi; {beats(logs / f"s{i:02d}.log", "$n", 0.05)}")'
        for i in range(20)
    )
    write_marinfile(project, f"from marinbuild import step\n{steps}\n")
    runners = []
    for _ in range(21):  # each runner is killed by the step it starts; the 21st finishes
        runner = start_marinbuild("run", "-j", "1", cwd=project, env=FAST)
        runners.append(runner)
        # Not reaped: a killed runner stays a zombie while the next one starts.
        assert wait_until(lambda pid=runner.pid: not alive(pid), 120)
    for runner in runners:
        runner.communicate(timeout=60)
    assert [r.returncode for r in runners] == [-signal.SIGKILL] * 20 + [0], runners[-1].stderr.read()
    final = marinbuild("run", cwd=project, env=FAST)
    assert final.returncode == 0, final.stdout + final.stderr
    plan = plan_json(project, env=FAST)
    for i in range(20):
        assert status_of(plan[f"s{i:02d}"]["output_path"])["status"] == "SUCCESS"
        spans = assert_never_overlapping(logs / f"s{i:02d}.log")
        assert 1 <= len(spans) <= 2


def test_a_function_step_killing_its_runner_is_killed_with_it(project):
    log = project / "beats.log"
    write_marinfile(
        project,
        f"""
        import os, signal, time
        from marinbuild import step

        def work(cfg):
            if not os.path.exists("{project}/killed"):
                open("{project}/killed", "w").write("1")
                os.kill(os.getppid(), signal.SIGKILL)
            for _ in range(6):
                with open("{log}", "a") as f:
                    f.write(f"{{os.getpid()}} {{time.time()}}\\n")
                time.sleep(0.02)

        step("f", fn=work)
        """,
    )
    first = start_marinbuild("run", cwd=project, env=FAST)
    wait_for_text(project / "killed", 60)
    second = marinbuild("run", cwd=project, env=FAST)  # while the first may still be a zombie
    assert second.returncode == 0, second.stdout + second.stderr
    first.communicate(timeout=60)
    assert first.returncode == -signal.SIGKILL
    spans = assert_never_overlapping(log)
    assert len(spans) in (1, 2)


# -- finding 2: the heartbeat died on an unexpected error ------------------------------


def _runner_with_long_step(project: Path, log: Path, env: dict[str, str] = FAST) -> tuple[subprocess.Popen[str], str]:
    """A runner whose step beats for minutes the first time it runs, a moment afterwards."""
    write_marinfile(
        project,
        f"""
        from marinbuild import step
        step("long", cmd='echo $$ > {project}/step.pid; if [ -e {project}/ran ]; then n=5; else n=3000; fi; '
                         'touch {project}/ran; {beats(log, "$n", 0.05)}')
        """,
    )
    output = plan_json(project, env=env)["long"]["output_path"]
    runner = start_marinbuild("run", cwd=project, env=env)
    wait_for_text(log, 60)
    return runner, output


def test_a_lease_file_turned_to_invalid_utf8_stops_the_step_and_the_heartbeat_goes_on(project):
    log = project / "beats.log"
    runner, output = _runner_with_long_step(project, log)
    step_pid = int(wait_for_text(project / "step.pid"))
    folder = Path(output) / ".marinbuild"
    # Written under the step's lock, which a renewal holds from its comparison to its write: a
    # renewal in progress would otherwise put the runner's lease back over the edit.
    fd = os.open(folder / "lease.lock", os.O_RDWR)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        (folder / "lease").write_bytes(b"\xff\xfe not a lease \xc3\x28")
    finally:
        os.close(fd)
    # The renewal finds a lease that is not its own any more: the step is killed at once,
    # the heartbeat goes on, and the runner waits for whoever holds the step now. Nobody renews
    # the unreadable lease: after its expiry the runner takes its step up again and finishes.
    assert wait_dead(step_pid, 60)
    out, err = runner.communicate(timeout=120)
    assert runner.returncode == 0, out + err
    assert "lease lost" in out + err, out + err
    spans = assert_never_overlapping(log)
    assert step_pid in spans and len(spans) == 2
    assert status_of(output)["status"] == "SUCCESS"


def _mount_tmpfs(where: Path, size: str) -> bool:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2m"):
        missing_tool("cannot mount a tmpfs here (needs CAP_SYS_ADMIN)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def test_a_full_disk_stops_the_step_before_a_takeover_and_the_run_goes_on_once_it_frees(project, small_disk):
    log = project / "beats.log"
    env = {**FAST, "MARIN_PREFIX": str(small_disk)}
    runner, output = _runner_with_long_step(project, log, env)
    step_pid = int(wait_for_text(project / "step.pid"))
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
    # ENOSPC on every renewal: the heartbeat goes on failing, and the step is stopped.
    assert wait_dead(step_pid, 60)
    out, err = runner.communicate(timeout=60)
    filler.unlink()
    assert "could not be renewed" in out + err and "No space left on device" in out + err, out + err
    again = marinbuild("run", cwd=project, env=env)
    assert again.returncode == 0, again.stdout + again.stderr
    spans = assert_never_overlapping(log)
    assert step_pid in spans and len(spans) == 2
    assert status_of(output)["status"] == "SUCCESS"


# -- finding 6: a suspended runner -------------------------------------------------------


def test_a_stopped_runner_has_its_step_killed_before_another_runner_takes_it_over(project):
    log = project / "beats.log"
    runner, output = _runner_with_long_step(project, log)
    step_pid = int(wait_for_text(project / "step.pid"))
    runner.send_signal(signal.SIGSTOP)
    try:
        # Nothing in the stopped runner runs: its guardian kills the step at the deadline
        # set by the last renewal, before the lease can be taken over.
        assert wait_dead(step_pid, 30)
        assert Path(f"/proc/{runner.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        second = marinbuild("run", cwd=project, env=FAST)
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        runner.send_signal(signal.SIGCONT)
    runner.communicate(timeout=60)
    spans = assert_never_overlapping(log)
    assert len(spans) == 2
    assert status_of(output)["status"] == "SUCCESS"


# -- finding 9: leaks -------------------------------------------------------------------

SPAWN = """
import subprocess, sys
p = subprocess.Popen(["sleep", "300"], process_group=0)
open(sys.argv[1], "w").write(str(p.pid))
"""


def _escaping_marinfile(project: Path, then: str) -> None:
    (project / "spawn.py").write_text(SPAWN)
    write_marinfile(
        project,
        f"""
        import subprocess
        from marinbuild import step

        def fn_step(cfg):
            p = subprocess.Popen(["sleep", "300"], start_new_session=True)
            open("{project}/fn.pid", "w").write(str(p.pid))
            {"import time; time.sleep(300)" if then == "stay" else "pass"}

        step("sh", cmd="setsid sleep 300 & echo $! > {project}/setsid.pid; "
                       "python3 {project}/spawn.py {project}/pgroup.pid; {"sleep 300" if then == "stay" else "true"}")
        step("fn", fn=fn_step)
        """,
    )


def _escapees(project: Path) -> list[int]:
    return [int(wait_for_text(project / name)) for name in ("setsid.pid", "pgroup.pid", "fn.pid")]


def test_children_in_new_sessions_and_groups_die_when_their_step_ends(project):
    _escaping_marinfile(project, then="exit")
    result = marinbuild("run", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    for pid in _escapees(project):
        assert wait_dead(pid), f"pid {pid} outlived its step"


def test_children_in_new_sessions_and_groups_die_when_the_runner_is_killed(project):
    _escaping_marinfile(project, then="stay")
    runner = start_marinbuild("run", "-j", "2", cwd=project)
    pids = _escapees(project)
    assert all(alive(pid) for pid in pids)
    runner.send_signal(signal.SIGKILL)
    runner.wait(10)
    for pid in pids:
        assert wait_dead(pid, 10), f"pid {pid} outlived its runner"


def test_a_killed_guardian_is_replaced_and_still_kills_the_steps_when_the_runner_dies(project):
    write_marinfile(
        project,
        f"""
        from marinbuild import step
        step("a", cmd="setsid sleep 300 & echo $! > {project}/a.pid; echo $$ > {project}/a.sh; wait")
        step("b", cmd="echo $$ > {project}/b.sh; exec sleep 300")
        """,
    )
    runner = start_marinbuild("run", "-j", "2", cwd=project)
    pids = [int(wait_for_text(project / name)) for name in ("a.pid", "a.sh", "b.sh")]
    assert wait_until(lambda: len(guardians_of(runner.pid)) == 1)
    (first,) = guardians_of(runner.pid)
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: guardians_of(runner.pid) not in ([], [first]))
    # Its replacement knows both steps: the runner's death still takes them down.
    assert all(alive(pid) for pid in pids)
    runner.send_signal(signal.SIGKILL)
    runner.wait(10)
    for pid in pids:
        assert wait_dead(pid, 10), f"pid {pid} outlived its runner after the guardian was replaced"


# -- TPU slices over SSH: a driver that stops renewing has its hosts' commands killed ----


def _tpu_driver(cluster: Path, out: Path, command: str) -> str:
    """A driver process running one TPU step under a lease deadline it renews, as the claims do.

    Each deadline is 1.5 s away; a renewal comes every 0.3 s until the driver is stopped.
    """
    return textwrap.dedent(f"""
        import threading, time
        from marinbuild.backends.deadlines import Deadline, deadlines
        from marinbuild.backends.tpu.cluster import load_cluster
        from marinbuild.backends.tpu.attempts import TpuJob, run_tpu_step
        out = {str(out)!r}
        deadlines.publish(out, Deadline.within(1.5))
        def renew():
            while True:
                time.sleep(0.3)
                deadlines.publish(out, Deadline.within(1.5))
        threading.Thread(target=renew, daemon=True).start()
        job = TpuJob(name="step", output_path=out, slices=("pair",), command={command!r})
        result = run_tpu_step(job, load_cluster({str(cluster)!r}), workdir=None, cancel=threading.Event(),
                              console=print)
        print("STATUS", result.status)
    """)


def test_a_stopped_tpu_driver_has_its_hosts_commands_killed_by_the_lease_deadline(fleet, tmp_path):
    from tests.fixtures_ssh import live_processes_matching, wait_for

    cluster = fleet.write_cluster(tmp_path / "cluster.toml", [("pair", "v4-16", [0, 1])])
    out = tmp_path / "out"
    out.mkdir()
    command = 'touch "$MARINBUILD_OUTPUT/started_$FAKE_HOST_ID"; exec sleep 3043'
    proc = subprocess.Popen([sys.executable, "-c", _tpu_driver(cluster, out, command)], cwd=REPO)
    try:
        wait_for(lambda: len(live_processes_matching("sleep 3043")) == 2, timeout=60)
        proc.send_signal(signal.SIGSTOP)
        # The driver runs nothing, and its connections stay open: the hosts act on their own.
        wait_for(lambda: live_processes_matching("sleep 3043") == [], timeout=30)
        assert Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()


def test_a_tpu_step_whose_lease_is_renewed_runs_past_the_first_deadline(fleet, tmp_path):
    cluster = fleet.write_cluster(tmp_path / "cluster.toml", [("pair", "v4-16", [0, 1])])
    out = tmp_path / "out"
    out.mkdir()
    # Each renewal covers 1.5 s; the command needs three times that.
    command = 'sleep 4.5; touch "$MARINBUILD_OUTPUT/done_$FAKE_HOST_ID"'
    done = subprocess.run([sys.executable, "-c", _tpu_driver(cluster, out, command)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert "STATUS SUCCESS" in done.stdout, done.stdout + done.stderr
    assert sorted(p.name for p in out.glob("done_*")) == ["done_0", "done_1"]


def test_a_runner_resumed_after_its_step_was_killed_says_why(project):
    log = project / "beats.log"
    runner, output = _runner_with_long_step(project, log)
    step_pid = int(wait_for_text(project / "step.pid"))
    runner.send_signal(signal.SIGSTOP)
    try:
        assert wait_dead(step_pid, 30)
    finally:
        runner.send_signal(signal.SIGCONT)
    out, err = runner.communicate(timeout=60)
    text = out + err
    # The resumed runner meets two true answers, in either order: the step's exit (killed by its
    # guardian, recorded FAILED) and its lapsed lease (nothing recorded; with no other runner
    # about, it takes the step up again and runs it afresh). Either way it says why, and the
    # killed attempt never counts as done.
    if "killed by its guardian: this runner did not renew the step's lease in time" in text:
        assert status_of(output)["status"] != "SUCCESS"
    else:
        assert "lost its lease" in text, text
        spans = assert_never_overlapping(log)
        assert step_pid in spans and len(spans) == 2
        assert text.count("start long") == 2


# -- finding 10: the runner and its guardian die or stop together ------------------------
#
# The guardian was the only fence: with it gone too, a step that dropped its environment
# (so no token scan finds it) ran on beside its takeover. Each step now carries a sentinel
# in its own process group; these kill or stop the runner and its guardian at once and
# check that the step's processes die before anyone else could have killed them.

ENV_DROPPING_FN = """
import os, subprocess
from marinbuild import step

def work(cfg):
    n = 5 if os.path.exists("{project}/ran") else 3000
    open("{project}/ran", "w").close()
    # A clean environment, as a step calling a tool often gives it: no token survives.
    subprocess.run(["/bin/sh", "-c", 'echo $$ > {project}/step.pid; {beats}'], env={{"PATH": "/usr/bin:/bin", "N": str(n)}})

step("long", fn=work)
"""


def _env_dropping_step(project: Path, log: Path, kind: str) -> None:
    """A step that beats for minutes the first time it runs from a process with an empty environment."""
    if kind == "sh":
        inner = f"echo $$ > {project}/step.pid; {beats(log, '$N', 0.05)}"
        write_marinfile(project, f"""
            from marinbuild import step
            step("long", cmd='''if [ -e {project}/ran ]; then n=5; else n=3000; fi; touch {project}/ran
            exec env -i N=$n /bin/sh -c '{inner}'
            ''')
            """)
    else:
        write_marinfile(project, ENV_DROPPING_FN.format(project=project, beats=beats(log, "$N", 0.05)))


def _dropped_its_token(pid: int) -> bool:
    return b"MARINBUILD_STEP_TOKEN" not in Path(f"/proc/{pid}/environ").read_bytes()


def _runner_and_guardian(project: Path, log: Path) -> tuple[subprocess.Popen[str], int, int]:
    runner = start_marinbuild("run", cwd=project, env=FAST)
    wait_for_text(log, 60)
    step_pid = int(wait_for_text(project / "step.pid"))
    assert wait_until(lambda: len(guardians_of(runner.pid)) == 1)
    (guardian,) = guardians_of(runner.pid)
    assert _dropped_its_token(step_pid)
    return runner, guardian, step_pid


@pytest.mark.parametrize("kind", ["sh", "fn"])
def test_a_step_without_its_environment_dies_when_its_runner_and_guardian_are_killed_together(project, kind):
    log = project / "beats.log"
    _env_dropping_step(project, log, kind)
    runner, guardian, step_pid = _runner_and_guardian(project, log)
    _signal_together((runner.pid, guardian), signal.SIGKILL)  # as `pkill -9 -f marinbuild` does
    runner.communicate(timeout=30)
    # Nothing of the runner is left to kill it, and its token is gone: its sentinel does.
    assert wait_dead(step_pid, 30), f"step pid {step_pid} outlived its runner and guardian"
    second = marinbuild("run", cwd=project, env=FAST)
    assert second.returncode == 0, second.stdout + second.stderr
    spans = assert_never_overlapping(log)
    assert step_pid in spans and len(spans) == 2
    assert status_of(plan_json(project, env=FAST)["long"]["output_path"])["status"] == "SUCCESS"


@pytest.mark.parametrize("kind", ["sh", "fn"])
def test_a_step_without_its_environment_dies_when_its_runner_and_guardian_are_stopped_together(project, kind):
    log = project / "beats.log"
    _env_dropping_step(project, log, kind)
    runner, guardian, step_pid = _runner_and_guardian(project, log)
    _signal_together((runner.pid, guardian), signal.SIGSTOP)  # a laptop lid, `pkill -STOP -f marinbuild`
    try:
        # Nobody renews the lease and nothing outside the step runs: the sentinel's timer,
        # set by the last renewal, kills the step before the lease can be taken over.
        assert wait_dead(step_pid, 30), f"step pid {step_pid} outlived its stopped runner's lease"
        second = marinbuild("run", cwd=project, env=FAST)
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        _signal_together((guardian, runner.pid), signal.SIGCONT)
    runner.communicate(timeout=60)
    spans = assert_never_overlapping(log)
    assert step_pid in spans and len(spans) == 2
    assert status_of(plan_json(project, env=FAST)["long"]["output_path"])["status"] == "SUCCESS"


def _unshare_refused() -> str | None:
    try:
        done = subprocess.run(["unshare", "-p", "-f", "--mount-proc", "true"], capture_output=True, text=True,
                              timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unshare cannot run here: {e}"
    return None if done.returncode == 0 else f"unshare -p -f --mount-proc refused: {done.stderr.strip()}"


def _in_namespace_of(pid: int) -> list[int]:
    """The processes in the pid namespace of ``pid`` (seen from this one)."""
    target = os.readlink(f"/proc/{pid}/ns/pid")
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                if os.readlink(f"/proc/{name}/ns/pid") == target:
                    found.append(int(name))
            except OSError:
                continue
    return found


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_runner_in_another_pid_namespace_is_waited_out_and_its_step_fenced_itself(project, sig):
    """Another pid namespace stands in for another machine sharing the prefix: its pids mean nothing here."""
    why = _unshare_refused()
    if why is not None:
        missing_tool(why)
    log = project / "beats.log"
    write_marinfile(project, f"""
        from marinbuild import step
        step("long", cmd='if [ -e {project}/ran ]; then n=5; else n=3000; fi; touch {project}/ran; '
                         '{beats(log, "$n", 0.05)}')
        """)
    # A shell as the namespace's init, so that killing the runner does not end the namespace.
    outer = subprocess.Popen(
        ["unshare", "-p", "-f", "--mount-proc", "/bin/sh", "-c", '"$@"; sleep 300', "ns-init",
         sys.executable, "-m", "marinbuild", "run"],
        cwd=project, env=cli_env(FAST), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_text(log, 60)
        assert wait_until(lambda: any(len(_in_namespace_of(p)) > 1 for p in _children_of(outer.pid)))
        (init,) = _children_of(outer.pid)
        members = _in_namespace_of(init)
        runner = next(p for p in members if _cmdline(p).split(b"\0")[1:4] == [b"-m", b"marinbuild", b"run"])
        assert wait_until(lambda: any(b"marinbuild-guardian" in _cmdline(p) for p in _in_namespace_of(init)))
        guardian = next(p for p in _in_namespace_of(init) if b"marinbuild-guardian" in _cmdline(p))
        assert os.readlink(f"/proc/{runner}/ns/pid") != os.readlink("/proc/self/ns/pid")
        _signal_together((runner, guardian), sig)
        # This runner cannot see the other's processes: it waits the lease out, and takes over.
        second = marinbuild("run", cwd=project, env=FAST)
        assert second.returncode == 0, second.stdout + second.stderr
        assert "took over" in second.stdout + second.stderr or "not renewed" in second.stdout + second.stderr
    finally:
        os.killpg(outer.pid, signal.SIGKILL)  # its own session: the namespace's init and everything in it
        outer.wait(30)
    spans = assert_never_overlapping(log)
    assert len(spans) == 2
    assert status_of(plan_json(project, env=FAST)["long"]["output_path"])["status"] == "SUCCESS"


def _signal_together(pids: tuple[int, ...], sig: int) -> None:
    """Signal each pid in turn; one already gone is fine: a guardian ends by itself the moment its
    runner is SIGKILLed (its pipe closes), which is what the signal would have done to it."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _children_of(pid: int) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                ppid = int(Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            if ppid == pid:
                found.append(int(name))
    return found
