"""Steps as Slurm jobs: submitted with sbatch, watched with one squeue per poll, cancelled with scancel.

Each attempt of a step is one job (:mod:`marinbuild.backends.slurm.submission` maps its
resources). The job's folder (the spec, the batch output, each node's log and exit file) lies
on a file system every node sees: under the prefix when it is a local path, else under the
project. The job runs :mod:`marinbuild.backends.slurm.node`, which starts the step once per
node and fences it by the step's lease.

One poller thread asks ``squeue`` about every job of the run at once each ``poll_interval``
(``sacct`` too, where accounting is on, for jobs ``squeue`` no longer shows), copies what the
job printed into the step's log, and ends an attempt by its job's state:

=========================================  ==================================================
job state                                  cause (the retry loop's budget)
=========================================  ==================================================
``COMPLETED``                              ``SUCCESS``
``FAILED``, ``OUT_OF_MEMORY``              ``FAILED``
``PREEMPTED``, ``NODE_FAIL``, ``BOOT_FAIL``  ``PREEMPTED``
``TIMEOUT``                                ``TIMEOUT``
``CANCELLED`` (not by this run)            ``CANCELLED``, saying someone else cancelled it
=========================================  ==================================================

With ``requeue = true`` Slurm may requeue a job (a preemption with ``PreemptMode=REQUEUE``, a
lost node): the attempt goes on, its log says so, and no hang is counted while it waits.
A pending job's id and reason are written beside the step's markers (``.marinbuild/slurm``)
for ``marinbuild status``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from marinbuild.backends.base import HELD_EXTRA, BackendHooks, Cause, Job, Outcome, wall_time_exceeded
from marinbuild.backends.slurm import commands
from marinbuild.backends.slurm.commands import JobState, SlurmError
from marinbuild.backends.slurm.node import STALE_PREFIXES, NodeSpec, failures_first, stop_file
from marinbuild.backends.slurm.settings import SlurmSettings
from marinbuild.backends.slurm.submission import comment_of, job_name, sbatch_args
from marinbuild.errors import MarinbuildError
from marinbuild.resources import Request
from marinbuild.store.attempt_ledger import iso_time
from marinbuild.store.lease import LeaseRecord, LeaseSettings, lease_path
from marinbuild.store.markers import MARKER_DIR
from marinbuild.store.step_logs import append_note, attempt_header
from marinbuild.store.storage import Storage

__all__ = ["SLURM_MARKER", "SlurmBackend", "read_slurm_marker", "read_slurm_markers", "slurm_wait_text"]

SLURM_MARKER = "slurm"
"""The file beside a step's markers saying which Slurm job runs it and why it waits."""
_VANISHED_GRACE_S = 120.0
"""How long a job may be missing from squeue right after sbatch answered (a busy controller)."""


def read_slurm_marker(storage: Storage, output: str) -> dict[str, Any] | None:
    """What the run last saw of the step's job: ``{"job_id", "state", "reason", "nodes"}``; None if none."""
    text = storage.read_text(Storage.join(output, MARKER_DIR, SLURM_MARKER))
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def read_slurm_markers(storage: Storage, outputs: list[str]) -> dict[str, dict[str, Any]]:
    """:func:`read_slurm_marker` of many steps in one batch read (steps with none are absent)."""
    paths = {Storage.join(out, MARKER_DIR, SLURM_MARKER): out for out in outputs}
    found: dict[str, dict[str, Any]] = {}
    for path, text in storage.read_many(paths).items():
        try:
            record = json.loads(text)
        except ValueError:
            continue
        if isinstance(record, dict):
            found[paths[path]] = record
    return found


def slurm_named(project: Any) -> bool:
    """Whether the project points at Slurm: ``DEFAULT_BACKEND = "slurm"``, or a ``[slurm]`` table in
    its default cluster file. Where a read costs a round trip (``gs://``), ``status`` asks for
    Slurm job notes only then; on local disk it reads them for every running step."""
    from marinbuild.backends.cluster_file import cluster_path, read_toml

    if project.marinfile.default("DEFAULT_BACKEND") == "slurm":
        return True
    path = cluster_path(project.workdir, project.marinfile.default("DEFAULT_CLUSTER"), None)
    if path is None:
        return False
    try:
        return "slurm" in read_toml(path)
    except MarinbuildError:
        return False


def slurm_wait_text(record: Mapping[str, Any] | None) -> str:
    """``waiting in Slurm: Resources (job 12)`` for a step whose job pends; "" otherwise.

    >>> slurm_wait_text({"state": "PENDING", "reason": "Resources", "job_id": 12})
    'waiting in Slurm: Resources (job 12)'
    """
    if not record or record.get("state") != "PENDING" or record.get("job_id") is None:
        return ""
    return f"waiting in Slurm: {record.get('reason') or 'queued'} (job {record['job_id']})"


class SlurmBackend(BackendHooks):
    """Runs each attempt of a step as a Slurm job; one poller for all of the run's jobs."""

    label = "slurm"
    announces_start = True
    """A job may pend in Slurm's queue; its log says when it starts (the hang clock starts there)."""

    def __init__(
        self,
        *,
        prefix: str,
        workdir: str,
        marinfile: str,
        requests: Mapping[str, Request],
        replicas: Callable[[str], int],
        settings_of: Callable[[str], SlurmSettings],
        lease: LeaseSettings,
        poll_interval: float,
    ) -> None:
        self.prefix = prefix
        self.storage = Storage.for_prefix(prefix)
        self.workdir = workdir
        self.marinfile = marinfile
        self.requests = requests
        self.replicas = replicas
        self.settings_of = settings_of
        self.lease = lease
        self.poll_interval = poll_interval
        self.tag = uuid.uuid4().hex[:12]
        """Names this run in its jobs' comments."""
        local = self.storage.local_file(Storage.join(prefix, ".marinbuild"))
        base = local if local is not None else os.path.join(workdir, ".marinbuild")
        self.folder = os.path.join(base, "slurm", self.tag)
        self._runs: dict[int, _SlurmRun] = {}
        self._by_output: dict[str, _SlurmRun] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._poller: threading.Thread | None = None
        self._submitted: set[str] = set()

    # -- the retry loop's hooks ---------------------------------------------------------

    def header_host(self, job: Job) -> str:
        return "slurm"  # nodes are known once the job starts; the log says which

    def requeued(self, job: Job) -> bool:
        """Whether the attempt's job waits in Slurm's queue (not started yet, or requeued): no hang."""
        with self._lock:
            run = self._by_output.get(job.output_path)
        return run is not None and (run.requeued_waiting or not run.ran)

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _SlurmRun:
        run = _SlurmRun(self, job, on_done)
        with self._lock:
            self._by_output[job.output_path] = run
        threading.Thread(target=run.submit, name=f"sbatch-{job.name}", daemon=True).start()
        return run

    def first_submission(self, output_path: str) -> bool:
        """Whether this run submits a job for the step at ``output_path`` for the first time."""
        with self._lock:
            first = output_path not in self._submitted
            self._submitted.add(output_path)
        return first

    # -- the poller -----------------------------------------------------------------------

    def _track(self, run: _SlurmRun) -> None:
        assert run.job_id is not None
        with self._lock:
            self._runs[run.job_id] = run
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll_loop, name="slurm-poller", daemon=True)
                self._poller.start()
        self._wake.set()

    def _poll_loop(self) -> None:
        while True:
            self._wake.wait(self.poll_interval)
            self._wake.clear()
            with self._lock:
                runs = dict(self._runs)
            if not runs:
                continue
            try:
                seen = commands.query(runs)  # one squeue for every job of the run
                missing = [i for i in runs if i not in seen]
                if missing:
                    seen.update(commands.query_accounting(missing))
            except (SlurmError, OSError) as e:
                for run in runs.values():
                    run.note_trouble(str(e))
                continue
            for job_id, run in runs.items():
                try:
                    ended = run.update(seen.get(job_id))
                except Exception as e:  # one job's trouble must not stop the poller of every job
                    run.lost_track(e)
                    ended = True
                if ended:
                    with self._lock:
                        self._runs.pop(job_id, None)

    def forget(self, run: _SlurmRun) -> None:
        with self._lock:
            if run.job_id is not None:
                self._runs.pop(run.job_id, None)


class _SlurmRun:
    """One attempt: its job, what it printed so far, how it ended."""

    def __init__(self, backend: SlurmBackend, job: Job, on_done: Callable[[Outcome], None]) -> None:
        self.backend = backend
        self.job = job
        self.on_done = on_done
        self.job_id: int | None = None
        self.submitted = time.time()
        self.started: float | None = None
        self.state = ""
        self.reason: str | None = None
        self.requeued_waiting = False
        self.restarts = 0
        self.nodes = ""
        self.ran = False
        """Whether the job has run (Slurm said RUNNING) at least once."""
        self._done = False
        self._node_offsets: dict[str, int] = {}
        self._reason_seen: str | None = None
        self._offset = 0
        self._lock = threading.Lock()
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(job.output_path.rstrip("/")) or job.name)
        self.folder = os.path.join(backend.folder, f"{safe}-{job.attempt}")
        self.settings = backend.settings_of(job.name)

    # -- submission -------------------------------------------------------------------

    def submit(self) -> None:
        try:
            self._submit()
        except Exception as e:  # every way a submission fails ends the attempt, never leaves it waiting
            now = time.time()
            # Slurm refusing the job (a request no node can hold, an unknown partition, an
            # argument sbatch does not know) is no passing trouble: no retry can help. Anything
            # else (a controller away, munge down) may pass.
            refused = isinstance(e, SlurmError) and e.refused
            self._finish(Outcome(ok=False, started=self.submitted, ended=now,
                                 cause=Cause.FAILED if refused else Cause.INFRA, fatal=refused,
                                 error=f"{e}".splitlines()[0]))

    def _submit(self) -> None:
        backend, job = self.backend, self.job
        os.makedirs(self.folder, exist_ok=True)
        spec_path = os.path.join(self.folder, "spec.json")
        with open(spec_path, "w") as f:
            f.write(self._spec().to_json())
        if job.lost_attempt and backend.first_submission(job.output_path):
            self._stop_earlier_jobs()
        name = job_name(f"{job.name}:{job.attempt}")
        comment = comment_of(backend.tag, job.output_path)
        args = sbatch_args(self.settings, backend.requests[job.name], replicas=backend.replicas(job.name),
                           timeout=job.timeout, name=name, comment=comment,
                           output=os.path.join(self.folder, "batch.log"), workdir=job.workdir)
        script = f"#!/bin/sh\nexec {_quote(self._spec().python)} -m marinbuild.backends.slurm.node batch {_quote(spec_path)}\n"
        env = _submission_env(os.environ)
        job_id = commands.submit(args, script, env)
        if job_id is None:
            # sbatch timed out: it may have reached the controller. The job is found by its tag
            # before it is sent again, never submitted twice.
            found = [s for s in commands.query().values() if s.comment == comment and s.name == name]
            job_id = found[0].job_id if found else commands.submit(args, script, env)
            if job_id is None:
                raise SlurmError("sbatch timed out twice")
        with self._lock:
            self.job_id = job_id
            reason = self.reason
        self._write_marker("PENDING", "submitted")
        append_note(job.log_file, f"marinbuild: Slurm job {job_id} submitted ({' '.join(args[5:]) or 'defaults'})")
        if reason is not None:
            self._scancel()
        backend._track(self)

    def _stop_earlier_jobs(self) -> None:
        """Cancel, and wait out, the jobs an earlier runner of this step left (it was killed
        mid-attempt and this run holds the lease now): the step must not run twice at once
        while their fence has yet to notice. One squeue, only for a step taken over."""
        job = self.job
        left = [s for s in commands.query().values()
                if not s.ended and s.output_path == job.output_path and s.tag != self.backend.tag]
        if not left:
            return
        commands.cancel([s.job_id for s in left])
        for s in left:
            append_note(job.log_file, f"marinbuild: cancelled Slurm job {s.job_id} ({s.name}) its earlier runner left")
        for job_id in commands.wait_stopped([s.job_id for s in left]):
            append_note(job.log_file, f"marinbuild: warning: Slurm job {job_id} is still stopping after "
                                      f"{commands.STOP_WAIT_S:g} s (see squeue)")

    def _spec(self) -> NodeSpec:
        backend, job = self.backend, self.job
        owner = None
        path = lease_path(job.output_path)
        text = backend.storage.read_text(path)
        record = LeaseRecord.from_json(text) if text is not None else None
        if record is not None:
            owner = dict(vars(record.owner))
        return NodeSpec(
            name=job.name, output_path=job.output_path, prefix=backend.prefix, workdir=job.workdir, folder=self.folder,
            env={k: v for k, v in job.env.items()}, nodes=backend.replicas(job.name), command=job.command,
            marinfile=backend.marinfile, lease_path=path if owner is not None else None, owner=owner,
            heartbeat=backend.lease.heartbeat, expiry=backend.lease.expiry, attempt=job.attempt,
            header=attempt_header(job.attempt, time.time(), "?", "slurm"),
        )

    # -- cancelling -------------------------------------------------------------------

    def cancel(self, reason: str) -> None:
        with self._lock:
            if self.reason is None:
                self.reason = reason
            known = self.job_id is not None
        if known:
            self._scancel()

    def _scancel(self) -> None:
        try:
            commands.cancel([self.job_id] if self.job_id is not None else [])
        except (SlurmError, OSError) as e:
            append_note(self.job.log_file, f"marinbuild: scancel {self.job_id} failed: {e}")
        self.backend._wake.set()

    # -- what the poller saw ------------------------------------------------------------

    def note_trouble(self, error: str) -> None:
        if not self._done:
            append_note(self.job.log_file, f"marinbuild: squeue failed ({error}); asking again")

    def lost_track(self, error: BaseException) -> None:
        """The run can no longer follow its job: the job is cancelled and the attempt ends as
        infrastructure trouble, never left waiting."""
        why = f"marinbuild could not follow Slurm job {self.job_id}: {type(error).__name__}: {error}".splitlines()[0]
        with self._lock:
            if self.reason is None:
                self.reason = why
        self._scancel()
        now = time.time()
        self._finish(Outcome(ok=False, started=self.started or self.submitted, ended=now, cause=Cause.INFRA, error=why))

    def update(self, seen: JobState | None) -> bool:
        """Take in what squeue said of the job; True once the attempt has ended."""
        self._copy_output()
        if self.backend.storage.local_file(self.job.output_path) is not None:
            self._copy_node_logs()  # on a shared disk each node's log follows the job (``logs --host -f``)
        if seen is None:
            return self._gone()
        if seen.restarts > self.restarts:
            self._stop_left(f"Slurm requeued job {seen.job_id}")
            self.restarts = seen.restarts
            self.requeued_waiting = True
            append_note(self.job.log_file, f"marinbuild: Slurm requeued job {seen.job_id} (restart {seen.restarts}); "
                                           "this attempt continues when it runs again")
        if seen.state != self.state or seen.reason != self._reason_seen:
            if seen.state == "PENDING" and seen.reason and seen.reason != self._reason_seen:
                # Why it waits (Resources, held, a partition that cannot take it): said once, in the run's output.
                append_note(self.job.log_file, f"marinbuild: Slurm job {seen.job_id} pending: {seen.reason}")
            self._reason_seen = seen.reason
            self.state = seen.state
            self._write_marker(seen.state, seen.reason, seen.nodes)
        if seen.state == "RUNNING" and (not self.ran or self.requeued_waiting):
            self.ran, self.requeued_waiting = True, False
            self.started = seen.start or time.time()
            self.nodes = seen.nodes
            append_note(self.job.log_file, f"marinbuild: Slurm job {seen.job_id} running on {seen.nodes}")
        if not seen.ended:
            return False
        self._end(seen)
        return True

    def _gone(self) -> bool:
        exits = self._exits()
        if exits:
            code = max((e.get("code") or 0 for e in exits), key=abs)
            state = "COMPLETED" if code == 0 else "FAILED"
            self._end(JobState(self.job_id or 0, "", state, start=self.started, end=time.time(), nodes=self.nodes))
            return True
        if time.time() - self.submitted < _VANISHED_GRACE_S:
            return False
        now = time.time()
        self._finish(Outcome(ok=False, started=self.started or self.submitted, ended=now, cause=Cause.INFRA,
                             error=f"Slurm job {self.job_id} vanished from squeue without an exit file"))
        return True

    def _end(self, seen: JobState) -> None:
        self._copy_output()
        self._copy_node_logs()
        with self._lock:
            reason = self.reason
        outcome = self._outcome_of(seen, reason)
        if seen.state.startswith("NODE_FAIL"):
            # Slurm gave up on a node, not necessarily the node on the step: its process may
            # still run there. It is stopped, and heard from, before the step may start again.
            self._stop_left(f"Slurm lost node {seen.nodes or '?'} (job {seen.job_id} ended NODE_FAIL)")
            threading.Thread(target=self._finish_once_stopped, args=(outcome,), name=f"slurm-lost-{seen.job_id}",
                             daemon=True).start()
            return
        self._finish(outcome)

    def _outcome_of(self, seen: JobState, reason: str | None) -> Outcome:
        """The attempt whose job ended as ``seen``; ``reason``: why this run cancelled it (None: it did not)."""
        common = Outcome(ok=False, started=seen.start or self.started or self.submitted, ended=seen.end or time.time(),
                        host=seen.nodes or None, details=self._details_of(seen))
        cause = commands.cause_of(seen.state)
        if cause is Cause.SUCCESS:
            return dataclasses.replace(common, ok=True, returncode=0)
        if cause is Cause.TIMEOUT:
            return dataclasses.replace(common, timed_out=True, error=wall_time_exceeded(self.job))
        if reason is not None:  # this run stopped it, whatever state the stop left it in
            return dataclasses.replace(common, cancelled=True, error=reason)
        if cause is Cause.CANCELLED:
            return dataclasses.replace(common, cancelled=True, cause=Cause.CANCELLED,
                                       error=f"Slurm job {seen.job_id} was cancelled by someone else (scancel outside this run)")
        return self._failure_of(seen, cause, common)

    def _failure_of(self, seen: JobState, cause: Cause, common: Outcome) -> Outcome:
        """A job that failed, was preempted or lost a node: the error of the process that failed first."""
        codes = failures_first(self._exits())
        if cause is Cause.FAILED and codes:
            error = str(codes[0].get("error") or f"exit status {codes[0].get('code')}")
            if self.backend.replicas(self.job.name) > 1:
                error = f"process {codes[0].get('rank', '?')} on {codes[0].get('node', '?')}: {error}"
        else:
            where = f" (nodes {seen.nodes})" if seen.nodes else ""
            error = f"Slurm job {seen.job_id} ended {seen.state}{where}"
        return dataclasses.replace(common, cause=cause, error=error, returncode=int(codes[0]["code"]) if codes else None)

    def _details_of(self, seen: JobState) -> dict[str, Any]:
        """The attempt's ledger fields: its job, the job's state and nodes, requeues, what all its nodes held."""
        details: dict[str, Any] = {"slurm_job": seen.job_id, "slurm_state": seen.state, "nodes": seen.nodes or self.nodes}
        if self.restarts:
            details["slurm_requeues"] = self.restarts
        nodes = self.backend.replicas(self.job.name)
        held = self.job.extra.get(HELD_EXTRA)
        if nodes > 1 and isinstance(held, Mapping):
            details["held"] = {k: v * nodes if isinstance(v, int) and not isinstance(v, bool) else v for k, v in held.items()}
        return details

    def _stop_left(self, why: str) -> None:
        """Tell what this job's current run left on its nodes to stop (:func:`~marinbuild.backends.slurm.node.stop_file`)."""
        try:
            with open(stop_file(self.folder, self.restarts), "w") as f:
                f.write(f"stopped by its runner: {why}\n")
        except OSError as e:
            append_note(self.job.log_file, f"marinbuild: could not tell the job's processes to stop: {e}")

    def _finish_once_stopped(self, outcome: Outcome) -> None:
        """``outcome`` once every node's process that started has written its exit file, or once
        its fence has surely stopped it (it reads the stop file, or kills the step unable to read
        the lease, within ``remote_kill_after`` and a read)."""
        lease = self.backend.lease
        limit = lease.remote_kill_after + 2 * lease.fence_read_interval
        deadline = time.monotonic() + limit
        said = False
        while time.monotonic() < deadline:
            try:
                started = {n[len("node_"):-len(".log")] for n in os.listdir(self.folder) if re.fullmatch(r"node_\d+\.log", n)}
                exited = {n[len("exit-"):-len(".json")] for n in os.listdir(self.folder) if re.fullmatch(r"exit-\d+\.json", n)}
            except OSError:
                break
            if {str(int(r)) for r in started} <= exited:
                break
            if not said:
                said = True
                append_note(self.job.log_file, "marinbuild: waiting for the step's processes on the lost node to stop "
                                               f"(at most {limit:g} s)")
            time.sleep(min(0.5, lease.fence_read_interval))
        self._copy_output()
        self._copy_node_logs()
        self._finish(outcome)

    def _finish(self, outcome: Outcome) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self.backend.forget(self)
        self._write_marker(outcome.kind.value, outcome.error or "", self.nodes, ended=outcome.ended)
        self.on_done(outcome)

    # -- files ----------------------------------------------------------------------------

    def _exits(self) -> list[dict[str, Any]]:
        found = []
        try:
            names = sorted(n for n in os.listdir(self.folder) if n.startswith("exit-") and n.endswith(".json"))
        except OSError:
            return []
        for name in names:
            try:
                with open(os.path.join(self.folder, name)) as f:
                    found.append(json.load(f))
            except (OSError, ValueError):
                continue
        return found

    def _copy_output(self) -> None:
        """What the job printed since the last poll, appended to the step's log."""
        path = os.path.join(self.folder, "batch.log")
        try:
            with open(path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return
        if chunk:
            self._offset += len(chunk)
            with open(self.job.log_file, "ab") as log:
                log.write(chunk)

    def _copy_node_logs(self) -> None:
        """What each node's log gained since the last copy, appended to the step's ``logs/node_NN.log``
        (``logs STEP --host``)."""
        storage = self.backend.storage
        try:
            names = sorted(n for n in os.listdir(self.folder) if re.fullmatch(r"node_\d+\.log", n))
        except OSError:
            return
        for name in names:
            target = Storage.join(self.job.output_path, "logs", name)
            try:
                with open(os.path.join(self.folder, name), "rb") as f:
                    f.seek(self._node_offsets.get(name, 0))
                    text = f.read()
            except OSError:
                continue  # a copy of what the node printed: the job's own output still reaches the step's log
            if not text:
                continue
            self._node_offsets[name] = self._node_offsets.get(name, 0) + len(text)
            local = storage.local_file(target)
            if local is not None:
                os.makedirs(os.path.dirname(local), exist_ok=True)
                with open(local, "ab") as out:
                    out.write(text)
            else:
                earlier = (storage.read_text(target) or "").encode()
                storage.write_atomic(target, earlier + text)

    def _write_marker(self, state: str, reason: str, nodes: str = "", ended: float | None = None) -> None:
        record = {"job_id": self.job_id, "state": state, "reason": reason, "nodes": nodes, "attempt": self.job.attempt,
                  "submitted_at": iso_time(self.submitted)}
        if ended is not None:
            record["ended_at"] = iso_time(ended)
        try:
            self.backend.storage.write_atomic(Storage.join(self.job.output_path, MARKER_DIR, SLURM_MARKER), json.dumps(record))
        except Exception as e:  # the status line is a convenience: its failure must not end the attempt
            append_note(self.job.log_file, f"marinbuild: could not record the Slurm job's state: {e}")


def _submission_env(env: Mapping[str, str]) -> dict[str, str]:
    """The environment sbatch exports to the job: the runner's, without stale marinbuild variables
    and without the variables of a Slurm allocation the runner itself may run in."""
    return {k: v for k, v in env.items()
            if not k.startswith(STALE_PREFIXES) and not (k.startswith("SLURM_") and k != "SLURM_CONF")}


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)

