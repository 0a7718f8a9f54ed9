"""The step's sentinel (marinbuild.backends.local.fence): real bash and sh processes, real pipes, real signals.

Every test runs against both sentinels: bash's (the one a run uses where bash 4 is on PATH)
and the portable one of /bin/sh and sleep (the one it falls back to elsewhere).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from marinbuild.backends.deadlines import Deadline
from marinbuild.backends.local.fence import FENCE_FD, NO_GATE, PORTABLE, Shell, fence_line, find_shell, write_line
from tests.helpers import missing_tool


@pytest.fixture(params=["bash", "sh"])
def shell(request: pytest.FixtureRequest) -> Shell:
    if request.param == "sh":
        return PORTABLE
    found = find_shell()
    if not found.bash:
        missing_tool("no bash 4 or later on PATH")
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _wait_dead(pid: int, seconds: float = 20) -> bool:
    end = time.monotonic() + seconds
    while _alive(pid) and time.monotonic() < end:
        time.sleep(0.02)
    return not _alive(pid)


def _ignores(pid: int, sig: int) -> bool:
    """Whether ``pid`` ignores ``sig`` now (its ``SigIgn`` mask in /proc)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(int(line.split()[1], 16) for line in f if line.startswith("SigIgn:"))
    except (OSError, StopIteration):
        return False
    return bool(mask >> (sig - 1) & 1)


class _Spawned:
    """A process started by ``posix_spawn`` with ``pipe`` on the fence's descriptor.

    No fork, so no library's at-fork handlers run in this worker: gRPC's, started here by an
    earlier test's ``gs://`` client, close and remake descriptors around a fork, which took a
    test's own pipe away now and then.
    """

    def __init__(self, path: str, argv: list[str], pipe: int, *, pgroup: int | None = None, setsid: bool = False,
                 env: dict[str, str] | None = None, stdout: int | None = None) -> None:
        os.set_inheritable(pipe, True)  # a dup2 onto itself (it may be the fence's number) keeps close-on-exec
        actions: list[tuple[int, ...] | tuple[int, int, str, int, int]] = [
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0), (os.POSIX_SPAWN_DUP2, pipe, FENCE_FD)]
        if stdout is not None:
            actions.append((os.POSIX_SPAWN_DUP2, stdout, 1))
        extra: dict[str, int] = {} if pgroup is None else {"setpgroup": pgroup}
        self.pid = os.posix_spawn(path, argv, os.environ if env is None else env, file_actions=actions,
                                  setsid=setsid, **extra)  # type: ignore[arg-type]
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float = 60) -> int:
        end = time.monotonic() + timeout
        while self.poll() is None:
            assert time.monotonic() < end, f"process {self.pid} still running after {timeout} s"
            time.sleep(0.01)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _group_with_sentinel(shell: Shell, first: str) -> tuple[subprocess.Popen[bytes], _Spawned, int]:
    """A ``sleep`` leading its own group, a sentinel in that group holding a pipe; the pipe's write end."""
    r, w = os.pipe()
    worker = subprocess.Popen(["sleep", "300"], process_group=0)  # no preexec_fn: vfork, no fork handlers
    sentinel = _Spawned(shell.path, shell.sentinel_argv(first, ""), r, pgroup=worker.pid)
    os.close(r)
    return worker, sentinel, w


def test_fence_lines_give_the_seconds_left_or_a_dash_for_no_deadline():
    assert fence_line(None) == b"-\n"
    assert fence_line(Deadline.never()) == b"-\n"
    assert fence_line(Deadline.within(0.0)) == b"0.000\n"
    assert 9.0 < float(fence_line(Deadline.within(10.0))) <= 10.0


def test_end_of_file_on_the_pipe_kills_the_whole_group(shell):
    worker, sentinel, w = _group_with_sentinel(shell, "-")
    try:
        time.sleep(0.2)
        assert _alive(worker.pid)
        os.close(w)  # the runner is gone
        assert _wait_dead(worker.pid), "the group outlived the end of its heartbeat pipe"
    finally:
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def test_no_renewal_before_the_deadline_kills_the_group_and_renewals_keep_it_alive(shell):
    # Each renewal's time is far above how late a renewal may come on a busy machine; the
    # last one is short, and nothing follows it.
    worker, sentinel, w = _group_with_sentinel(shell, "2")
    try:
        # Renewed for longer than the first deadline: still alive.
        started = time.monotonic()
        while time.monotonic() - started < 2.5:
            assert write_line(w, b"4\n")
            time.sleep(0.1)
        assert _alive(worker.pid), "killed although renewed"
        # Renewals stop (the runner is stopped) while the pipe stays open.
        assert write_line(w, b"0.3\n")
        assert _wait_dead(worker.pid), "the group outlived its deadline"
    finally:
        os.close(w)
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def test_the_sentinel_ignores_the_sigterm_a_step_sends_its_own_group(shell):
    worker, sentinel, w = _group_with_sentinel(shell, "-")
    try:
        # Sent once its trap is set (a shell's start-up may take a while on a busy machine).
        end = time.monotonic() + 20
        while not _ignores(sentinel.pid, signal.SIGTERM) and time.monotonic() < end:
            time.sleep(0.01)
        os.kill(sentinel.pid, signal.SIGTERM)
        time.sleep(0.3)
        assert sentinel.poll() is None
        os.close(w)
        assert _wait_dead(worker.pid)
    finally:
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def test_a_shell_step_exits_125_at_its_gate_when_the_pipe_ends_first(tmp_path, shell):
    r, w = os.pipe()
    os.close(w)
    marker = tmp_path / "ran"
    done = _Spawned(shell.path, shell.step_argv(f"touch {marker}", ""), r)
    os.close(r)
    assert done.wait() == NO_GATE
    assert not marker.exists()


def test_a_shell_step_ending_in_a_bare_wait_does_not_wait_for_its_sentinel(tmp_path, shell):
    r, w = os.pipe()
    write_line(w, b"-\n")
    out_r, out_w = os.pipe()
    proc = _Spawned(shell.path, shell.step_argv("sleep 0.1 & wait; echo done", ""), r, setsid=True, stdout=out_w)
    os.close(r)
    os.close(out_w)
    try:
        with os.fdopen(out_r, "rb") as out:  # end of file once the step, not its sentinel, is gone
            assert out.read() == b"done\n"
        assert proc.wait(30) == 0
    finally:
        os.close(w)  # the sentinel, alone in the group now, ends it


def test_a_lease_with_no_time_left_kills_the_group_at_once(shell):
    # bash reads `read -t 0` as "poll once"; a lease at zero must still run out.
    worker, sentinel, w = _group_with_sentinel(shell, "0.000")
    try:
        assert _wait_dead(worker.pid), "the group outlived a lease that had run out"
    finally:
        os.close(w)
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def _children(pid: int) -> list[str]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return f.read().split()


def test_bashs_sentinel_forks_nothing_to_time_the_lease_or_take_a_renewal():
    shell = find_shell()
    if not shell.bash:
        missing_tool("no bash 4 or later on PATH")
    worker, sentinel, w = _group_with_sentinel(shell, "30")
    try:
        for _ in range(20):
            assert write_line(w, b"30\n")
            time.sleep(0.02)
            assert _children(sentinel.pid) == []
        assert _alive(worker.pid) and sentinel.poll() is None
    finally:
        os.close(w)
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def test_bash_reads_no_start_up_file_before_the_gate(tmp_path):
    shell = find_shell()
    if not shell.bash:
        missing_tool("no bash 4 or later on PATH")
    early = tmp_path / "early"
    (tmp_path / "env.sh").write_text(f"touch {early}\n")
    r, w = os.pipe()
    os.close(w)
    done = _Spawned(shell.path, shell.step_argv("true", ""), r,
                    env={**os.environ, "BASH_ENV": str(tmp_path / "env.sh"), "ENV": str(tmp_path / "env.sh")})
    os.close(r)
    assert done.wait() == NO_GATE
    assert not early.exists(), "a start-up file ran before the step's gate"


def test_the_shell_is_bash_4_on_the_path_or_else_the_portable_one(tmp_path):
    assert find_shell(str(tmp_path)) == PORTABLE  # no bash here
    # Something named bash that is no bash 4 (here dash, or whatever /bin/sh is) is not trusted
    # with `read -t`, unless /bin/sh is bash 4 itself.
    os.symlink("/bin/sh", tmp_path / "bash")
    is_bash = subprocess.run(["/bin/sh", "-c", '[ "${BASH_VERSINFO-0}" -ge 4 ]']).returncode == 0
    assert find_shell(str(tmp_path)).bash == is_bash
    real = shutil.which("bash")
    if real is None:
        missing_tool("no bash on PATH")
    assert find_shell(os.path.dirname(real)) == Shell(os.path.abspath(real), bash=True)
