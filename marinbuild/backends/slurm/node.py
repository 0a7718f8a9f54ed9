"""What runs inside a Slurm job: the batch script's launcher on the first node, one process per node.

The job script is one line, ``python -m marinbuild.backends.slurm.node batch SPEC``. On the
first node of the allocation it finds the coordinator (this node's address as Slurm knows it,
and a port derived from the job id) and starts the step once per node with ``srun``; each of
those runs ``node task SPEC``, which

* sets the variables a TPU host gets: ``MARINBUILD_PROCESS_ID`` (the node's rank),
  ``MARINBUILD_NUM_PROCESSES``, ``MARINBUILD_COORDINATOR_ADDRESS``, ``MARINBUILD_OUTPUT``,
  ``MARINBUILD_ATTEMPT`` (with the step's own from the spec), none of the submitting shell's
  stale ``MARINBUILD_*`` or ``MEGASCALE_*`` surviving;
* checks that the run still holds the step's lease, then runs the shell command (or the
  function step, by name, through :mod:`marinbuild.backends.worker`) in a process group of
  its own, its output copied to the job's output and to this node's log;
* fences it: the lease is read every ``fence_read_interval`` and the step's group killed once
  the lease names another runner or has gone unrenewed for ``remote_kill_after`` (the one lease
  policy, :class:`~marinbuild.store.lease.LeaseSettings`), so a job whose runner was SIGKILLed
  or cut off stops itself before anyone may take the step over;
* writes ``exit-RANK.json`` (its exit code and a one-line error) into the job's folder.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["NodeSpec", "coordinator_port", "failures_first", "node_main", "process_env", "stop_file"]

STALE_PREFIXES = ("MARINBUILD_", "MEGASCALE_")
"""Variables of the submitting shell that never reach a step: its own come from the spec."""
_FIRST_PORT = 20000
_PORTS = 20000


@dataclass(frozen=True)
class NodeSpec:
    """Everything the job needs, written as JSON into its folder by the runner."""

    name: str
    output_path: str
    prefix: str
    workdir: str
    folder: str
    """The job's folder on the shared file system: this spec, the batch output, exit files, node logs."""
    env: Mapping[str, str]
    nodes: int = 1
    command: str | None = None
    marinfile: str | None = None
    """For a function step: the Marinfile the worker loads."""
    python: str = sys.executable
    lease_path: str | None = None
    owner: Mapping[str, Any] | None = None
    """The runner's lease owner when the job was submitted (:class:`~marinbuild.store.lease.Owner` fields)."""
    heartbeat: float = 10.0
    expiry: float = 60.0
    attempt: int = 1
    header: str = ""
    """The attempt's header line, written at the top of each node's log."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def read(cls, path: str) -> NodeSpec:
        with open(path) as f:
            return cls(**json.load(f))


def stop_file(folder: str, restart: int) -> str:
    """The file by which the runner stops what run ``restart`` of a job (``SLURM_RESTART_COUNT``)
    left on a node Slurm lost: a node whose slurmd died, or cut off from the controller, may still
    run the step while the runner starts it again elsewhere. Each node's fence watches for it."""
    return os.path.join(folder, f"stop-{restart}")


def coordinator_port(job_id: int) -> int:
    """The coordinator's port of job ``job_id``: the same on every node, different for jobs that run together.

    >>> coordinator_port(7), coordinator_port(20007)
    (20007, 20007)
    """
    return _FIRST_PORT + job_id % _PORTS


def process_env(base: Mapping[str, str], spec: NodeSpec, rank: int, size: int, coordinator: str) -> dict[str, str]:
    """The environment of the step's process on one node: the node's own, without stale marinbuild
    variables, then the step's, then its rank among the nodes.

    >>> spec = NodeSpec("s", "/o", "/p", "/w", "/f", {"MARINBUILD_OUTPUT": "/o", "A": "1"})
    >>> env = process_env({"MARINBUILD_PROCESS_ID": "9", "MEGASCALE_X": "y", "PATH": "/bin"}, spec, 1, 2, "h:1")
    >>> sorted(env.items())  # doctest: +NORMALIZE_WHITESPACE
    [('A', '1'), ('MARINBUILD_COORDINATOR_ADDRESS', 'h:1'), ('MARINBUILD_NUM_PROCESSES', '2'),
     ('MARINBUILD_OUTPUT', '/o'), ('MARINBUILD_PROCESS_ID', '1'), ('PATH', '/bin')]
    """
    env = {k: v for k, v in base.items() if not k.startswith(STALE_PREFIXES)}
    env.update(spec.env)
    env.update(
        MARINBUILD_PROCESS_ID=str(rank), MARINBUILD_NUM_PROCESSES=str(size), MARINBUILD_COORDINATOR_ADDRESS=coordinator,
    )
    return env


def _batch(spec_path: str) -> int:
    """On the first node: the coordinator, then the step once per node with srun."""
    spec = NodeSpec.read(spec_path)
    job_id = int(os.environ.get("SLURM_JOB_ID", "0"))
    coordinator = f"{_node_address()}:{coordinator_port(job_id)}"
    env = {**os.environ, "MARINBUILD_COORDINATOR_ADDRESS": coordinator}
    argv = ["srun", f"--nodes={spec.nodes}", f"--ntasks={spec.nodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "--label" if spec.nodes > 1 else "--unbuffered",
            spec.python, "-m", "marinbuild.backends.slurm.node", "task", spec_path]
    sys.stdout.flush()
    return subprocess.call(argv, env=env, stdin=subprocess.DEVNULL)


def _node_address() -> str:
    """This node's address as Slurm names it (``NodeAddr``), else its host name."""
    name = os.environ.get("SLURMD_NODENAME", "")
    if name:
        try:
            shown = subprocess.run(["scontrol", "show", "node", "-o", name], capture_output=True, text=True, timeout=30)
            for word in shown.stdout.split():
                if word.startswith("NodeAddr="):
                    return word.split("=", 1)[1]
        except (OSError, subprocess.SubprocessError):
            pass
    return socket.gethostname()


def _task(spec_path: str) -> int:
    """On every node: the step's process, fenced by its lease; its exit file."""
    spec = NodeSpec.read(spec_path)
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    size = int(os.environ.get("SLURM_NTASKS", "1"))
    coordinator = os.environ.get("MARINBUILD_COORDINATOR_ADDRESS", "")
    env = process_env(os.environ, spec, rank, size, coordinator)
    node = os.environ.get("SLURMD_NODENAME", socket.gethostname())
    log_path = os.path.join(spec.folder, f"node_{rank:02d}.log")
    with open(log_path, "a") as log:
        if spec.header:
            log.write(spec.header.replace(" host ? ", f" host {node} "))
        log.flush()
        code, error, stopped = _fenced(spec, env, log)
    ended = time.time()
    with open(os.path.join(spec.folder, f"exit-{rank}.json"), "w") as f:
        # "stopped": this process was still running when Slurm stopped the task (srun ending
        # the job for another rank's failure): its exit is a consequence, never the cause.
        # "ended": when its exit was seen. srun stops the others only once a failed rank's task
        # (this process) has exited, so the rank that failed first ended first, even where
        # Slurm signalled a step's processes before the task that would have marked it stopped.
        json.dump({"code": code, "error": error, "node": node, "rank": rank, "stopped": stopped, "ended": ended}, f)
    return 0 if code == 0 else (code if 0 < code < 256 else 1)


def failures_first(exits: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The nodes' exit records that failed, the cause first: the process that failed first, not
    one srun stopped for it (on two nodes rank 1's exit status 7 is the cause, rank 0's SIGTERM,
    or 143 from its shell, only its consequence).

    >>> [e["rank"] for e in failures_first([{"rank": 0, "code": 143, "ended": 2.0}, {"rank": 1, "code": 7, "ended": 1.0}])]
    [1, 0]
    """
    def rank(e: Mapping[str, Any]) -> tuple[bool, float, bool]:
        ended = e.get("ended")
        # Exit files of an earlier version have no time: after every timed one.
        when = float(ended) if isinstance(ended, (int, float)) and not isinstance(ended, bool) else math.inf
        return e.get("stopped") is True, when, not (isinstance(e["code"], int) and e["code"] > 0)

    return sorted((e for e in exits if e.get("code")), key=rank)


def _argv(spec: NodeSpec) -> list[str]:
    if spec.command is not None:
        return ["/bin/sh", "-c", spec.command]
    return [spec.python, "-m", "marinbuild.backends.worker", "--file", spec.marinfile or "Marinfile.py",
            "--step", spec.name, "--prefix", spec.prefix]


def _fenced(spec: NodeSpec, env: dict[str, str], log: Any) -> tuple[int, str | None, bool]:
    """Run the step under its fence; its exit code, error, and whether a stop reached it while it ran."""
    fence = _Fence(spec)
    if not fence.held():
        return 1, "lease lost before the step started", False
    proc = subprocess.Popen(_argv(spec), cwd=spec.workdir if os.path.isdir(spec.workdir) else None, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)

    stopped = False

    def stop(signum: int, frame: Any) -> None:  # scancel: the step's whole group goes with the job
        nonlocal stopped
        stopped = stopped or proc.poll() is None
        _kill_group(proc.pid, signal.SIGTERM)

    from marinbuild.backends.held_signals import handle_stops

    handle_stops(stop)
    fence.watch(proc.pid)
    last = ""
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode(errors="replace")
        sys.stdout.write(line)
        sys.stdout.flush()
        log.write(line)
        log.flush()
        if line.strip():
            last = line.strip()
    code = proc.wait()
    fence.stop()
    _kill_group(proc.pid, signal.SIGKILL)  # what the step left running
    if fence.killed is not None:
        return 1, fence.killed, stopped
    if code == 0:
        return 0, None, stopped
    from marinbuild.backends.worker import FAILED_LINE

    if spec.command is None and last.startswith(FAILED_LINE):
        return code, last[len(FAILED_LINE):], stopped
    return code, f"killed by signal {-code}" if code < 0 else f"exit status {code}", stopped


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


class _Fence:
    """The step's lease, watched beside the work; kills the step's group when the run lost it."""

    def __init__(self, spec: NodeSpec) -> None:
        from marinbuild.store.lease import LeaseSettings

        self.spec = spec
        self.policy = LeaseSettings(heartbeat=spec.heartbeat, expiry=spec.expiry)
        self.killed: str | None = None
        self._stop = threading.Event()
        self._seen: str | None = None
        self._stop_path = stop_file(spec.folder, int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))

    def _read(self) -> tuple[str | None, bool]:
        """The lease's text and whether it names the runner that submitted the job."""
        from marinbuild.store.lease import LeaseRecord, Owner
        from marinbuild.store.storage import Storage

        assert self.spec.lease_path is not None and self.spec.owner is not None
        text = Storage.for_prefix(self.spec.prefix).read_text(self.spec.lease_path)
        record = LeaseRecord.from_json(text) if text is not None else None
        return text, record is not None and record.owner.same(Owner(**self.spec.owner))

    def held(self) -> bool:
        if os.path.exists(self._stop_path):
            return False
        if self.spec.lease_path is None:
            return True
        text, mine = self._read()
        self._seen = text
        return mine

    def watch(self, pgid: int) -> None:
        threading.Thread(target=self._watch, args=(pgid,), name="marinbuild-lease-fence", daemon=True).start()

    def _stopped(self) -> str | None:
        try:
            with open(self._stop_path) as f:
                return f.read().strip() or "stopped by its runner"
        except OSError:
            return None

    def stop(self) -> None:
        self._stop.set()

    def _watch(self, pgid: int) -> None:
        since = time.monotonic()
        while not self._stop.wait(self.policy.fence_read_interval):
            stopped = self._stopped()
            if stopped is not None:
                return self._kill(pgid, stopped)
            if self.spec.lease_path is None:
                continue
            try:
                text, mine = self._read()
            except Exception:  # unreadable counts as unrenewed
                text, mine = None, True
            if text is not None and not mine:
                return self._kill(pgid, "lease lost: another runner holds the step")
            if text is not None and text != self._seen:
                self._seen, since = text, time.monotonic()
            elif time.monotonic() - since >= self.policy.remote_kill_after:
                return self._kill(pgid, f"lease not renewed for {self.policy.remote_kill_after:g} s: its runner is gone")

    def _kill(self, pgid: int, why: str) -> None:
        if self._stop.is_set():
            return
        self.killed = why
        print(f"marinbuild: {why}; stopping the step", flush=True)
        _kill_group(pgid, signal.SIGKILL)


def node_main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("batch", "task"):
        print("usage: python -m marinbuild.backends.slurm.node batch|task SPEC", file=sys.stderr)
        return 2
    return _batch(args[1]) if args[0] == "batch" else _task(args[1])


if __name__ == "__main__":
    sys.exit(node_main())
