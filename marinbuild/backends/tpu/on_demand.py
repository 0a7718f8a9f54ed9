"""Attempts of TPU steps on slices created for them: acquire hosts, run the gang, delete the slices.

Each attempt of a step whose allocation names slices to be created
(:mod:`marinbuild.backends.tpu.provision_plan`) runs as:

1. create a queued resource of K nodes and wait for ACTIVE (:class:`SliceProvider`); a FAILED
   one (no capacity) ends the attempt as ``PROVISIONING``, which the retry loop retries until
   ``provision_timeout``;
2. read each node's endpoints (worker order) and host keys; every ``MARINBUILD_*`` and
   ``MEGASCALE_*`` value is computed from these hosts (:meth:`TpuStep.attempt`);
3. run the gang over SSH, the TPU API asked meanwhile whether a node was preempted: if so the
   gang is torn down at once and the attempt is a ``PREEMPTED`` one;
4. delete the queued resource (``force``), whatever happened — success, failure, preemption,
   cancel — and record in the attempt's ledger entry when it was created and deleted.

The next attempt, if the retry loop starts one, creates a new queued resource on new hosts.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

from marinbuild.backends.base import Cause, Job, Outcome
from marinbuild.backends.tpu.activation import CapacityUnavailable, ProvisionCancelled
from marinbuild.backends.tpu.attempts import TpuAttempt, TpuStep, cut_short
from marinbuild.backends.tpu.cluster import Cluster
from marinbuild.backends.tpu.held_resources import HeldResource
from marinbuild.backends.tpu.leftovers import delete_unheld, left_for
from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.provision import SliceProvider
from marinbuild.backends.tpu.provision_plan import is_created_slice
from marinbuild.backends.tpu.provision_request import ProvisionRequest
from marinbuild.backends.tpu.readiness import Probe
from marinbuild.backends.tpu.slice_nodes import ProvisionedSlices
from marinbuild.backends.tpu.ssh import HostTarget, resolve_target
from marinbuild.backends.tpu.tpu_api import TpuApi, TpuApiError
from marinbuild.store.provisioning_note import write_provisioning_note
from marinbuild.store.step_logs import append_note

__all__ = ["PROVISIONED_EXTRA", "QUEUED_RESOURCE_EXTRA", "CreatedSlices", "uses_created_slices"]

PROVISIONED_EXTRA = "provisioned"
"""Ledger field of an attempt on created slices: the queued resource(s) it made, created and deleted times."""
QUEUED_RESOURCE_EXTRA = "queued_resource"
"""Ledger field of an attempt that ran on created slices: the queued resource it ran on (attempts
naming the same one shared a slice)."""
_WATCH_S = 0.2  # how often the cancel flag is looked at while the gang runs


def uses_created_slices(slices: tuple[str, ...]) -> bool:
    """Whether an allocation names slices to be created (all of them are, or none)."""
    return bool(slices) and all(is_created_slice(s) for s in slices)


class CreatedSlices:
    """Runs the attempts of steps whose slices are created on demand (``[gcp]``)."""

    def __init__(self, cluster: Cluster, *, prefix: str, console: Callable[[str], None],
                 probe: Probe | None = None) -> None:
        self.cluster = cluster
        self.probe = probe
        """How a booting host is asked whether it is ready (None: an SSH login)."""
        self.prefix = prefix
        self.console = console
        self._api: TpuApi | None = None
        self._providers: dict[str, SliceProvider] = {}
        self._released: dict[str, list[HeldResource]] = {}  # at the step's end, for amend_ledger
        self._lock = threading.Lock()
        endpoint = (cluster.gcp.api_endpoint or "") if cluster.gcp is not None else ""
        # Every step waiting for ACTIVE reads one list of the zone's queued resources per poll.
        self._board: ZoneBoard | None = None
        # How often the API is asked whether a node was preempted or fell ill while the gang runs
        # (a teardown on an SSH drop asks at once, so this bounds only what SSH does not see).
        self.preemption_poll = 1.0 if endpoint.startswith("http://") else 45.0

    def api(self) -> TpuApi:
        with self._lock:
            if self._api is None:
                assert self.cluster.gcp is not None
                self._api = TpuApi(self.cluster.gcp)
            return self._api

    def board(self) -> ZoneBoard:
        api = self.api()  # before the lock, which api() takes too
        with self._lock:
            if self._board is None:
                endpoint = (self.cluster.gcp.api_endpoint or "") if self.cluster.gcp is not None else ""
                self._board = ZoneBoard(api, interval=0.1 if endpoint.startswith("http://") else 30.0)
            return self._board

    def provider(self, job: Job, tpu_type: str, count: int) -> SliceProvider:
        """The step's provider, made at its first attempt (it keeps the provision_timeout clock)."""
        with self._lock:
            found = self._providers.get(job.output_path)
        if found is None:
            request = ProvisionRequest(job.name, job.output_path, self.prefix, tpu_type, count)
            log = job.log_file

            def report(line: str) -> None:
                # The step's log: shown live as the step's output (as the retry loop's notes are)
                # and kept for `marinbuild logs`.
                append_note(log, f"marinbuild: {line}")

            out = job.output_path

            def phase(name: str, since: float, queued_resource: str) -> None:
                write_provisioning_note(out, name, since, queued_resource)  # for `marinbuild status`

            made = SliceProvider(self.api(), self.cluster, request, report=report, on_phase=phase, probe=self.probe,
                                 board=self.board())
            with self._lock:
                found = self._providers.setdefault(job.output_path, made)
            if found is made:
                self._delete_left(job.output_path, report)
        return found

    def _delete_left(self, output_path: str, report: Callable[[str], None]) -> None:
        """Before the step's first attempt here: delete what an earlier holder of its lease made.

        The run's start deletes leftovers no live runner holds; one this runner took over after
        waiting for the lease (its holder SIGKILLed meanwhile) was held then. Trouble with the API
        is reported, never the step's failure: ``tpu down`` and the next run find it too.
        """
        try:
            delete_unheld(self.api(), left_for(self.api(), self.prefix, output_path), say=report)
        except TpuApiError as e:
            report(f"warning: queued resources an earlier runner left for this step not checked: {e}")

    def run_attempt(self, step: TpuStep, job: Job, cancel: threading.Event) -> Outcome:
        """One attempt: created slices, the gang on them, the slices deleted."""
        started = time.time()
        provider = self.provider(job, job.env.get("MARINBUILD_TPU_TYPE", ""), len(step.job.slices))
        first = len(provider.held)
        try:
            got = provider.acquire(cancel)
        except (ProvisionCancelled, CapacityUnavailable, TpuApiError) as e:
            return self._not_provisioned(e, started, self._details(provider, first))
        outcome = self._run_gang(step, job, cancel, provider, got)
        details = {**outcome.details, **self._details(provider, first), QUEUED_RESOURCE_EXTRA: got.queued_resource}
        return dataclasses.replace(outcome, details=details)

    def _not_provisioned(self, e: ProvisionCancelled | CapacityUnavailable | TpuApiError, started: float,
                         details: dict[str, object]) -> Outcome:
        """The attempt that got no slices: cancelled meanwhile, no capacity, or a request the API refused."""
        if isinstance(e, ProvisionCancelled):
            return Outcome(ok=False, started=started, ended=time.time(), error=str(e), cancelled=True,
                           cause=Cause.CANCELLED, details=details)
        if isinstance(e, CapacityUnavailable):
            return Outcome(ok=False, started=started, ended=time.time(), error=str(e), cause=Cause.PROVISIONING,
                           fatal=e.timed_out or e.final, details=details)
        # A request the API refused (a permission, a field) is refused again: final.
        return Outcome(ok=False, started=started, ended=time.time(), error=str(e), cause=Cause.INFRA,
                       fatal=e.final, details=details)

    def _run_gang(self, step: TpuStep, job: Job, cancel: threading.Event, provider: SliceProvider,
                  got: ProvisionedSlices) -> Outcome:
        """The gang on ``got`` with the TPU API watched; then the slices kept for a retry, or deleted."""
        ready_timeout = self.cluster.gcp.ssh_ready_timeout if self.cluster.gcp is not None else None
        watch = _GangWatch(provider, got, cancel, poll=self.preemption_poll, ready_timeout=ready_timeout,
                           name=f"tpu-api-{job.name}")
        found = watch.preempted  # what the watch found, as far as it bears on the outcome
        keep = False
        try:
            attempt = step.attempt(job.attempt, watch.gang_cancel, got.specs, _gang_targets(got), verdict=watch.verdict)
            outcome = step.outcome_of(attempt, got.specs)
            found = watch.settle(outcome)
            outcome = self._judged(outcome, found, provider, job, got)
            keep = self._keep(outcome, found, cancel, provider)
        finally:
            watch.done.set()
            if keep:
                provider.report(f"queued resource {got.queued_resource} is ACTIVE and healthy: "
                                "kept for a retry of the step (deleted when the step ends)")
            else:
                # A stopping runner waits only so long for its steps; a wall time that ran out
                # stops this step alone, whose slices get the usual patience.
                why = "lost" if found and provider.unwell else "preempted" if found else "attempt ended"
                provider.release(why, patient=not cut_short(cancel))
        return outcome

    def _judged(self, outcome: Outcome, found: list[tuple[str, ...]], provider: SliceProvider, job: Job,
                got: ProvisionedSlices) -> Outcome:
        """The gang's outcome, unless the watch found nodes lost (INFRA) or preempted (PREEMPTED)."""
        if not found:
            return outcome
        unwell = _unwell_nodes(provider, found[0])
        if unwell:
            outcome = dataclasses.replace(
                outcome, ok=False, cancelled=False, cause=Cause.INFRA, fatal=False,
                error=f"attempt {job.attempt} INFRA: the TPU API reports node(s) {unwell}: slice lost",
            )
            self.console(f"[{job.name}] node(s) {unwell}: slice lost, deleting queued resource {got.queued_resource}")
            return outcome
        nodes = ", ".join(found[0])
        outcome = dataclasses.replace(
            outcome, ok=False, cancelled=False, cause=Cause.PREEMPTED, fatal=False,
            error=f"attempt {job.attempt} PREEMPTED: the TPU API reports node(s) {nodes} preempted",
        )
        self.console(f"[{job.name}] node(s) {nodes} preempted: deleting queued resource {got.queued_resource}")
        return outcome

    def _keep(self, outcome: Outcome, preempted: list[tuple[str, ...]], cancel: threading.Event,
              provider: SliceProvider) -> bool:
        """Whether the next attempt may run on this attempt's slice: it failed, hung or met SSH
        trouble (a new queued resource is a new wait for capacity, of hours) and the API says
        every node is ACTIVE and healthy. Success, a cancel or a fatal end are the step's last."""
        if outcome.ok or preempted or cancel.is_set() or outcome.fatal:
            return False
        if outcome.cause not in (Cause.FAILED, Cause.HANG, Cause.INFRA):
            return False
        return not _lost_nodes(provider)

    def _details(self, provider: SliceProvider, first: int) -> dict[str, object]:
        return {PROVISIONED_EXTRA: provider.ledger(first)}

    def step_ended(self, job: Job) -> None:
        """The step's last attempt is over: whatever it still holds is deleted."""
        with self._lock:
            provider = self._providers.pop(job.output_path, None)
        if provider is not None:
            provider.release()  # as patient as its last attempt's: a cancelled step must report soon
            with self._lock:
                self._released[job.output_path] = provider.held

    def waited(self, job: Job) -> float:
        """Seconds the step's queued resources waited for capacity (creation to ACTIVE, or to
        their delete when they never got there), once the step ended."""
        with self._lock:
            held = list(self._released.get(job.output_path, []))
        return sum(((r.active_at or r.deleted_at or r.created_at) - r.created_at) for r in held)

    def amend_ledger(self, job: Job, entries: list[dict[str, Any]]) -> None:
        """Give the attempts' entries the deletes only the step's end achieved (their delete had failed).

        The entry keeps its ``delete_error``: the queued resource was held, and cost, until then.
        One the step's end could not delete either gets ``still_held_at`` (then), which its hours
        are counted up to: the exit handler's delete comes after the step's record is written.
        """
        with self._lock:
            held = {r.name: r for r in self._released.pop(job.output_path, [])}
        for entry in entries:
            provisioned = entry.get(PROVISIONED_EXTRA)
            for p in provisioned if isinstance(provisioned, list) else ():
                record = held.get(str(p.get("queued_resource"))) if isinstance(p, dict) else None
                if record is None or p.get("deleted_at") is not None:
                    continue
                if record.deleted_at is not None:
                    p["deleted_at"] = round(record.deleted_at, 3)
                    p["why_deleted"] = record.why_deleted
                    p.pop("still_held_at", None)
                elif record.still_held_at is not None:
                    p["still_held_at"] = round(record.still_held_at, 3)
                    p["delete_error"] = record.delete_error


def _gang_targets(got: ProvisionedSlices) -> list[list[HostTarget]]:
    """Each slice's hosts as SSH targets, trusting the host keys the TPU API reported for them."""
    return [[dataclasses.replace(resolve_target(h, s.ssh), trusted_host_keys=got.host_keys.get(h, ())) for h in s.hosts]
            for s in got.specs]


def _unwell_nodes(provider: SliceProvider, nodes: tuple[str, ...]) -> str:
    """``NAME UNHEALTHY_MAINTENANCE, ...`` for the lost nodes the API found unwell, not gone."""
    return ", ".join(f"{n} {provider.unwell[n]}" for n in nodes if n in provider.unwell)


def _lost_nodes(provider: SliceProvider, *, shared: bool = False) -> tuple[str, ...]:
    try:
        return provider.lost(shared=shared)
    except TpuApiError:
        return ()


class _GangWatch:
    """The TPU API watched while one attempt's gang runs: a cancel passed on, and the gang torn
    down as soon as the API says a node is gone; then what the watch found judges the attempt."""

    def __init__(self, provider: SliceProvider, got: ProvisionedSlices, cancel: threading.Event, *, poll: float,
                 ready_timeout: float | None, name: str) -> None:
        self.provider, self.got, self.cancel = provider, got, cancel
        self.poll = poll
        """How often the API is asked whether a node was preempted or fell ill."""
        self.ready_timeout = ready_timeout
        self.gang_cancel = threading.Event()
        self.done = threading.Event()
        self.preempted: list[tuple[str, ...]] = []
        self.thread = threading.Thread(target=self._watch, name=name, daemon=True)
        self.thread.start()

    def _watch(self) -> None:
        # The cancel is passed on by a thread of its own: a poll of a slow API must not hold up a stop.
        threading.Thread(target=_pass_on, args=(self.cancel, self.gang_cancel, self.done), daemon=True,
                         name=f"{threading.current_thread().name}-cancel").start()
        next_ask = time.monotonic() + self.poll
        while not self.done.wait(_WATCH_S):
            if self.cancel.is_set():
                return
            if time.monotonic() >= next_ask:
                # The running steps' watches share the run's lists of the zone (one per interval).
                lost = _lost_nodes(self.provider, shared=True)
                if lost:
                    self.preempted.append(lost)
                    self.gang_cancel.set()
                    return
                next_ask = time.monotonic() + self.poll

    def verdict(self, attempt: TpuAttempt) -> TpuAttempt:
        """The attempt as the API's view of its nodes has it.

        Decided before the attempt's line is printed, so that a gang the watch tore down for a
        preemption is not shown as CANCELLED (or INFRA) first.
        """
        self.done.set()
        if self.cancel.is_set() or attempt.classification is Cause.SUCCESS:
            # Nothing the watch finds changes this: a poll it has in flight (an API slow or
            # answering "try again") is not waited for, so a stop or a success reports at once.
            return attempt
        self.thread.join()
        got = self.got
        unkeyed = [h for s in got.specs for h in s.hosts if not got.host_keys.get(h) and h in attempt.message]
        if attempt.fatal and unkeyed and "unknown host key" in attempt.message:
            # The API had not reported the key when ssh_ready_timeout passed: the guest agent
            # is slow, not the key wrong. The next attempt on the slice waits for it again.
            why = (f"the TPU API reported no host key for {', '.join(unkeyed[:3])} within "
                   f"ssh_ready_timeout ({self.ready_timeout:g} s)" if self.ready_timeout is not None else "")
            return dataclasses.replace(attempt, classification=Cause.INFRA, fatal=False, message=why)
        if not self.preempted:
            lost = _lost_nodes(self.provider)
            if lost:
                self.preempted.append(lost)
        if not self.preempted:
            return attempt
        unwell = _unwell_nodes(self.provider, self.preempted[0])
        if unwell:
            # An unhealthy or repairing slice is lost, not preempted: a new one, on the infra
            # budget (counted apart from preemptions).
            why = f"the TPU API reports node(s) {unwell}: slice lost"
        else:
            why = f"the TPU API reports node(s) {', '.join(self.preempted[0])} preempted"
        return dataclasses.replace(attempt, classification=Cause.INFRA if unwell else Cause.PREEMPTED, fatal=False,
                                   message=f"{why}; {attempt.message}" if attempt.message else why)

    def settle(self, outcome: Outcome) -> list[tuple[str, ...]]:
        """The watch is over: what it found, as far as it bears on ``outcome`` (nothing once
        cancelled or succeeded, where its poll in flight is not waited for)."""
        self.done.set()
        settled = self.cancel.is_set() or outcome.ok
        if not settled:
            self.thread.join()
        return [] if settled else self.preempted


def _pass_on(cancel: threading.Event, gang_cancel: threading.Event, done: threading.Event) -> None:
    """Set ``gang_cancel`` once ``cancel`` is set, until ``done``."""
    while not done.wait(_WATCH_S):
        if cancel.is_set():
            gang_cancel.set()
            return
