"""Running steps on this machine: shell steps as subprocesses, function steps in forks.

A function step runs in a forked child of the driver: no new interpreter starts, the
loaded Marinfile is already there, and a crash in the step cannot take the driver down.
Every step runs in its own process group, so cancelling it kills the children it started,
and asks the kernel to kill it if the driver dies (``PR_SET_PDEATHSIG``), so no step
outlives the runner that holds its lease.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

from .backend import Job, Outcome

__all__ = ["LocalBackend"]

KILL_GRACE = 3.0
"""Seconds between SIGTERM and SIGKILL when a step is cancelled."""

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def _die_with_parent() -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# A Python preexec_fn forces a full fork() of the driver, whose page tables grow with the
# plan (14 ms per spawn measured with a large plan); util-linux's setpriv sets the same
# death signal and lets subprocess use vfork (about 3.5 ms).
_SETPRIV = shutil.which("setpriv")


def _shell_argv(command: str) -> list[str]:
    argv = ["/bin/sh", "-c", command]
    return [_SETPRIV, "--pdeathsig", "KILL", *argv] if _SETPRIV else argv


class LocalBackend:
    """Start jobs as local processes; each job is watched by one small thread."""

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _LocalRun:
        run = _LocalRun(job, on_done)
        run.launch()
        return run


class _LocalRun:
    """One running local job: its process group, timer and waiter thread."""

    def __init__(self, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.job = job
        self.on_done = on_done
        self.pid = 0
        self.started = 0.0
        self._reason: str | None = None
        self._timed_out = False
        self._lock = threading.Lock()
        self._finished = threading.Event()
        self._err_r = -1

    def launch(self) -> None:
        self.started = time.time()
        os.makedirs(os.path.dirname(self.job.log_file), exist_ok=True)
        if self.job.command is not None:
            self._launch_command()
        else:
            self._launch_function()
        if self.job.cores and hasattr(os, "sched_setaffinity"):
            try:
                os.sched_setaffinity(self.pid, self.job.cores)
            except (ProcessLookupError, OSError):
                pass
        threading.Thread(target=self._wait, name=f"wait-{self.job.name}", daemon=True).start()
        if self.job.timeout is not None:
            timer = threading.Timer(self.job.timeout, self._on_timeout)
            timer.daemon = True
            timer.start()

    def _environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.job.env)
        return env

    def _launch_command(self) -> None:
        assert self.job.command is not None
        with open(self.job.log_file, "ab") as log:
            proc = subprocess.Popen(
                _shell_argv(self.job.command),
                cwd=self.job.workdir,
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=None if _SETPRIV else _die_with_parent,
            )
        self._proc: subprocess.Popen[bytes] | None = proc
        self.pid = proc.pid

    def _launch_function(self) -> None:
        self._proc = None
        err_r, err_w = os.pipe()
        log_fd = os.open(self.job.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the driver's buffered text again
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child
            os.close(err_r)
            _child_main(self.job, log_fd, err_w)
        os.close(err_w)
        os.close(log_fd)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
        except OSError:
            pass
        self._err_r = err_r
        self.pid = pid

    def _wait(self) -> None:
        if self._proc is not None:
            code = self._proc.wait()
            error_line = None
        else:
            _, status = os.waitpid(self.pid, 0)
            code = os.waitstatus_to_exitcode(status)
            with os.fdopen(self._err_r, "rb") as f:
                raw = f.read()
            error_line = json.loads(raw)["error"] if raw else None
        self._finished.set()
        # Whatever the step left behind in its group goes with it.
        _killpg(self.pid, signal.SIGKILL)
        ended = time.time()
        with self._lock:
            reason, timed_out = self._reason, self._timed_out
        if code == 0 and reason is None:
            outcome = Outcome(ok=True, started=self.started, ended=ended, returncode=0)
        else:
            error = reason or error_line or _describe_exit(code)
            outcome = Outcome(
                ok=False,
                started=self.started,
                ended=ended,
                error=error,
                returncode=code,
                timed_out=timed_out,
                cancelled=reason is not None and not timed_out,
            )
        self.on_done(outcome)

    def _on_timeout(self) -> None:
        with self._lock:
            if self._finished.is_set() or self._reason is not None:
                return
            self._timed_out = True
        self.cancel(f"timeout: exceeded its wall time of {self.job.timeout:g} s")

    def cancel(self, reason: str) -> None:
        """SIGTERM the step's process group, SIGKILL after a grace period."""
        with self._lock:
            if self._finished.is_set():
                return
            if self._reason is None:
                self._reason = reason
        _killpg(self.pid, signal.SIGTERM)
        threading.Thread(target=self._kill_later, daemon=True).start()

    def _kill_later(self) -> None:
        if not self._finished.wait(KILL_GRACE):
            _killpg(self.pid, signal.SIGKILL)


def _killpg(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def _child_main(job: Job, log_fd: int, err_w: int) -> None:  # pragma: no cover - child process
    code = 1
    try:
        os.setpgid(0, 0)
        _die_with_parent()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # The driver's sys.stdout may be a terminal UI's proxy; the step writes to its log.
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.chdir(job.workdir)
        os.environ.update(job.env)
        try:
            assert job.fn is not None
            job.fn(job.config)
            code = 0
        except BaseException as e:  # everything the step raises is its failure
            traceback.print_exc()
            last = f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__
            os.write(err_w, json.dumps({"error": last}).encode())
        finally:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except Exception:
                    pass
    finally:
        os._exit(code)
