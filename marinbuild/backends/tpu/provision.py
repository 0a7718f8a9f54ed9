"""TPU slices made on demand: one queued resource per step, re-created after a preemption.

A step asking for ``K`` slices of a type no static slice serves gets a queued resource of ``K``
nodes (multislice through the queued-resource API). :class:`SliceProvider` owns it for the
step's whole life::

    provider = SliceProvider(api, cluster, ProvisionRequest("train", out, prefix, "v4-32", 2))
    slices = provider.acquire(cancel)   # waits for ACTIVE; reuses a healthy one
    ...                                 # run the gang on slices.specs
    if provider.lost():                 # the API says a node was preempted
        provider.discard()              # deleted at once (a preempted node holds quota)
    provider.release()                  # when the step ends, however it ends

What is asked for is :mod:`~marinbuild.backends.tpu.provision_request`'s; the create and the
wait for ACTIVE are :mod:`~marinbuild.backends.tpu.activation`'s, the nodes read and judged
:mod:`~marinbuild.backends.tpu.slice_nodes`'; what it still holds is deleted at interpreter
exit too (:mod:`~marinbuild.backends.tpu.held_resources`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from marinbuild.backends.tpu.activation import ProvisionCancelled, StepApi, create_answered, wait_active
from marinbuild.backends.tpu.attempts import cut_short
from marinbuild.backends.tpu.cluster import Cluster, GcpSettings
from marinbuild.backends.tpu.held_resources import HeldResource, note_gone, note_held, still_unanswered
from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.provision_request import (
    ProvisionRequest,
    queued_resource_spec,
    resource_name,
    ssh_metadata,
)
from marinbuild.backends.tpu.readiness import Probe, ReadyProbe, ssh_login, wait_reachable
from marinbuild.backends.tpu.slice_nodes import ProvisionedSlices, judge_nodes, read_slices_patiently
from marinbuild.backends.tpu.tpu_api import NodeInfo, QueuedResourceSpec, TpuApi, TpuApiError
from marinbuild.errors import ClusterConfigError

__all__ = ["SliceProvider"]

_IMPATIENT_TRIES = 2
"""Tries of a delete while the runner stops (a Ctrl-C): one retry, after the API's first back-off."""


class SliceProvider:
    """The queued resource of one step, across its attempts."""

    def __init__(
        self,
        api: TpuApi,
        cluster: Cluster,
        request: ProvisionRequest,
        *,
        report: Callable[[str], None] = lambda line: None,
        on_phase: Callable[[str, float, str], None] = lambda phase, since, name: None,
        poll: float | None = None,
        clock: Callable[[], float] = time.time,
        probe: Probe | None = None,
        board: ZoneBoard | None = None,
    ) -> None:
        if cluster.gcp is None:
            raise ClusterConfigError(f"{cluster.source}: no [gcp] table, so no slice can be created")
        self.api = api
        self.gcp: GcpSettings = cluster.gcp
        self.cluster = cluster
        self.request = request
        self.report = report
        self.on_phase = on_phase
        """Hears ``(phase, since, queued resource)`` on each change: "waiting for capacity", "provisioning", "ready"."""
        # An emulator answers at once; Google's API is asked every few seconds.
        endpoint = self.gcp.api_endpoint or ""
        # Every 30 s on Google's API: a wait for capacity lasts minutes to hours, and fifty waiting
        # steps asking every 5 s would be 600 requests a minute from one runner.
        self.poll = poll if poll is not None else (0.1 if endpoint.startswith("http://") else 30.0)
        self.clock = clock
        self.probe = probe
        """How a booting host is asked whether it is ready (None: an SSH login, :func:`ssh_login`)."""
        self.board = board
        """The run's shared look at the zone's queued resources (None: this step asks for its own)."""
        self.current: ProvisionedSlices | None = None
        self._current_spec: QueuedResourceSpec | None = None
        self._unready = False
        """The current slice's hosts were not all ready when ``ssh_ready_timeout`` passed."""
        self.held: list[HeldResource] = []
        self.patient = True
        self.state: str | None = None
        """What the live view shows: "waiting for capacity 12 s", "provisioning 3 s", None when ready."""
        self.started: float | None = None
        self.unwell: dict[str, str] = {}
        """Nodes the last :meth:`lost` found unwell, and how (``UNHEALTHY_MAINTENANCE``, ``REPAIRING``)."""
        self._metadata = ssh_metadata(self.gcp, cluster.ssh)

    def acquire(self, cancel: threading.Event) -> ProvisionedSlices:
        """The step's slices: the current ones if still healthy, else a new queued resource.

        Raises :class:`~marinbuild.backends.tpu.activation.CapacityUnavailable` when the new one
        goes FAILED (it is deleted first) or ``provision_timeout`` passes, counted from the step's
        first request for slices; :class:`ProvisionCancelled` when ``cancel`` is set meanwhile
        (it is deleted too).
        """
        if self.started is None:
            self.started = self.clock()
        if self.current is not None:
            kept = self._kept(cancel)
            if kept is not None:
                return kept
            self.discard("lost" if self.unwell else "preempted")
        spec = queued_resource_spec(self.gcp, self.request, name=resource_name(self.request),
                                    valid_for_s=self._valid_for(), metadata=self._metadata)
        record = HeldResource(spec.name, spec.tpu_type, spec.count, self.clock())
        note_held(self._key(record), self.api, spec.name)
        self.held.append(record)
        deadline = self.started + self.gcp.provision_timeout
        operation = self._create(spec, record, cancel)
        asking = self._asking()
        try:
            wait_active(asking, spec, record.created_at, deadline, operation, cancel)
            record.active_at = self.clock()
            got = read_slices_patiently(asking, self.cluster.ssh, spec, cancel)
            self._wait_reachable(spec, got, cancel)
            self.current, self._current_spec = got, spec
        except BaseException as e:
            self._give_up(record, e, cancel)
            raise
        return self._ready(spec.name, got)

    def _kept(self, cancel: threading.Event) -> ProvisionedSlices | None:
        """The current slices, unless the API says a node of them is lost; hosts that were not
        all ready at the bound are waited for (and their keys read) again, or every retry on the
        slice is spent at once on hosts that are only slow."""
        try:
            gone = self.lost()
        except TpuApiError as e:
            if not e.transient:
                raise
            gone = ()  # the API is busy, not the slice gone: the gang finds out if it is
        if gone:
            return None
        if self._unready and self._current_spec is not None:
            got = read_slices_patiently(self._asking(), self.cluster.ssh, self._current_spec, cancel)
            self._wait_reachable(self._current_spec, got, cancel)
            return self._ready(self._current_spec.name, got)
        assert self.current is not None
        self.started = None  # no wait for hosts: the next one's provision_timeout starts afresh
        return self.current

    def _ready(self, name: str, got: ProvisionedSlices) -> ProvisionedSlices:
        self.current = got
        self.on_phase("ready", self.clock(), name)
        self.state = None
        self.started = None  # the next wait for hosts has provision_timeout of its own
        return got

    def _asking(self) -> StepApi:
        """How this step asks the API now (its ``report`` may have been replaced since it was made)."""
        return StepApi(self.api, self.gcp, self.report, self.on_phase, self._show, self.clock, self.poll, self.board)

    def _show(self, state: str) -> None:
        self.state = state

    def _create(self, spec: QueuedResourceSpec, record: HeldResource, cancel: threading.Event) -> object:
        """Ask for the queued resource: its create's operation. Refused outright, nothing was
        made, so nothing is held or to be deleted; any other trouble deletes what may have been."""
        try:
            return create_answered(self._asking(), spec, record, self._key(record), cancel,
                                   delete_late=lambda: self._delete_late(record))
        except ProvisionCancelled:
            raise  # before the API answered: its create's thread deletes what it makes
        except BaseException as e:
            if isinstance(e, TpuApiError) and not e.transient:
                self.held.remove(record)
                note_gone(self._key(record))
            else:
                self._give_up(record, e, cancel)
            raise

    def _wait_reachable(self, spec: QueuedResourceSpec, got: ProvisionedSlices, cancel: threading.Event) -> None:
        """Until ``ssh_ready_timeout`` after ACTIVE: every worker's keys reported and its login accepted."""
        assert isinstance(got.host_keys, dict)
        active = self.clock()
        shown: list[str] = []

        def on_probe(probe: ReadyProbe) -> None:
            self.state = f"{probe.text} ({self.clock() - active:.0f} s)"
            if not shown or shown[-1] != probe.text:
                shown.append(probe.text)
                self.on_phase(probe.text, active, spec.name)
                if probe.reachable < probe.total:
                    self.report(f"queued resource {spec.name} is ACTIVE; {probe.text} "
                                f"({probe.waiting_on[0] if probe.waiting_on else ''})")

        emulated = (self.gcp.api_endpoint or "").startswith("http://")
        last = wait_reachable(self.api, got.specs, got.host_keys, active + self.gcp.ssh_ready_timeout, cancel,
                              on_probe=on_probe, probe=self.probe or ssh_login, poll=0.2 if emulated else 5.0,
                              max_parallel=self.cluster.max_parallel, clock=self.clock)
        if cancel.is_set():
            raise ProvisionCancelled(f"cancelled while the hosts of queued resource {spec.name} were booting")
        self._unready = last.reachable < last.total
        if last.reachable < last.total:
            self.report(f"queued resource {spec.name}: {last.text} after ssh_ready_timeout "
                        f"({self.gcp.ssh_ready_timeout:g} s); the attempt goes on and judges them: "
                        + "; ".join(last.waiting_on[:3]))
            if self.gcp.os_login and any("authentication" in why for why in last.waiting_on):
                # marinbuild sets no ssh-keys under OS Login: the account's own key must be registered.
                key = f"{self.cluster.ssh.identity_file}.pub" if self.cluster.ssh.identity_file else "KEY.pub"
                self.report(f"os_login = true: register the key with `gcloud compute os-login ssh-keys add "
                            f"--key-file {key}` and set [ssh] user to the account's POSIX name "
                            "(`gcloud compute os-login describe-profile`)")

    def _valid_for(self) -> float:
        """What is left of ``provision_timeout`` (at least a minute): the server drops the request
        then, so nothing a killed runner queued can turn ACTIVE, and bill, after it."""
        assert self.started is not None
        left = self.started + self.gcp.provision_timeout - self.clock()
        return max(60.0, left)

    def _give_up(self, record: HeldResource, e: BaseException, cancel: threading.Event) -> None:
        # What went wrong first decides the attempt (a cancel stays a cancel); a delete
        # that fails too is reported and tried again when the step ends. A runner's Ctrl-C
        # reaches its attempts as ``cancel`` (its main thread owns the signals); what is no
        # error at all (an interrupt or an exit, where a caller acquires on its main thread)
        # stops the attempt as a cancel does.
        cancelled = isinstance(e, ProvisionCancelled) or not isinstance(e, Exception)
        if cancelled and cut_short(cancel):
            # A runner stopping waits only so long for its steps: this delete and the step end's
            # are tried twice, and the exit handler tries what is left with the usual patience.
            self.patient = False
        self._delete(record, "cancelled" if cancelled else "not provisioned",
                     tries=None if self.patient else _IMPATIENT_TRIES)

    def _delete_late(self, record: HeldResource) -> None:
        """A create answered after its step was cancelled: what it made goes at once."""
        self._delete(record, "cancelled")

    def _key(self, record: HeldResource) -> str:
        return f"{id(self)}:{record.name}"

    def lost(self, *, shared: bool = False) -> tuple[str, ...]:
        """Nodes of the current queued resource the API says are gone (preempted, deleted) or
        unwell (a health other than HEALTHY, REPAIRING, ...: named in :attr:`unwell` too).

        ``shared``: read from the run's lists of the zone (one per interval for every running
        step, as a watch while the gang runs wants), asking by name only for what they lack;
        otherwise asked now, by name (before a slice is kept for the next attempt)."""
        self.unwell = {}
        if self.current is None:
            return ()
        current = self.current
        record = next((r for r in self.held if r.name == current.queued_resource), None)
        since = record.active_at or record.created_at if record is not None else time.time()
        board = self.board if shared else None
        queued = current.queued_resource
        info = self._asking().look(queued, since) if board is not None else self.api.get(queued)

        def node_of(name: str) -> NodeInfo | None:
            return (board.node(name, since=since) if board is not None else None) or self.api.node(name)

        health = judge_nodes(info, current.specs, node_of)
        self.unwell = dict(health.unwell)
        return health.lost

    def discard(self, why: str = "preempted") -> None:
        """Delete the current queued resource now (``force``): the next acquire makes a new one."""
        if self.current is not None:
            record = next(r for r in self.held if r.name == self.current.queued_resource)
            self.current = None
            self._delete(record, why)

    def release(self, why: str = "step ended", patient: bool | None = None) -> None:
        """Delete everything still held (the attempt or the step is over), a failed delete again.

        Not ``patient`` (a cancelled step, whose stopping runner waits only so long for it):
        each delete is tried twice, half a second apart, not five times over eight seconds;
        what is still held then is left to the exit handler, which is patient. None: as
        patient as the last release (the step's end follows its last attempt's).
        """
        if patient is None:
            patient = self.patient
        self.patient = patient
        self.current = None
        unanswered = still_unanswered(self._key(r) for r in self.held)
        for r in self.held:
            # One whose create is still unanswered is not there to delete yet: its create's
            # thread deletes it once answered (the exit handler names it if never).
            if r.deleted_at is None and self._key(r) not in unanswered:
                self._delete(r, why, tries=None if patient else _IMPATIENT_TRIES)

    def _delete(self, record: HeldResource, why: str, tries: int | None = None) -> bool:
        """Delete one queued resource; whether it is gone.

        A delete the API keeps refusing leaves the record held, with its ``delete_error``: it
        is reported, its hours go on counting, the next :meth:`release` and the exit handler
        try again, and ``marinbuild tpu down`` (or the next run) finds it by its labels. Never
        raised: a slice that could not be deleted must not turn the step's outcome into an error.
        """
        try:
            self.api.delete(record.name, force=True, tries=tries)
        except TpuApiError as e:
            record.delete_error = str(e)
            record.still_held_at = self.clock()
            self.report(f"could not delete queued resource {record.name} ({why}): {str(e).rstrip('.')}; "
                        "it is tried again when the step ends and when this run exits "
                        "(`marinbuild tpu down` deletes it too)")
            return False
        record.deleted_at = self.clock()
        record.why_deleted = why
        record.delete_error = None
        note_gone(self._key(record))
        return True

    def ledger(self, since: int = 0) -> list[dict[str, object]]:
        """The queued resources held so far (from the ``since``-th on), for ``attempts.json``."""
        return [r.to_json() for r in self.held[since:]]
