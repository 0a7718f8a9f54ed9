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


def _group_with_sentinel(shell: Shell, first: str) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], int]:
    """A ``sleep`` leading its own group, a sentinel in that group holding a pipe; the pipe's write end."""
    r, w = os.pipe()
    worker = subprocess.Popen(["sleep", "300"], process_group=0)
    sentinel = subprocess.Popen(
        shell.sentinel_argv(first, ""), executable=shell.path, pass_fds=(FENCE_FD,),
        preexec_fn=lambda: (os.setpgid(0, worker.pid), os.dup2(r, FENCE_FD)),
        stdin=subprocess.DEVNULL, close_fds=True,
    )
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
        time.sleep(0.3)
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
    done = subprocess.run(shell.step_argv(f"touch {marker}", ""), executable=shell.path,
                          pass_fds=(FENCE_FD,), preexec_fn=lambda: os.dup2(r, FENCE_FD), timeout=30)
    os.close(r)
    assert done.returncode == NO_GATE
    assert not marker.exists()


def test_a_shell_step_ending_in_a_bare_wait_does_not_wait_for_its_sentinel(tmp_path, shell):
    r, w = os.pipe()
    write_line(w, b"-\n")
    proc = subprocess.Popen(shell.step_argv("sleep 0.1 & wait; echo done", ""), executable=shell.path,
                            stdout=subprocess.PIPE,
                            pass_fds=(FENCE_FD,), preexec_fn=lambda: os.dup2(r, FENCE_FD), start_new_session=True)
    os.close(r)
    try:
        out, _ = proc.communicate(timeout=30)
        assert out == b"done\n" and proc.returncode == 0
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
    done = subprocess.run(shell.step_argv("true", ""), executable=shell.path, pass_fds=(FENCE_FD,),
                          env={**os.environ, "BASH_ENV": str(tmp_path / "env.sh"), "ENV": str(tmp_path / "env.sh")},
                          preexec_fn=lambda: os.dup2(r, FENCE_FD), timeout=30)
    os.close(r)
    assert done.returncode == NO_GATE
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
