"""The step's sentinel (marinbuild.backends.local.fence): real sh processes, real pipes, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from marinbuild.backends.deadlines import Deadline
from marinbuild.backends.local.fence import FENCE_FD, NO_GATE, fence_line, gated_shell, sentinel_argv, write_line


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


def _group_with_sentinel(first: str) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], int]:
    """A ``sleep`` leading its own group, a sentinel in that group holding a pipe; the pipe's write end."""
    r, w = os.pipe()
    worker = subprocess.Popen(["sleep", "300"], process_group=0)
    sentinel = subprocess.Popen(
        sentinel_argv(first, ""), pass_fds=(FENCE_FD,),
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


def test_end_of_file_on_the_pipe_kills_the_whole_group():
    worker, sentinel, w = _group_with_sentinel("-")
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


def test_no_renewal_before_the_deadline_kills_the_group_and_renewals_keep_it_alive():
    worker, sentinel, w = _group_with_sentinel("0.6")
    try:
        # Renewed for longer than the first deadline: still alive.
        started = time.monotonic()
        while time.monotonic() - started < 1.5:
            assert write_line(w, b"0.6\n")
            time.sleep(0.1)
        assert _alive(worker.pid), "killed although renewed"
        # Renewals stop (the runner is stopped) while the pipe stays open.
        assert _wait_dead(worker.pid), "the group outlived its deadline"
    finally:
        os.close(w)
        worker.kill()
        sentinel.kill()
        worker.wait()
        sentinel.wait()


def test_the_sentinel_ignores_the_sigterm_a_step_sends_its_own_group():
    worker, sentinel, w = _group_with_sentinel("-")
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


def test_a_shell_step_exits_125_at_its_gate_when_the_pipe_ends_first(tmp_path):
    r, w = os.pipe()
    os.close(w)
    marker = tmp_path / "ran"
    done = subprocess.run(["/bin/sh", "-c", gated_shell(f"touch {marker}", "")],
                          pass_fds=(FENCE_FD,), preexec_fn=lambda: os.dup2(r, FENCE_FD), timeout=30)
    os.close(r)
    assert done.returncode == NO_GATE
    assert not marker.exists()


def test_a_shell_step_ending_in_a_bare_wait_does_not_wait_for_its_sentinel(tmp_path):
    r, w = os.pipe()
    write_line(w, b"-\n")
    proc = subprocess.Popen(["/bin/sh", "-c", gated_shell("sleep 0.1 & wait; echo done", "")], stdout=subprocess.PIPE,
                            pass_fds=(FENCE_FD,), preexec_fn=lambda: os.dup2(r, FENCE_FD), start_new_session=True)
    os.close(r)
    try:
        out, _ = proc.communicate(timeout=30)
        assert out == b"done\n" and proc.returncode == 0
    finally:
        os.close(w)  # the sentinel, alone in the group now, ends it
