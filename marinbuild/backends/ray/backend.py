"""Steps as Ray tasks: submitted and watched by the driver, run and recorded beside the work.

The driver prepares a step exactly as locally (info and a ``RUNNING`` marker), then
:class:`RayBackend` submits one Ray task carrying a :class:`TaskSpec`. The task
(:func:`execute`) runs on whichever node Ray picks:

* a function step is called in the Ray worker process itself, with the step's
  environment variables, working directory and stdout/stderr (``logs/step.log``) swapped
  in for its duration and restored afterwards, since Ray reuses its workers;
* a shell step runs ``/bin/sh -c`` as a child of the worker, in the worker's process
  group, which Ray kills whole when the worker dies or the task is cancelled, so no
  orphan keeps writing the output. What a step leaves running is killed when it ends.

The task, not the driver, writes the final markers (info, then ``SUCCESS`` or ``FAILED``)
under an owner naming this submission; the driver records only what the task could not
(a cancelled task, or one whose retries ran out).

Faults. A worker killed or a node lost mid-step is a system failure, and Ray runs the
task again (``max_retries``: the step's ``max_retries_preemption``, else
:data:`DEFAULT_RETRIES`). The retry reads the marker first. ``RUNNING`` under this
submission: it continues as the next attempt (a ``fresh_output`` step's files are
cleared first). ``SUCCESS`` or ``FAILED`` under this submission: an earlier attempt
recorded its outcome and was lost just after; the retry returns that outcome without
running the step again. A lost worker never yields a SUCCESS without complete output,
nor two successful executions. A driver that dies takes its tasks with it: Ray kills
the running tasks of a driver that is gone.

Leases. The driver claims and renews a step's lease as for a local step; the task makes
the fencing check beside the work (:class:`LeaseFence`: the lease still names the runner
that started it) before it writes ``RUNNING`` and again before the final markers, and
writes nothing once it fails. While the step runs, a watchdog thread in the worker reads
the lease and kills the worker's process group once the lease names another runner or
has gone unrenewed for the one lease policy's time (:class:`~marinbuild.store.lease.LeaseSettings`:
``fence_read_interval``, ``remote_kill_after``; a driver suspended or cut off from the store,
which Ray does not notice); a retry after a lost worker starts the step only
once it has seen the driver renew. ``lease_for`` swaps in any other :class:`TaskLease`,
such as one whose heartbeat runs in the worker.

Code. The Marinfile (module ``__marinfile__``, which workers cannot import) and every
module loaded from its folder travel with each task, pickled by value
(:func:`ship_project_code`); marinbuild and the libraries steps import must be installed
on the nodes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from marinbuild.backends.base import Backend, BackendHooks, Job, Outcome, wall_time_exceeded
from marinbuild.backends.environments import runtime_env_of, spec_of
from marinbuild.backends.final_records import RecordedOutcome, record
from marinbuild.backends.local.backend import _describe_exit
from marinbuild.backends.local.containment import TOKEN_VAR, kill_token
from marinbuild.backends.ray.cluster import Placement, require_ray
from marinbuild.backends.ray.lease_fence import LeaseFence, TaskLease
from marinbuild.graph import StepGraph, StepNode
from marinbuild.store.lease import LeaseRecord, LeaseSettings, lease_path, process_running
from marinbuild.store.markers import (
    FAILED,
    MARKER_DIR,
    RUNNING,
    SUCCESS,
    log_path,
    read_info,
    read_statuses,
    write_status,
)
from marinbuild.store.storage import Storage

__all__ = ["DEFAULT_RETRIES", "RayBackend", "TaskResult", "TaskSpec", "execute_task", "ship_project_code"]

DEFAULT_RETRIES = 3
"""Times Ray reruns a step whose worker or node was lost, unless the step sets
``max_retries_preemption``."""

_CANCEL_AGAIN_S = 1.0


@dataclass(frozen=True)
class TaskSpec:
    """Everything the task needs to run one step once and record how it ended."""

    name: str
    output_path: str
    prefix: str
    workdir: str
    env: Mapping[str, str]
    token: str
    """Names this submission in the markers the task writes (its retries share it)."""
    log_file: str | None = None
    """The log on a shared disk; None for a remote prefix (written on the node, then uploaded)."""
    fn: Callable[[Any], Any] | None = None
    config: Any = None
    command: str | None = None
    fresh_output: bool = False
    lease: TaskLease | None = None
    environment: Mapping[str, Any] | None = None
    """The step's Python environment as ``info.json`` records it (Ray installs it)."""
    retries: Mapping[str, Any] | None = None
    """The driver's retry counts before this attempt, for the final status marker."""


@dataclass(frozen=True)
class TaskResult:
    """How the step ended; ``recorded``: as the task wrote it in the markers."""

    ok: bool
    started: float
    ended: float
    error: str | None = None
    returncode: int | None = None
    attempt: int = 1
    recorded: bool = True
    host: str | None = None


class RayBackend(BackendHooks):
    """Submit the steps placed on Ray as tasks; every other step goes to ``fallback(node)``."""

    label = "ray"
    announces_start = True
    """A task may wait in Ray's queue for a node; it rewrites the step's RUNNING marker once it starts."""

    def __init__(
        self,
        graph: StepGraph,
        placements: Mapping[str, Placement | None],
        fallback: Callable[[StepNode], Backend],
        lease_for: Callable[[Job], TaskLease | None] | None = None,
        fresh_output: bool = False,
        lease: LeaseSettings | None = None,
    ) -> None:
        self.ray = require_ray()
        self.graph = graph
        self.placements = {n: p for n, p in placements.items() if p is not None}
        self.fallback = fallback
        self.lease_for = lease_for
        self.fresh_output = fresh_output
        self.lease = lease or LeaseSettings.resolve()
        self.task = self.ray.remote(execute_task)

    def backend_for(self, node: StepNode) -> Backend:
        """This backend for steps placed on Ray, the fallback's choice for the rest (TPU steps on SSH)."""
        return self if node.name in self.placements else self.fallback(node)

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _RayRun:
        run = _RayRun(self, job, on_done)
        run.submit()
        return run

    def spec_for(self, job: Job) -> TaskSpec:
        step = self.graph.nodes[job.name].step
        storage = Storage.for_prefix(self.graph.prefix)
        return TaskSpec(
            name=job.name,
            output_path=job.output_path,
            prefix=self.graph.prefix,
            workdir=job.workdir,
            env=dict(job.env),
            token=uuid.uuid4().hex,
            log_file=storage.local_file(job.log_file),  # the node writes it in place only on a shared disk
            fn=job.fn,
            config=job.config,
            command=job.command,
            fresh_output=step.fresh_output or self.fresh_output,
            lease=self.lease_for(job) if self.lease_for is not None else self._fence(storage, job),
            environment=environment.to_json() if (environment := spec_of(job)) is not None else None,
            retries=job.retries,
        )

    def _fence(self, storage: Storage, job: Job) -> LeaseFence | None:
        """A fence on the lease this driver took for the step, if it took one."""
        path = lease_path(job.output_path)
        text = storage.read_text(path)
        record = LeaseRecord.from_json(text) if text is not None else None
        return LeaseFence(self.graph.prefix, path, record.owner, self.lease) if record is not None else None

    def requeued(self, job: Job) -> bool:
        """Whether the task that started ``job`` has lost its worker (and Ray will run it again).

        Asked before a silent task is called a hang: the ``RUNNING`` marker names the worker
        that wrote it, and a worker of this machine that is gone is no hang. A worker on
        another machine cannot be looked at from here: its silence counts.
        """
        out = job.output_path
        record = read_statuses(Storage.for_prefix(self.graph.prefix), [out]).get(out)
        if record is None or record.status != RUNNING or _token(record.owner) is None:
            return False
        host, pid = _worker_of(record.owner)
        return host == socket.gethostname() and pid is not None and not process_running(pid)

    def header_host(self, job: Job) -> str:
        return "ray-node"  # whichever node Ray picks: unknown when the attempt starts

    def watches_progress(self, job: Job) -> bool:
        """Whether the retry loop must leave hangs of ``job`` alone: its log is written on the node.

        With the log on a disk this machine shares (a local prefix), the loop watches it and the
        step's progress file like a local step's, and cancels a hung task. Otherwise nothing the
        driver can see moves while the task runs, so no hang is called (documented in docs/ray.md).
        """
        return job.log_file != log_path(job.output_path)

    def retries_for(self, job: Job) -> int:
        own = self.graph.nodes[job.name].step.max_retries_preemption
        return DEFAULT_RETRIES if own is None else own


class _RayRun:
    """One submitted task: its reference, the reason it was cancelled, its wall-time timer."""

    def __init__(self, backend: RayBackend, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.backend = backend
        self.job = job
        self.on_done = on_done
        self.started = 0.0
        self.ref: Any = None
        self._reason: str | None = None
        self._timed_out = False
        self._ended = False
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None
        self._again: threading.Timer | None = None

    def submit(self) -> None:
        backend, job = self.backend, self.job
        options = dict(backend.placements[job.name].options)
        environment = spec_of(job)
        if environment is not None:
            # Ray builds the environment on the node (and caches it there) before the task runs.
            options["runtime_env"] = runtime_env_of(environment)
        self.started = time.time()
        self.ref = backend.task.options(
            **options, max_retries=backend.retries_for(job), retry_exceptions=False, name=job.name
        ).remote(backend.spec_for(job))
        if job.timeout is not None:
            self._timer = threading.Timer(job.timeout, self._on_timeout)
            self._timer.daemon = True
            self._timer.start()
        # Completion arrives on a Ray thread; the scheduler only queues it.
        self.ref.future().add_done_callback(self._done)

    def _on_timeout(self) -> None:
        with self._lock:
            if self._reason is not None:
                return
            self._timed_out = True
        self.cancel(wall_time_exceeded(self.job))

    def cancel(self, reason: str) -> None:
        """Stop the task; its outcome still arrives through the callback."""
        with self._lock:
            if self._reason is None:
                self._reason = reason
        self._send_cancel(again=False)

    def _send_cancel(self, again: bool) -> None:
        # Ray interrupts a running task only by killing its worker (force), and with it
        # the worker's process group: a shell step's command and its children.
        with contextlib.suppress(Exception):
            self.backend.ray.cancel(self.ref, force=True)
        # A cancel that reaches the task while it is being handed to a worker can be lost,
        # and the step then runs to its end: sent again each second until the task has ended.
        with self._lock:
            if self._ended or (self._again is not None and not again):
                return
            self._again = threading.Timer(_CANCEL_AGAIN_S, self._send_cancel, args=(True,))
            self._again.daemon = True
            self._again.start()

    def _done(self, future: Any) -> None:
        with self._lock:
            self._ended = True
        for timer in (self._timer, self._again):
            if timer is not None:
                timer.cancel()
        ended = time.time()
        with self._lock:
            reason, timed_out = self._reason, self._timed_out
        try:
            result: TaskResult = future.result()
        except BaseException as e:  # every way a task can end is reported to the scheduler
            self.on_done(self._lost(e, reason, timed_out, ended))
            return
        if reason is not None and not result.ok:
            # Ray's kill reached the step's processes before the task itself, which then
            # recorded the kill as the step's failure; the reason is the cancel's. Where the
            # task wrote its markers, only what goes with them (the ledger) is left to write:
            # a commit over them would be refused as another runner's, and the ledger lost.
            self.on_done(self._cancelled(reason, timed_out, ended, RecordedOutcome if result.recorded else Outcome))
            return
        kind = RecordedOutcome if result.recorded else Outcome
        # Workers Ray lost and ran the task again for, within this attempt: the ledger says how many.
        lost = {"ray_lost_workers": result.attempt - 1} if result.attempt > 1 else {}
        self.on_done(kind(result.ok, result.started, result.ended, result.error, result.returncode, host=result.host,
                          details=lost))

    def _cancelled(self, reason: str, timed_out: bool, ended: float, kind: type[Outcome] = Outcome) -> Outcome:
        return kind(
            ok=False, started=self.started, ended=ended, error=reason, timed_out=timed_out, cancelled=not timed_out
        )

    def _lost(self, error: BaseException, reason: str | None, timed_out: bool, ended: float) -> Outcome:
        """The outcome of a task that reported nothing itself: the driver records it."""
        ray = self.backend.ray
        if reason is not None or isinstance(error, ray.exceptions.TaskCancelledError):
            return self._cancelled(reason or "cancelled", timed_out, ended)
        if isinstance(error, ray.exceptions.RayTaskError):
            text = f"{type(error.cause).__name__}: {error.cause}" if error.cause is not None else str(error)
        else:
            retries = self.backend.retries_for(self.job)
            text = f"Ray lost the step's worker or node {retries + 1} times: {type(error).__name__}: {error}"
        return Outcome(ok=False, started=self.started, ended=ended, error=text.strip().splitlines()[0])


# ---------------------------------------------------------------------------------------
# The task side: runs inside a Ray worker.


def execute_task(spec: TaskSpec) -> TaskResult:
    """Run one step in this Ray worker and record its outcome beside the work."""
    storage = Storage.for_prefix(spec.prefix)
    out = spec.output_path
    earlier = read_statuses(storage, [out]).get(out)
    attempt = 1
    if earlier is not None and _token(earlier.owner) == spec.token:
        if earlier.status in (SUCCESS, FAILED):
            # An earlier attempt of this submission recorded its outcome, then was lost.
            duration = earlier.duration or 0.0
            return TaskResult(
                ok=earlier.status == SUCCESS,
                started=earlier.time - duration,
                ended=earlier.time,
                error=earlier.error,
                attempt=_attempt_of_owner(earlier.owner),
            )
        attempt = _attempt_of_owner(earlier.owner) + 1
        if spec.fresh_output:
            _clear_outputs(storage, out)
    owner = f"{socket.gethostname()}:{os.getpid()} {spec.token}/{attempt}"
    with _held(spec.lease) as held:
        renewed = getattr(spec.lease, "renewed", None)
        if not held() or (attempt > 1 and renewed is not None and not renewed()):
            now = time.time()
            return TaskResult(False, now, now, "lease lost before the step started", attempt=attempt, recorded=False)
        write_status(storage, out, RUNNING, owner=owner)
        started = time.time()
        with _log_fd(spec, storage) as log_fd:
            if attempt > 1:
                os.write(log_fd, f"marinbuild: attempt {attempt} (an earlier Ray worker was lost)\n".encode())
            run = _run_command if spec.command is not None else _call_function
            # Inherited by whatever the step starts, so that what leaves the group is found too.
            token = f"ray-{spec.token}-{attempt}"
            os.environ[TOKEN_VAR] = token
            try:
                error, code = run(spec, log_fd)
            finally:
                os.environ.pop(TOKEN_VAR, None)
                _kill_leftovers()
                kill_token(token)
        still_held = held()
    ended = time.time()
    if not still_held:
        # The step belongs to another runner now: its markers, not these, must stand.
        return TaskResult(False, started, ended, "lease lost while running", code, attempt=attempt, recorded=False)
    outcome = Outcome(ok=error is None, started=started, ended=ended, error=error, returncode=code,
                      retries=dict(spec.retries) if spec.retries is not None else None)
    info = read_info(storage, out) or {}
    info["ray"] = {"node_id": _node_id(), "pid": os.getpid(), "attempt": attempt, "host": socket.gethostname()}
    if spec.environment is not None:
        info["environment"] = dict(spec.environment)
    record(storage, out, info, outcome, owner=owner)
    return TaskResult(outcome.ok, started, ended, error, code, attempt=attempt, host=socket.gethostname())


def _token(owner: str | None) -> str | None:
    """The submission token in an owner written by :func:`execute` (``host:pid TOKEN/ATTEMPT``)."""
    if not owner or " " not in owner:
        return None
    return owner.rsplit(" ", 1)[1].split("/", 1)[0]


def _worker_of(owner: str | None) -> tuple[str, int | None]:
    """The host and pid of the worker in an owner written by :func:`execute` (``host:pid TOKEN/ATTEMPT``)."""
    host, _, pid = (owner or "").split(" ", 1)[0].rpartition(":")
    return host, int(pid) if pid.isdigit() else None


def _attempt_of_owner(owner: str | None) -> int:
    try:
        return int((owner or "").rsplit("/", 1)[1])
    except (IndexError, ValueError):
        return 1


def _clear_outputs(storage: Storage, out: str) -> None:
    """Remove a lost attempt's files, keeping the markers and the log."""
    for name in storage.list_names(out):
        if name not in (MARKER_DIR, "logs"):
            storage.remove(Storage.join(out, name))


@contextlib.contextmanager
def _held(lease: TaskLease | None) -> Iterator[Callable[[], bool]]:
    """Keep ``lease`` alive while the step runs; yields the fencing check."""
    if lease is None:
        yield lambda: True
        return
    lease.start()
    try:
        yield lease.held
    finally:
        lease.stop()


@contextlib.contextmanager
def _log_fd(spec: TaskSpec, storage: Storage) -> Iterator[int]:
    """The step's log, opened for appending; a node-local file uploaded afterwards for a remote prefix."""
    if spec.log_file is not None:
        os.makedirs(os.path.dirname(spec.log_file), exist_ok=True)
        fd = os.open(spec.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            yield fd
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="marinbuild-ray-log-") as folder:
        path = os.path.join(folder, "step.log")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            yield fd
        finally:
            os.close(fd)
            storage.put_file(path, log_path(spec.output_path))


def _environment(spec: TaskSpec) -> dict[str, str]:
    return {**os.environ, **spec.env}


def _call_function(spec: TaskSpec, log_fd: int) -> tuple[str | None, int]:
    """Call the step's function here with its environment, folder and output swapped in."""
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_path = list(sys.path)
    saved_streams = (sys.stdout, sys.stderr)
    for stream in saved_streams:
        stream.flush()
    saved_fds = (os.dup(1), os.dup(2))
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.update(spec.env)
        if os.path.isdir(spec.workdir):
            os.chdir(spec.workdir)
            sys.path.insert(0, spec.workdir)
        try:
            assert spec.fn is not None
            spec.fn(spec.config)
            return None, 0
        except Exception as e:  # everything the step raises is its failure
            traceback.print_exc()
            return (f"{type(e).__name__}: {e}".splitlines()[0] if str(e) else type(e).__name__), 1
        except SystemExit as e:
            return f"the step called exit({e.code})", 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        os.close(saved_fds[0])
        os.close(saved_fds[1])
        os.environ.clear()
        os.environ.update(saved_env)
        sys.path[:] = saved_path
        with contextlib.suppress(OSError):
            os.chdir(saved_cwd)


def _run_command(spec: TaskSpec, log_fd: int) -> tuple[str | None, int]:
    """Run the shell step as a child of the worker, in the worker's process group.

    Ray gives each worker its own process group and kills that group when the worker
    dies or its task is cancelled, so the command and all its children go with it. A
    group of the command's own would escape that and race the retry for the output.
    """
    assert spec.command is not None
    cwd = spec.workdir if os.path.isdir(spec.workdir) else None
    proc = subprocess.Popen(
        ["/bin/sh", "-c", spec.command],
        cwd=cwd,
        env=_environment(spec),
        stdin=subprocess.DEVNULL,
        stdout=log_fd,
        stderr=subprocess.STDOUT,
    )
    code = proc.wait()
    return (None if code == 0 else _describe_exit(code)), code


def _kill_leftovers() -> None:
    """Kill whatever the step left running in the worker's process group, as a local run does.

    Only when the worker leads a group of its own (Ray's per-worker process groups):
    otherwise nothing tells the step's processes apart from anyone else's.
    """
    me = os.getpid()
    if os.getpgid(0) != me:
        return
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != me:
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry)) == me:
                        os.kill(int(entry), signal.SIGKILL)


def _node_id() -> str | None:
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return None  # not inside a Ray worker (the task body called directly)
    return str(ray.get_runtime_context().get_node_id())


def ship_project_code(marinfile_path: str) -> list[str]:
    """Pickle the Marinfile and the modules loaded from its folder by value; their names.

    Workers cannot import ``__marinfile__``, nor, without a shared disk, the modules
    beside it; by value, the functions and classes a task refers to travel inside it.
    marinbuild itself is left by reference even when it lives in that folder.
    """
    ray = require_ray()
    folder = os.path.dirname(os.path.abspath(marinfile_path)) + os.sep
    shipped = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        installed = "site-packages" in path or "dist-packages" in path
        beside = bool(path) and os.path.abspath(path).startswith(folder) and not installed
        # A package goes whole with its top module; marinbuild stays by reference.
        if (name == "__marinfile__" or beside) and "." not in name and name != "marinbuild":
            ray.cloudpickle.register_pickle_by_value(module)
            shipped.append(name)
    return sorted(shipped)
