"""Running steps on this machine: shell steps as subprocesses, function steps in forks.

A function step runs in a forked child of the driver: no new interpreter starts, the
loaded Marinfile is already there, and a crash in the step cannot take the driver down.
A shell step is started with ``posix_spawn`` (no copy of the driver's page tables), in a
session of its own. Every step leads its own process group, so cancelling it kills the
children it started. One thread reaps every step and runs their timers (:mod:`.reaper`).

No step runs unguarded. Each is started held at a gate (the first line of its heartbeat
pipe, read before anything else), moved into a cgroup of its own where there are cgroups
(:mod:`.cgroups`), written into its lease (its first process, group and cgroup, for a
runner taking it over), handed to the runner's guardian process (:mod:`.guardian`) with its
process group, its token and its lease's deadline, and only then let through: a runner
killed at any instant leaves either a step that never ran (the gate reads end-of-file and
it exits) or one that is killed. Once through, the step's first process starts the step's
own sentinel (:mod:`.fence`), which keeps the pipe and kills the group when the runner dies
or stops renewing, even with the guardian gone too. When a step ends, whatever it left
behind goes too: its cgroup, or its process group and every process carrying its token
(:mod:`.containment`), even one that left the group.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import shlex
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping

from marinbuild.backends.base import BackendHooks, Job, Outcome, wall_time_exceeded
from marinbuild.backends.deadlines import Deadline, deadlines
from marinbuild.backends.held_signals import HeldSignals, reset_in_child
from marinbuild.backends.local.cgroups import StepCgroups, shared_cgroups
from marinbuild.backends.local.containment import TOKEN_VAR, kill_token, step_token
from marinbuild.backends.local.fence import FENCE_FD, NO_GATE, Shell, fence_line, find_shell, write_line
from marinbuild.backends.local.guardian import shared_guardian
from marinbuild.backends.local.reaper import Timer, shared_reaper
from marinbuild.backends.local.spawn import Environment, spawn
from marinbuild.store.errors import UserError
from marinbuild.store.lease_owner import StepProcess
from marinbuild.store.step_logs import open_log

__all__ = ["KILL_GRACE", "KILL_GRACE_ENV", "LocalBackend", "kill_grace"]

KILL_GRACE = 3.0
"""Seconds between SIGTERM and SIGKILL when a step is cancelled, unless ``$MARINBUILD_KILL_GRACE`` says otherwise."""
KILL_GRACE_ENV = "MARINBUILD_KILL_GRACE"
_KILL_GRACE_MAX = 3600.0

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None

# Python ignores these; an ignored signal stays ignored through exec, so reset them.
_DEFAULT_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGPIPE", "SIGXFSZ", "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")
    if hasattr(signal, name)
)


_fences: set[int] = set()
"""Write ends of the running steps' heartbeat pipes, closed in a forked step: a step's
sentinel must see end-of-file when the runner exits, not when the last step forked holding
a copy does."""
_fork_lock = threading.Lock()  # a pipe is made and listed before any fork may copy it


def kill_grace(env: Mapping[str, str] | None = None) -> float:
    """Seconds a cancelled step gets between its SIGTERM and the SIGKILL: ``$MARINBUILD_KILL_GRACE`` or 3.

    A training step that saves a checkpoint on SIGTERM needs longer than 3 s; 0 kills at once.

    >>> kill_grace({"MARINBUILD_KILL_GRACE": "30"})
    30.0
    """
    text = (os.environ if env is None else env).get(KILL_GRACE_ENV, "").strip()
    if not text:
        return KILL_GRACE
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value <= _KILL_GRACE_MAX:  # NaN fails every comparison
        raise UserError(f"{KILL_GRACE_ENV}={text!r} must be seconds from 0 to {_KILL_GRACE_MAX:g}")
    return value


def _die_with_parent() -> None:
    if _libc is not None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _shell_argv(shell: Shell, command: str, workdir: str, cgroup: str) -> list[str]:
    # posix_spawn cannot change directory in Python 3.11; the shell does it when needed.
    cwd = os.getcwd()
    if workdir != cwd and os.path.realpath(workdir) != cwd:
        command = f"cd -- {shlex.quote(workdir)} || exit 125\n{command}"
    return shell.step_argv(command, cgroup)


class LocalBackend(BackendHooks):
    """Start jobs as local processes, all reaped by one thread.

    Example::

        backend = LocalBackend()
        backend.start(job, on_done=lambda outcome: print(outcome.ok))
    """

    def __init__(self, shell: Shell | None = None) -> None:
        """``shell``: what shell steps and sentinels run under (:mod:`.fence`); by default bash 4
        where it is on ``PATH``, else ``/bin/sh`` (:data:`.fence.PORTABLE` forces the latter),
        decided at the first step. The kill grace is read here, so a bad value stops the run before any step."""
        self._environ = Environment(os.environ)  # encoded once: it took 0.1 ms per step
        self._shell = shell
        self._grace = kill_grace()

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _LocalRun:
        if self._shell is None:
            self._shell = find_shell()
        run = _LocalRun(job, on_done, self._environ, self._shell, self._grace)
        run.launch()
        return run


class _LocalRun:
    """One running local job: its process group and its timers."""

    def __init__(
        self, job: Job, on_done: Callable[[Outcome], None], environ: Environment, shell: Shell, grace: float
    ) -> None:
        self.job = job
        self.grace = grace
        self.shell = shell
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
        self._fence = -1  # the write end of the step's heartbeat pipe, open while it runs
        self._cgroup = ""

    def launch(self) -> None:
        self.started = time.time()
        self._since = time.monotonic()
        cgroups = shared_cgroups()
        self._cgroup = cgroups.take()
        with _fork_lock:
            fence_r, fence_w = os.pipe()
            _fences.add(fence_w)
        os.set_inheritable(fence_r, True)  # dup2 onto itself (it may be fd 9) would keep close-on-exec
        os.set_blocking(fence_w, False)  # a stopped sentinel must never block a renewal
        launched = False
        try:
            try:
                if self.job.command is not None:
                    self._launch_command(fence_r)
                    # The shell waits at its gate: nothing it runs has inherited the mask yet.
                    _pin(self.pid, self.job.cores)
                else:
                    self._launch_function(fence_r)  # the forked child pins itself
            finally:
                os.close(fence_r)
            if self._cgroup and not cgroups.enter(self._cgroup, self.pid):
                self._cgroup = ""  # not reused: the step's sentinel names it
            # Written into the lease before the gate opens, for a runner taking the step over
            # here: from its first instant the step's cgroup and group can be found.
            deadlines.started(self.job.output_path, StepProcess.of(self.pid, self.pid, self._cgroup))
            self._guard()
            reaper = shared_reaper()
            if self.job.timeout is not None:
                self._timer = reaper.call_later(self.job.timeout, self._on_timeout)
            with self._lock:
                self._fence = fence_w
            launched = True
            reaper.watch(self.pid, self._exited)
            # Only now may it run (the guardian knows the step): the gate line is the
            # deadline its sentinel starts with.
            write_line(fence_w, fence_line(self._deadline))
        finally:
            if not launched:
                _fences.discard(fence_w)
                os.close(fence_w)  # a step at its gate reads end-of-file and exits unrun
                self._abandon(cgroups)

    def _abandon(self, cgroups: StepCgroups) -> None:
        """A step that never passed its gate: kill and reap it, forget it everywhere."""
        deadlines.started(self.job.output_path, None)
        self._unsubscribe()
        self._unsubscribe = _nothing
        if self.pid > 0:
            _killpg(self.pid, signal.SIGKILL)
            shared_guardian().release(self.token)
            shared_reaper().watch(self.pid, _ignore_status)
        if self._cgroup:
            cgroups.kill(self._cgroup)
            cgroups.give_back(self._cgroup)
        if self._err_r >= 0:
            os.close(self._err_r)
            self._err_r = -1

    def _guard(self) -> None:
        # Listen before reading the latest, so that no renewal falls in between.
        guardian = shared_guardian()
        self._unsubscribe = deadlines.subscribe(self.job.output_path, self._extend)
        self._deadline = deadlines.latest(self.job.output_path)
        guardian.adopt(self.token, self.pid, self._deadline, self._cgroup)

    def _extend(self, deadline: Deadline) -> None:
        previous = self._deadline
        if previous is not None and previous.remaining() <= 0:
            self._lapsed = True  # the guardian may have killed the step before this renewal
        self._deadline = deadline
        shared_guardian().extend(self.token, deadline)
        with self._lock:
            if self._fence >= 0:
                write_line(self._fence, fence_line(deadline))

    def _launch_command(self, gate: int) -> None:
        assert self.job.command is not None
        log = open_log(self.job.log_file)
        try:
            self.pid = spawn(
                self.shell.path,
                _shell_argv(self.shell, self.job.command, self.job.workdir, self._cgroup),
                self.environ,
                {**self.job.env, TOKEN_VAR: self.token},
                opens=[(0, os.devnull, os.O_RDONLY)],
                dup2s=[(log, 1), (log, 2), (gate, FENCE_FD)],
                setsid=True,
                default_signals=_DEFAULT_SIGNALS,
            )
        finally:
            os.close(log)

    def _launch_function(self, gate: int) -> None:
        err_r, err_w = os.pipe()
        log_fd = open_log(self.job.log_file, 0)
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # or the child would write the driver's buffered text again
        parent = os.getpid()
        # Ctrl-C or SIGTERM raised inside fork's own handlers would be swallowed there: hold
        # them until fork has returned (the child resets them before it lets them through).
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        # Another thread may still take the signal for the process, and its handler then runs
        # on this one at the next chance: inside the handlers fork runs (logging's lock
        # release), which swallow its exception. Meanwhile it is only noted, and raised after.
        held = HeldSignals()
        held.install()
        held.hold()
        try:
            with _fork_lock:
                pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child
                os.close(err_r)
                _child_main(self.job, log_fd, err_w, gate, parent, self.token, mask, self._cgroup, self.shell)
        finally:
            held.uninstall()
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(err_w)
        os.close(log_fd)
        try:
            os.setpgid(pid, pid)  # also done by the child; whichever runs first wins the race
        except OSError:
            pass
        self._err_r = err_r
        self.pid = pid
        held.release()  # a Ctrl-C or SIGTERM noted during the fork, now that the step is known

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
        # Whatever the step left behind goes with it: its group (its sentinel too), and what
        # left the group: the whole cgroup where there is one, else every holder of its token.
        _killpg(self.pid, signal.SIGKILL)
        cgroups = shared_cgroups()
        if not (self._cgroup and cgroups.kill(self._cgroup)):
            kill_token(self.token, since_pid=self.pid, since=self._since)
        self._unsubscribe()
        self._unsubscribe = _nothing  # it refers back to this run: a cycle left for the collector
        deadlines.started(self.job.output_path, None)
        with self._lock:
            fence, self._fence = self._fence, -1
        if fence >= 0:
            _fences.discard(fence)
            os.close(fence)
        shared_guardian().release(self.token)
        cgroups.give_back(self._cgroup)
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
        on_done, self.on_done = self.on_done, _ignore_outcome  # the caller's callback may refer back to this run
        on_done(outcome)

    def _on_timeout(self) -> None:
        with self._lock:
            if self._finished or self._reason is not None:
                return
            self._timed_out = True
        self.cancel(wall_time_exceeded(self.job))

    def cancel(self, reason: str) -> None:
        """SIGTERM the step's process group, SIGKILL after a grace period."""
        with self._lock:
            if self._finished:
                return
            if self._reason is None:
                self._reason = reason
        _killpg(self.pid, signal.SIGTERM)
        shared_reaper().call_later(self.grace, self._kill_if_running)

    def _kill_if_running(self) -> None:
        with self._lock:
            if self._finished:
                return
        _killpg(self.pid, signal.SIGKILL)


def _nothing() -> None:
    pass


def _ignore_outcome(outcome: Outcome) -> None:
    pass


def _ignore_status(status: int) -> None:
    pass


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
    job: Job, log_fd: int, err_w: int, gate: int, parent: int, token: str, mask: set[int | signal.Signals],
    cgroup: str, shell: Shell,
) -> None:  # pragma: no cover - child process
    code = 1
    try:
        reset_in_child()
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.setpgid(0, 0)
        _die_with_parent()
        shared_guardian().close_in_child()
        for fd in list(_fences):
            os.close(fd)  # heartbeat pipes, its own too: their end of file must follow the runner's
        _fences.clear()
        # The runner may have died before the death signal was set: then it never comes.
        first = os.read(gate, 4096) if os.getppid() == parent else b""
        if not first:
            code = NO_GATE
            return
        os.environ[TOKEN_VAR] = token
        # The step's own fence, in its group, before the step runs; it keeps the pipe. A
        # renewal may already have followed the gate line: the last line is the latest.
        latest = first.decode(errors="replace").split()[-1]
        os.posix_spawn(
            shell.path, shell.sentinel_argv(latest, cgroup), dict(os.environ),
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, 1, 2),
                (os.POSIX_SPAWN_DUP2, gate, FENCE_FD),
            ],
            setsigdef=_DEFAULT_SIGNALS,
        )
        os.close(gate)
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
        os.environ[TOKEN_VAR] = token  # a step's own env may not rename it: it is what finds its leftovers
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
