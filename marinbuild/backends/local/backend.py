"""Running steps on this machine: shell steps as subprocesses, function steps in forks.

A function step runs in a forked child of the driver: no new interpreter starts, the
loaded Marinfile is already there, and a crash in the step cannot take the driver down.
A shell step is started with ``posix_spawn`` (no copy of the driver's page tables), in a
session of its own. Every step leads its own process group, so cancelling it kills the
children it started. One thread reaps every step and runs their timers (:mod:`.reaper`).

No step runs unguarded. Each is started held at a gate (a pipe it reads before anything
else), handed to the runner's guardian process (:mod:`.guardian`) with its process group,
its token and its lease's deadline, and only then let through: a runner killed at any
instant leaves either a step that never ran (the gate reads end-of-file and it exits) or
one its guardian kills. When a step ends, whatever it left behind goes too: its process
group, and every process carrying its token (:mod:`.containment`), even one that left the
group.
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.deadlines import Deadline, deadlines
from marinbuild.backends.local.containment import TOKEN_VAR, kill_token, step_token
from marinbuild.backends.local.guardian import shared_guardian
from marinbuild.backends.local.reaper import Timer, shared_reaper

__all__ = ["LocalBackend"]

KILL_GRACE = 3.0
"""Seconds between SIGTERM and SIGKILL when a step is cancelled."""

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

# Python ignores these; an ignored signal stays ignored through exec, so reset them.
_DEFAULT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)


_GATE_FD = 9
"""The descriptor a shell step reads its go-ahead from (single digits are portable in sh)."""
_GATE = f"read -r marinbuild_gate <&{_GATE_FD} || exit 125; exec {_GATE_FD}<&-; unset marinbuild_gate\n"
"""A shell step's first line: wait until the runner has handed it to the guardian. End of
file means the runner died first: the step exits without running anything."""
_NO_GATE = 125

_gates: set[int] = set()  # write ends of open gates, closed in a forked step


def _die_with_parent() -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _shell_argv(command: str, workdir: str) -> list[str]:
    # posix_spawn cannot change directory in Python 3.11; the shell does it when needed.
    cwd = os.getcwd()
    if workdir != cwd and os.path.realpath(workdir) != cwd:
        command = f"cd -- {shlex.quote(workdir)} || exit 125\n{command}"
    return ["/bin/sh", "-c", _GATE + command]


class LocalBackend:
    """Start jobs as local processes, all reaped by one thread.

    Example::

        backend = LocalBackend()
        backend.start(job, on_done=lambda outcome: print(outcome.ok))
    """

    def __init__(self) -> None:
        self._environ = dict(os.environ)  # copied once: decoding it took 0.1 ms per step

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _LocalRun:
        run = _LocalRun(job, on_done, self._environ)
        run.launch()
        return run


class _LocalRun:
    """One running local job: its process group and its timers."""

    def __init__(self, job: Job, on_done: Callable[[Outcome], None], environ: dict[str, str]) -> None:
        self.job = job
        self.on_done = on_done
        self.environ = environ  # the runner's; a forked function step inherits it instead
        self.pid = 0
        self.started = 0.0
        self._reason: str | None = None
        self._timed_out = False
        self._finished = False
        self._lock = threading.Lock()
        self._timer: Timer | None = None
        self._err_r = -1
        self.token = step_token(job.output_path)
        self._since = 0.0
        self._deadline: Deadline | None = None
        self._lapsed = False
        self._unsubscribe: Callable[[], None] = lambda: None

    def launch(self) -> None:
        self.started = time.time()
        self._since = time.monotonic()
        os.makedirs(os.path.dirname(self.job.log_file), exist_ok=True)
        gate_r, gate_w = os.pipe()
        os.set_inheritable(gate_r, True)  # dup2 onto itself (it may be fd 9) would keep close-on-exec
        _gates.add(gate_w)
        try:
            try:
                if self.job.command is not None:
                    self._launch_command(gate_r)
                    # The shell waits at its gate: nothing it runs has inherited the mask yet.
                    _pin(self.pid, self.job.cores)
                else:
                    self._launch_function(gate_r)  # the forked child pins itself
            finally:
                os.close(gate_r)
            self._guard()
            reaper = shared_reaper()
            if self.job.timeout is not None:
                self._timer = reaper.call_later(self.job.timeout, self._on_timeout)
            reaper.watch(self.pid, self._exited)
            os.write(gate_w, b"go\n")  # only now: the guardian knows the step
        finally:
            _gates.discard(gate_w)
            os.close(gate_w)

    def _guard(self) -> None:
        # Listen before reading the latest, so that no renewal falls in between.
        guardian = shared_guardian()
        self._unsubscribe = deadlines.subscribe(self.job.output_path, self._extend)
        self._deadline = deadlines.latest(self.job.output_path)
        guardian.adopt(self.token, self.pid, self._deadline)

    def _extend(self, deadline: Deadline) -> None:
        previous = self._deadline
        if previous is not None and previous.remaining() <= 0:
            self._lapsed = True  # the guardian may have killed the step before this renewal
        self._deadline = deadline
        shared_guardian().extend(self.token, deadline)

    def _launch_command(self, gate: int) -> None:
        assert self.job.command is not None
        log = os.open(self.job.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        try:
            self.pid = os.posix_spawn(
                "/bin/sh",
                _shell_argv(self.job.command, self.job.workdir),
                {**self.environ, **self.job.env, TOKEN_VAR: self.token},
                file_actions=[
                    (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                    (os.POSIX_SPAWN_DUP2, log, 1),
                    (os.POSIX_SPAWN_DUP2, log, 2),
                    (os.POSIX_SPAWN_DUP2, gate, _GATE_FD),
                ],
                setsid=True,
                setsigdef=_DEFAULT_SIGNALS,
                setsigmask=(),
            )
        finally:
            os.close(log)

    def _launch_function(self, gate: int) -> None:
        err_r, err_w = os.pipe()
        log_fd = os.open(self.job.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the driver's buffered text again
        parent = os.getpid()
        # Ctrl-C or SIGTERM raised inside fork's own handlers would be swallowed there: hold
        # them until fork has returned (the child resets them before it lets them through).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                os.close(err_r)
                _child_main(self.job, log_fd, err_w, gate, parent, self.token, mask)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(err_w)
        os.close(log_fd)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
        except OSError:
            pass
        self._err_r = err_r
        self.pid = pid

    def _exited(self, status: int) -> None:
        code = os.waitstatus_to_exitcode(status)
        error_line = None
        if self._err_r >= 0:
            with os.fdopen(self._err_r, "rb") as f:
                raw = f.read()
            error_line = json.loads(raw)["error"] if raw else None
        with self._lock:
            self._finished = True
            reason, timed_out = self._reason, self._timed_out
        if self._timer is not None:
            self._timer.cancel()
        # Whatever the step left behind goes with it: its group, and what left the group.
        _killpg(self.pid, signal.SIGKILL)
        kill_token(self.token, since_pid=self.pid, since=self._since)
        self._unsubscribe()
        shared_guardian().release(self.token)
        deadline = self._deadline
        if reason is None and code == -signal.SIGKILL and (
            self._lapsed or (deadline is not None and deadline.remaining() <= 0)
        ):
            reason = ("killed by its guardian: this runner did not renew the step's lease in time "
                      "(was it suspended, or its store unreachable?)")
        ended = time.time()
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
            if self._finished or self._reason is not None:
                return
            self._timed_out = True
        self.cancel(f"timeout: exceeded its wall time of {self.job.timeout:g} s")

    def cancel(self, reason: str) -> None:
        """SIGTERM the step's process group, SIGKILL after a grace period."""
        with self._lock:
            if self._finished:
                return
            if self._reason is None:
                self._reason = reason
        _killpg(self.pid, signal.SIGTERM)
        shared_reaper().call_later(KILL_GRACE, self._kill_if_running)

    def _kill_if_running(self) -> None:
        with self._lock:
            if self._finished:
                return
        _killpg(self.pid, signal.SIGKILL)


def _pin(pid: int, cores: tuple[int, ...]) -> None:
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(pid, cores)
        except OSError:  # gone already, or cores outside this machine (--cores above it)
            pass


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


def _child_main(
    job: Job, log_fd: int, err_w: int, gate: int, parent: int, token: str, mask: set[int | signal.Signals]
) -> None:  # pragma: no cover - child process
    code = 1
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.setpgid(0, 0)
        _die_with_parent()
        shared_guardian().close_in_child()
        for fd in list(_gates):
            os.close(fd)  # other steps' gates: their end of file must not wait for this step
        _gates.clear()
        # The runner may have died before the death signal was set: then it never comes.
        if os.getppid() != parent or os.read(gate, 16) == b"":
            code = _NO_GATE
            return
        os.close(gate)
        os.environ[TOKEN_VAR] = token
        _pin(0, job.cores)
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
