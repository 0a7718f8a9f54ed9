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

Every node carries labels naming marinbuild, the prefix, the step and its identity, and its
output path in its description, so that leftovers of a killed runner can be found and
deleted (:mod:`marinbuild.backends.tpu.leftovers`). Every queued resource this process
created and has not deleted is deleted at interpreter exit too (Ctrl-C, SIGTERM mapped to
KeyboardInterrupt); only SIGKILL leaves one behind.
"""

from __future__ import annotations

import atexit
import getpass
import hashlib
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from marinbuild.backends.tpu.attempts import cut_short
from marinbuild.backends.tpu.cluster import Cluster, GcpSettings, SliceSpec, SshSettings
from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.readiness import Probe, ReadyProbe, ssh_login, wait_reachable
from marinbuild.backends.tpu.tpu_api import (
    LABEL_PREFIX,
    NodeInfo,
    QueuedResourceInfo,
    QueuedResourceSpec,
    TpuApi,
    TpuApiError,
    label_value,
)
from marinbuild.errors import ClusterConfigError, MarinbuildError
from marinbuild.tpu_types import tpu_topology

__all__ = [
    "DESCRIPTION_PREFIX",
    "CapacityUnavailable",
    "HeldResource",
    "ProvisionCancelled",
    "ProvisionRequest",
    "ProvisionedSlices",
    "SliceProvider",
    "node_labels",
    "prefix_id",
    "public_key_line",
    "real_location",
]

DESCRIPTION_PREFIX = "marinbuild output "
"""A created node's description: this, then the step's output path (where its lease lives)."""
_GONE_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN", "HIDING"})
_UNWELL_STATES = frozenset({"REPAIRING", "UNKNOWN", "RESTARTING", "REIMAGING"})
"""Node states in which the slice cannot be trusted with the step: it is lost (re-provisioned)."""
_UNWELL_HEALTH = frozenset({"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"})
_FAILED_STATES = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})
_FINAL_CODES = {3: "invalid configuration", 5: "not found", 7: "permission denied", 9: "failed precondition",
                11: "out of range", 12: "unimplemented", 16: "not authenticated"}
"""``google.rpc.Code`` values of a FAILED queued resource that no retry changes."""
_RUNTIME_PORT = 8470  # the port Google's API reports for TPU workers (the runtime's)
_QUOTA = re.compile(r"[Qq]uota '?([A-Za-z0-9_.-]+)'? (?:exhausted|exceeded)")
_REPORT_EVERY_S = 30.0  # a line while waiting, even when the state stays the same
_WAITING = {"CREATING": "waiting for capacity", "ACCEPTED": "waiting for capacity",
            "WAITING_FOR_RESOURCES": "waiting for capacity", "PROVISIONING": "provisioning"}


class CapacityUnavailable(MarinbuildError):
    """The queued resource went FAILED (no capacity) or did not turn ACTIVE within ``provision_timeout``.

    ``final``: it failed for a reason no wait for capacity helps (a quota exhausted, an invalid
    configuration): the step fails in one line instead of retrying until ``provision_timeout``.
    """

    def __init__(self, message: str, *, timed_out: bool = False, final: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.final = final


def failure_of(name: str, state: str, code: int, error: str | None) -> CapacityUnavailable:
    """A FAILED queued resource, judged by its error code and message.

    >>> failure_of("q", "FAILED", 8, "Quota 'TPUV4sPod' exhausted. Limit 32").final
    True
    >>> failure_of("q", "FAILED", 8, "There is no more capacity in the zone").final
    False
    """
    why = error or f"queued resource is {state}"
    quota = _QUOTA.search(why)
    if quota is not None:
        return CapacityUnavailable(f"queued resource {name} {state}: quota {quota.group(1)} exhausted ({why}); "
                                   "ask for more quota or a smaller slice", final=True)
    if code in _FINAL_CODES:
        return CapacityUnavailable(f"queued resource {name} {state}: {_FINAL_CODES[code]}: {why}", final=True)
    if code == 4:  # DEADLINE_EXCEEDED: its valid-until bound (provision_timeout) passed on the server
        return CapacityUnavailable(f"queued resource {name} {state}: {why}", timed_out=True)
    return CapacityUnavailable(f"queued resource {name} {state}: {why}")


class ProvisionCancelled(MarinbuildError):
    """The step was cancelled while its slices were being provisioned."""


@dataclass(frozen=True)
class ProvisionRequest:
    """What one step needs made: ``count`` slices of ``tpu_type`` for the step at ``output_path``."""

    step: str
    output_path: str
    prefix: str
    tpu_type: str
    count: int

    @property
    def identity(self) -> str:
        """The hash that ends the output folder's name (``NAME-HASH``)."""
        return os.path.basename(self.output_path.rstrip("/")).rsplit("-", 1)[-1]


@dataclass(frozen=True)
class ProvisionedSlices:
    """One ACTIVE queued resource: a slice spec per node (slice 0 first) and their host keys."""

    queued_resource: str
    specs: tuple[SliceSpec, ...]
    host_keys: Mapping[str, tuple[str, ...]]
    """SSH address -> the ``TYPE BASE64`` keys guest attributes report (absent: none reported)."""


@dataclass
class HeldResource:
    """A queued resource this step held: for the ledger's provisioned hours."""

    name: str
    tpu_type: str
    count: int
    created_at: float
    active_at: float | None = None
    deleted_at: float | None = None
    """When the API accepted its delete (DELETING counts as deleted: nothing more is billed)."""
    why_deleted: str | None = None
    delete_error: str | None = None
    """Why the last try to delete it failed, while it is still held (tried again later)."""
    still_held_at: float | None = None
    """When a try to delete it last failed: it was held at least until then.

    A delete only the exit handler achieves is never written down (the step's record is
    already out), so this is what its hours are counted up to.
    """

    def to_json(self) -> dict[str, object]:
        record: dict[str, object] = {
            "queued_resource": self.name, "tpu_type": self.tpu_type, "slices": self.count,
            "created_at": round(self.created_at, 3),
            "active_at": None if self.active_at is None else round(self.active_at, 3),
            "waiting_s": round((self.active_at or self.deleted_at or self.created_at) - self.created_at, 3),
            "deleted_at": None if self.deleted_at is None else round(self.deleted_at, 3),
            "why_deleted": self.why_deleted,
        }
        if self.delete_error is not None:
            record["delete_error"] = self.delete_error
        if self.deleted_at is None and self.still_held_at is not None:
            record["still_held_at"] = round(self.still_held_at, 3)
        return record


def node_labels(gcp: GcpSettings, request: ProvisionRequest) -> dict[str, str]:
    """The labels on every node of a step's queued resource (the cluster file's own too).

    >>> req = ProvisionRequest("Sweep/A", "/o/Sweep/A-3f2a", "/o", "v4-8", 1)
    >>> sorted(node_labels(GcpSettings("p", "z", "r"), req).items())  # doctest: +NORMALIZE_WHITESPACE +ELLIPSIS
    [('marinbuild', 'managed'), ('marinbuild-identity', '3f2a'), ('marinbuild-prefix', '-o'),
     ('marinbuild-prefix-id', '...'), ('marinbuild-step', 'sweep-a')]
    """
    return {
        **dict(gcp.labels),
        LABEL_PREFIX: "managed",
        f"{LABEL_PREFIX}-prefix": label_value(request.prefix),
        f"{LABEL_PREFIX}-prefix-id": prefix_id(request.prefix),
        f"{LABEL_PREFIX}-step": label_value(request.step),
        f"{LABEL_PREFIX}-identity": label_value(request.identity),
    }


def prefix_id(prefix: str) -> str:
    """A label value naming ``prefix`` exactly (the readable ``marinbuild-prefix`` label is cut at 63).

    A local prefix is named by its real path: a run through a symlinked spelling of the folder
    and ``tpu list`` through another find the same queued resources.

    >>> prefix_id("gs://b/exp") == prefix_id("gs://b/exp"), len(prefix_id("/x"))
    (True, 16)
    """
    return hashlib.sha256(real_location(prefix).encode()).hexdigest()[:16]


def real_location(path: str) -> str:
    """``path`` with a local one resolved to its real path (symlinks, ``..``); a URL as it is."""
    if "://" in path:
        return path.rstrip("/")
    return os.path.realpath(os.path.expanduser(path))


def public_key_line(ssh: SshSettings) -> str:
    """``TYPE BASE64`` of the ``[ssh] identity_file``'s public half (its ``.pub``, else derived)."""
    if not ssh.identity_file:
        raise ClusterConfigError(
            "[gcp] needs [ssh] identity_file: its public half goes into created nodes' ssh-keys "
            "metadata (or set [gcp] os_login = true)"
        )
    path = os.path.expanduser(ssh.identity_file)
    try:
        with open(path + ".pub") as f:
            parts = f.read().split()
        if len(parts) >= 2:
            return f"{parts[0]} {parts[1]}"
    except OSError:
        pass
    import paramiko

    try:
        key = paramiko.PKey.from_path(path)
    except (OSError, paramiko.SSHException) as e:
        raise ClusterConfigError(f"[ssh] identity_file {path!r}: cannot read its public key: {e}") from None
    return f"{key.get_name()} {key.get_base64()}"


_IMPATIENT_TRIES = 2
"""Tries of a delete while the runner stops (a Ctrl-C): one retry, after the API's first back-off."""

_CREATE_CHECK_S = 0.1
"""How often a step waiting for the API to answer its create looks whether it was cancelled."""

_LIVE: dict[str, tuple[TpuApi, str]] = {}
_UNANSWERED: set[str] = set()
"""Keys of ``_LIVE`` whose create the API has not answered yet."""
_LIVE_LOCK = threading.Lock()


def _delete_live() -> None:
    """At exit: delete every queued resource this process made and still holds.

    One whose create the API has not answered yet may be made after this process is gone, where
    no delete can reach it: it is named on stderr, for ``marinbuild tpu down`` (or the next run).
    """
    with _LIVE_LOCK:
        held = list(_LIVE.items())
        _LIVE.clear()
        unanswered = set(_UNANSWERED)
    for key, (api, name) in held:
        try:
            gone = api.delete(name, force=True)
        except Exception:
            gone = False
        if key in unanswered and not gone:
            sys.stderr.write(f"marinbuild: queued resource {name} was asked for, and the TPU API had not answered "
                             "when this run stopped; if it is made, `marinbuild tpu down` (or the next run) "
                             "deletes it\n")


atexit.register(_delete_live)


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
        self._operations: dict[str, object] = {}
        self.unwell: dict[str, str] = {}
        """Nodes the last :meth:`lost` found unwell, and how (``UNHEALTHY_MAINTENANCE``, ``REPAIRING``)."""
        """Each queued resource's create operation, whose error says why one never appeared."""
        self._metadata = {} if self.gcp.os_login else {"ssh-keys": f"{self._user()}:{public_key_line(cluster.ssh)}"}

    def _user(self) -> str:
        return self.cluster.ssh.user or getpass.getuser()

    def _name(self) -> str:
        step = label_value(self.request.step).replace("_", "-").strip("-")[:24] or "step"
        return f"mb-{step}-{label_value(self.request.identity)[:8]}-{secrets.token_hex(3)}".replace("--", "-")

    def acquire(self, cancel: threading.Event) -> ProvisionedSlices:
        """The step's slices: the current ones if still healthy, else a new queued resource.

        Raises :class:`CapacityUnavailable` when the new one goes FAILED (it is deleted first)
        or ``provision_timeout`` passes, counted from the step's first request for slices;
        :class:`ProvisionCancelled` when ``cancel`` is set meanwhile (it is deleted too).
        """
        if self.started is None:
            self.started = self.clock()
        if self.current is not None:
            try:
                gone = self.lost()
            except TpuApiError as e:
                if not e.transient:
                    raise
                gone = ()  # the API is busy, not the slice gone: the gang finds out if it is
            if not gone:
                if self._unready and self._current_spec is not None:
                    # Its hosts were not all ready at the bound: wait for them (and read their keys)
                    # again, or every retry on the slice is spent at once on hosts that are only slow.
                    got = self._read_nodes_patiently(self._current_spec, cancel)
                    self._wait_reachable(self._current_spec, got, cancel)
                    self.current = got
                    self.on_phase("ready", self.clock(), self._current_spec.name)
                    self.state = None
                self.started = None  # no wait for hosts: the next one's provision_timeout starts afresh
                return self.current
            self.discard("lost" if self.unwell else "preempted")
        spec = QueuedResourceSpec(
            name=self._name(),
            tpu_type=self.request.tpu_type,
            count=self.request.count,
            runtime_version=self.gcp.runtime_for(self.request.tpu_type),
            spot=self.gcp.tier == "spot",
            tier=self.gcp.tier,
            reservation=self.gcp.reservation,
            valid_for_s=self._valid_for(),
            labels=node_labels(self.gcp, self.request),
            metadata=self._metadata,
            description=DESCRIPTION_PREFIX + self.request.output_path,
            network=self.gcp.network,
            subnetwork=self.gcp.subnetwork,
            service_account=self.gcp.service_account,
            tags=self.gcp.tags,
            external_ips=self.gcp.external_ips,
        )
        record = HeldResource(spec.name, spec.tpu_type, spec.count, self.clock())
        with _LIVE_LOCK:
            _LIVE[self._key(record)] = (self.api, spec.name)
        self.held.append(record)
        try:
            if not self._create(spec, record, cancel):
                # Not deleted now: a delete before the create is acted on finds nothing.
                raise ProvisionCancelled(f"cancelled while the TPU API had not answered the create of {spec.name}")
        except ProvisionCancelled:
            raise
        except TpuApiError as e:
            if not e.transient:
                # Refused outright: nothing was made, so nothing is held or to be deleted.
                self._forget(record)
                raise
            self._give_up(record, e, cancel)
            raise
        except BaseException as e:
            self._give_up(record, e, cancel)
            raise
        try:
            self._wait_active(spec, record, cancel)
            record.active_at = self.clock()
            got = self._read_nodes_patiently(spec, cancel)
            self._wait_reachable(spec, got, cancel)
            self.current, self._current_spec = got, spec
        except BaseException as e:
            self._give_up(record, e, cancel)
            raise
        self.on_phase("ready", self.clock(), spec.name)
        self.state = None
        self.started = None  # the next wait for hosts has provision_timeout of its own
        return self.current

    def _forget(self, record: HeldResource) -> None:
        self.held.remove(record)
        with _LIVE_LOCK:
            _LIVE.pop(self._key(record), None)

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
        # that fails too is reported and tried again when the step ends.
        cancelled = isinstance(e, ProvisionCancelled | KeyboardInterrupt)
        if cancelled and cut_short(cancel):
            # A runner stopping waits only so long for its steps: this delete and the step end's
            # are tried twice, and the exit handler tries what is left with the usual patience.
            self.patient = False
        self._delete(record, "cancelled" if cancelled else "not provisioned",
                     tries=None if self.patient else _IMPATIENT_TRIES)

    def _key(self, record: HeldResource) -> str:
        return f"{id(self)}:{record.name}"

    def _create(self, spec: QueuedResourceSpec, record: HeldResource, cancel: threading.Event) -> bool:
        """Ask for the queued resource; False when ``cancel`` came before the API answered.

        The API may hold a create for a long while; a stopping runner waits only so long for
        its steps. Cancelled first, the create is left to finish on its own thread: what it
        makes is deleted then, or, at exit, named for ``marinbuild tpu down`` (:func:`_delete_live`).
        """
        key = self._key(record)
        answered, lock = threading.Event(), threading.Lock()
        failed: list[BaseException] = []
        abandoned: list[bool] = []
        with _LIVE_LOCK:
            _UNANSWERED.add(key)

        def create() -> None:
            try:
                self._operations[spec.name] = self.api.create(spec)
            except BaseException as e:
                failed.append(e)
            with lock:
                answered.set()
                late = bool(abandoned)
            with _LIVE_LOCK:
                _UNANSWERED.discard(key)
            if late:
                self._delete(record, "cancelled")  # a failed create made nothing, or its delete says so

        threading.Thread(target=create, name=f"create-{spec.name}", daemon=True).start()
        while not answered.wait(_CREATE_CHECK_S):
            if cancel.is_set():
                with lock:
                    if not answered.is_set():
                        abandoned.append(True)
                        record.delete_error = "cancelled before the TPU API answered its create"
                        self.report(f"queued resource {spec.name}: cancelled before the TPU API answered its create; "
                                    "it is deleted if it is made while this run goes on, else named as the run exits")
                        return False
        if failed:
            raise failed[0]
        return True

    def _wait_active(self, spec: QueuedResourceSpec, record: HeldResource, cancel: threading.Event) -> None:
        assert self.started is not None
        deadline = self.started + self.gcp.provision_timeout
        last: str | None = None
        next_report = 0.0
        while True:
            try:
                info = self._look(spec.name, record.created_at)
            except TpuApiError as e:
                if not e.transient:
                    raise
                # A burst of "try again": the queued resource keeps its place; ask again later.
                info, state = None, last or "WAITING_FOR_RESOURCES"
                self.report(f"queued resource {spec.name}: the TPU API answers \"try again\"; still waiting ({e})")
            else:
                state = info.state if info is not None else "DELETED"
                if state == "ACTIVE":
                    return
                if info is None and not self._creating(spec):
                    raise CapacityUnavailable(f"queued resource {spec.name} {state}: queued resource is {state}")
                if info is not None and state in _FAILED_STATES:
                    raise failure_of(spec.name, state, info.error_code, info.error)
            now = self.clock()
            phase = _WAITING.get(state, "waiting for capacity" if state == "DELETED" else state.lower())
            self.state = f"{phase} ({now - record.created_at:.0f} s)"
            if state != last or now >= next_report:
                self.report(f"queued resource {spec.name} ({spec.count} x {spec.tpu_type}): {self.state}")
                if state != last:
                    self.on_phase(phase, now, spec.name)
                last, next_report = state, now + _REPORT_EVERY_S
            if now >= deadline:
                raise CapacityUnavailable(
                    f"queued resource {spec.name} not ACTIVE within provision_timeout "
                    f"({self.gcp.provision_timeout:g} s; last state {state})", timed_out=True,
                )
            if cancel.wait(min(self.poll, max(0.0, deadline - now))):
                raise ProvisionCancelled(f"cancelled while queued resource {spec.name} was {state}")

    def _look(self, name: str, since: float) -> QueuedResourceInfo | None:
        """The queued resource as the run's shared list has it; asked for by name when the list lacks it."""
        if self.board is None:
            return self.api.get(name)
        return self.board.get(name, since=since) or self.api.get(name)

    def _creating(self, spec: QueuedResourceSpec) -> bool:
        """A queued resource that is not there: whether its create's operation still runs.

        An operation that ended with an error raises it, classified: the API refused what was
        asked for (a runtime version, a topology), which asking again does not change.
        """
        operation = self._operations.get(spec.name)
        done, error = self.api.operation_state(operation, f"creating queued resource {spec.name}")
        if error is not None:
            raise TpuApiError(f"TPU API: creating queued resource {spec.name} failed in project "
                              f"{self.gcp.project}: {error}", final=True)
        return not done

    def _read_nodes_patiently(self, spec: QueuedResourceSpec, cancel: threading.Event) -> ProvisionedSlices:
        """The ACTIVE queued resource's nodes, asked again while the API says "try again"
        (until ``ssh_ready_timeout``): a burst of 503s must not cost a slice that is there."""
        deadline = self.clock() + self.gcp.ssh_ready_timeout
        while True:
            try:
                return self._read_nodes(spec)
            except TpuApiError as e:
                if not e.transient or self.clock() >= deadline:
                    raise
                self.report(f"queued resource {spec.name} is ACTIVE; the TPU API answers \"try again\" "
                            f"for its nodes; asking again ({e})")
            if cancel.wait(self.poll):
                raise ProvisionCancelled(f"cancelled while the nodes of queued resource {spec.name} were read")

    def _nodes(self, spec: QueuedResourceSpec) -> list[NodeInfo]:
        """The queued resource's nodes, slice 0 first: by the names asked for, else as the API lists them."""
        named = [self.api.node(name) for name in spec.node_names()]
        if all(n is not None for n in named):
            return [n for n in named if n is not None]
        listed = self.api.nodes_of(spec.name)
        if len(listed) != spec.count:
            raise CapacityUnavailable(f"queued resource {spec.name} is ACTIVE but has {len(listed)} of {spec.count} nodes")
        return listed

    def _read_nodes(self, spec: QueuedResourceSpec) -> ProvisionedSlices:
        specs: list[SliceSpec] = []
        keys: dict[str, tuple[str, ...]] = {}
        vms = tpu_topology(spec.tpu_type).vm_count
        for node in self._nodes(spec):
            name = node.name
            if not node.addresses:
                raise CapacityUnavailable(f"queued resource {spec.name} is ACTIVE but node {name} has no endpoints")
            if len(node.addresses) != vms:
                raise TpuApiError(f"node {name} has {len(node.addresses)} worker(s) but {spec.tpu_type} has {vms}")
            addresses = node.addresses
            if self.gcp.external_ips:
                if not all(node.external_addresses):
                    raise TpuApiError(f"node {name} has a worker without an external IP (external_ips = true)")
                addresses = tuple(a for a in node.external_addresses if a)
            hosts = tuple(self._entry(a, p) for a, p in zip(addresses, node.ports or (0,) * len(addresses), strict=False))
            reported: list[tuple[str, ...]] = self.api.host_keys(name)
            for entry, worker_keys in zip(hosts, reported, strict=False):
                if worker_keys:
                    keys[entry] = _preferred_first(worker_keys)
            specs.append(SliceSpec(name, spec.tpu_type, hosts, self.cluster.ssh, node.addresses, self.gcp.preemptible))
        return ProvisionedSlices(spec.name, tuple(specs), keys)

    def _entry(self, address: str, port: int) -> str:
        """The SSH host entry of a worker: its address, on ``[ssh] port`` (22 unless set).

        An emulator (an ``http://`` API) may put each loopback host's SSH port in its endpoint;
        Google's API gives the TPU runtime's port there (8470), never SSH's, so it is not used.
        """
        emulated = (self.gcp.api_endpoint or "").startswith("http://")
        if not emulated or self.cluster.ssh.port is not None or port in (0, _RUNTIME_PORT):
            return address
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"

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
        info = self._look(current.queued_resource, since) if board is not None else self.api.get(current.queued_resource)
        everything = tuple(s.name for s in current.specs)
        if info is None:
            return everything
        gone = []
        for s in current.specs:
            node = (board.node(s.name, since=since) if board is not None else None) or self.api.node(s.name)
            if node is None or node.state in _GONE_STATES:
                gone.append(s.name)
            elif node.state in _UNWELL_STATES or node.health in _UNWELL_HEALTH:
                self.unwell[s.name] = node.health if node.health in _UNWELL_HEALTH else node.state
        # A spot queued resource goes SUSPENDING/SUSPENDED when one of its nodes is preempted:
        # the nodes say which; when none does, the whole slice set is gone.
        if info.state != "ACTIVE" and not gone:
            return everything
        return tuple(gone) or tuple(self.unwell)

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
        with _LIVE_LOCK:
            unanswered = {r.name for r in self.held if self._key(r) in _UNANSWERED}
        for r in self.held:
            # One whose create is still unanswered is not there to delete yet: its create's
            # thread deletes it once answered (the exit handler names it if never).
            if r.deleted_at is None and r.name not in unanswered:
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
        with _LIVE_LOCK:
            _LIVE.pop(self._key(record), None)
        return True

    def ledger(self, since: int = 0) -> list[dict[str, object]]:
        """The queued resources held so far (from the ``since``-th on), for ``attempts.json``."""
        return [r.to_json() for r in self.held[since:]]


_KEY_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


def _preferred_first(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Keys in the order paramiko should ask for them (it asks for the first type only)."""
    def rank(line: str) -> int:
        kind = line.split()[0]
        return _KEY_ORDER.index(kind) if kind in _KEY_ORDER else len(_KEY_ORDER)

    return tuple(sorted(keys, key=rank))

