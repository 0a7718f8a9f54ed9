"""A Cloud TPU API (v2) emulator on loopback whose nodes are real ``sshd`` hosts.

It answers the REST calls the ``google-cloud-tpu`` client (``tpu_v2``, REST transport) makes:
queued resources create/get/list/delete (``force``), nodes get/list, ``getGuestAttributes``
(``hostkeys/``: one entry per worker, in worker order) and long-running operations. A queued
resource goes CREATING → WAITING_FOR_RESOURCES (at least ``waiting_s``, and until enough free
hosts exist) → PROVISIONING (``provisioning_s``) → ACTIVE, or FAILED when a failure was asked
for. Its nodes' ``networkEndpoints`` are hosts handed in by the caller: each has an address,
an SSH host key, and ``start``/``stop`` (tests/fixtures_ssh.py's fake hosts). A deleted
slice's hosts return to the end of the free list, so the next slice lands on other addresses
when there are spare ones.

It is as strict as the API where marinbuild could go wrong: a runtime version the generation
does not boot, a type the zone lacks, two capacity tiers at once or a reservation without the
reserved tier are 400s; a second delete of a DELETING queued resource is refused; list calls
page (``page_size``); a queued resource not ACTIVE by its ``queueingPolicy.validUntilDuration``
goes FAILED.

Controls for tests (each also over HTTP, below): :meth:`TpuApiEmulator.preempt` (node
PREEMPTED, its hosts' sshd stopped), :meth:`fail_next` (the next N queued resources go FAILED,
for no capacity, a quota or an invalid configuration, each with Google's code),
:meth:`refuse_creates` (403 or 400 on create), :meth:`fail_create_operations`,
:meth:`unavailable_next` / :meth:`unavailable_for` (503s), :attr:`create_op_s` /
:attr:`delete_op_s` (operations that take time; DELETING meanwhile), :attr:`sshd_after_s` /
:attr:`logins_after_s` / :attr:`keys_after_s` (VMs that boot after ACTIVE), :attr:`key_style`
(how guest attributes write host keys), :meth:`set_health` (health and node state),
:meth:`suspend`, :attr:`api_disabled`, :attr:`waiting_s` / :attr:`provisioning_s`,
:meth:`report_host_key` (what guest attributes say about a host).

Standalone, it starts its own loopback hosts and writes a cluster file::

    python -m tests.tpu_api_emulator --hosts 4 --dir /tmp/tpu-emu --preempt-after 5 --preemptions 2

and takes control requests while it runs (``curl -X POST http://127.0.0.1:PORT/emulator/preempt/NODE``,
``.../emulator/fail/N[/capacity|quota|invalid]``, ``.../refuse-creates/N/403``,
``.../fail-create-operations/N``, ``.../unavailable-for/SECONDS``, ``.../health/NODE/UNHEALTHY_MAINTENANCE``,
``.../node-state/NODE/REPAIRING``, ``.../suspend/QUEUED_RESOURCE``, ``.../api-disabled/true``, and
``.../create-op-s/S``, ``.../delete-op-s/S``, ``.../sshd-after-s/S``, ``.../logins-after-s/S``,
``.../keys-after-s/S``, ``.../key-style/joined``, ``.../page-size/N``, ``.../waiting-s/S``,
``.../provisioning-s/S``; ``GET .../emulator/state``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from marinbuild.tpu_types import tpu_topology

__all__ = ["EmulatedHost", "TpuApiEmulator", "main"]

_QR_STATES = ("STATE_UNSPECIFIED", "CREATING", "ACCEPTED", "PROVISIONING", "FAILED", "DELETING",
              "ACTIVE", "SUSPENDING", "SUSPENDED", "WAITING_FOR_RESOURCES")
_QR_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
_EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"
_RUNTIME_PORT = 8470  # what the real API reports as an endpoint's port (the TPU runtime's, not SSH's)


@dataclass
class EmulatedHost:
    """One worker VM: a loopback address with a real sshd behind it."""

    address: str
    host_key: str
    """``TYPE BASE64`` of the host's SSH key, as guest attributes report it."""
    start: Callable[[], None]
    stop: Callable[[], None]
    running: Callable[[], bool] = lambda: True
    port: int = _RUNTIME_PORT
    """What the endpoint's ``port`` says: the TPU runtime's, as Google's API; or an SSH port."""
    refuse_logins: Callable[[bool], None] = lambda refuse: None
    """Refuse (True) or accept (False) logins while sshd runs: the ``ssh-keys`` user not made yet."""


@dataclass
class _Node:
    name: str
    body: dict[str, Any]
    hosts: list[EmulatedHost]
    queued_resource: str
    created: float
    state: str = "READY"
    health: str = "HEALTHY"


@dataclass
class _QueuedResource:
    name: str
    body: dict[str, Any]
    created: float
    node_names: list[str]
    tpu_type: str
    vms_per_node: int
    fail: str | None
    """Why it goes FAILED after provisioning ("capacity", "quota", "invalid"); None: it does not."""
    state: str = "WAITING_FOR_RESOURCES"
    changed: float = 0.0
    hosts: list[EmulatedHost] = field(default_factory=list)
    history: list[str] = field(default_factory=list)
    valid_until: float | None = None
    """``queueingPolicy.validUntilDuration`` from its creation: not ACTIVE by then, FAILED."""
    error: tuple[int, str] | None = None
    """A FAILED one's ``failedData.error``: (code, message)."""


@dataclass
class _Operation:
    name: str
    done_at: float
    response: dict[str, Any]
    error: tuple[int, str] | None = None
    then: Callable[[], None] | None = None
    """Run once when the operation completes (a delete's queued resource vanishes then)."""


_FAILURES = {
    "capacity": (8, "There is no more capacity in the zone \"{zone}\"; you will be placed in a queue"),
    "quota": (8, "Quota 'TPUV4sPodPerProjectPerZoneForTPUAPI' exhausted. Limit 32.0 in zone {zone}"),
    "invalid": (3, "Invalid value for field 'node.acceleratorConfig': unsupported topology"),
}
"""FAILED queued resources by cause: Google's ``failedData.error`` code and message."""
RUNTIME_VERSIONS = {
    "v4": ("tpu-ubuntu2204-base", "tpu-vm-base", "tpu-vm-v4-base"),
    "v5p": ("tpu-ubuntu2204-base", "v2-alpha-tpuv5"),
    "v5litepod": ("v2-alpha-tpuv5-lite",),
    "v6e": ("v2-alpha-tpuv6e",),
}
"""Runtime versions the emulated zone boots, per generation (the API refuses others with 400)."""
ACCELERATOR_TYPES = (
    "v4-8", "v4-16", "v4-32", "v4-64", "v4-128", "v5p-8", "v5p-16", "v5p-32",
    "v5litepod-1", "v5litepod-4", "v5litepod-8", "v5litepod-16", "v5litepod-32", "v6e-1", "v6e-4", "v6e-8", "v6e-16",
)
"""Accelerator types the emulated zone offers (``acceleratorTypes`` lists them)."""


def _duration_s(text: object) -> float | None:
    """A JSON ``google.protobuf.Duration`` (``"3600s"``) in seconds; None when absent."""
    if not isinstance(text, str) or not text.endswith("s"):
        return None
    return float(text[:-1])


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _ApiError(Exception):
    def __init__(self, code: int, status: str, message: str) -> None:
        super().__init__(message)
        self.code, self.status, self.message = code, status, message


class TpuApiEmulator:
    """The emulator: start it, hand :attr:`endpoint` to the client, stop it at the end."""

    def __init__(
        self,
        hosts: Sequence[EmulatedHost],
        *,
        waiting_s: float = 0.1,
        provisioning_s: float = 0.1,
        port: int = 0,
    ) -> None:
        self.free: list[EmulatedHost] = list(hosts)
        self.waiting_s = waiting_s
        self.provisioning_s = provisioning_s
        self.failures: list[str] = []
        """Causes of the next queued resources to go FAILED, in turn."""
        self.unavailable_left = 0
        self.unavailable_lost = False
        self.unavailable_until = 0.0
        self.unavailable_paths = ""
        self.create_refusals: list[tuple[int, str, str]] = []
        """The next creates answered with these (HTTP code, status, message), in turn."""
        self.create_op_s = 0.0
        """Seconds a create's operation takes to be done (Google's take a few)."""
        self.create_op_errors: list[tuple[int, str]] = []
        """The next creates' operations end with these errors (code, message): nothing made."""
        self.delete_op_s = 0.0
        """Seconds a delete takes: the queued resource is DELETING meanwhile, its operation not done."""
        self.keys_after_s = 0.0
        """Guest attributes report no host key until this long after a node turns ACTIVE."""
        self.logins_after_s = 0.0
        """A node's hosts refuse logins (sshd up, key not authorized) until this long after ACTIVE."""
        self.sshd_after_s = 0.0
        """A node's hosts' sshd is down (connection refused) until this long after ACTIVE."""
        self.key_style = "split"
        """How guest attributes write host keys: "split" (key = type, value = base64), "typed"
        (value = ``TYPE BASE64``), "joined" (one entry, several ``TYPE BASE64`` lines)."""
        self.page_size = 0
        """List calls answer this many items a page (0: all on one), with ``nextPageToken``."""
        self.api_disabled = False
        """Every API request is answered 403 SERVICE_DISABLED, as for a project without the TPU API."""
        self.operations: dict[str, _Operation] = {}
        self._timers: list[tuple[float, Callable[[], None]]] = []
        self.node_name = "{prefix}-{i}"
        """How multislice nodes are named (Google's API: ``PREFIX-i``)."""
        self.auto_preempt_after: float | None = None
        self.auto_preemptions_left = 0
        self.queued: dict[str, _QueuedResource] = {}
        self.nodes: dict[str, _Node] = {}
        self.reported_keys: dict[str, str | None] = {}
        self.log: list[tuple[str, str, dict[str, Any]]] = []
        """Every request: (method, path without query, JSON body)."""
        self.deleted: list[str] = []
        self.refused: list[str] = []
        """Paths of the requests a burst answered 503 (not in :attr:`log`: they never reached the API)."""
        self.lock = threading.RLock()
        self._ids = itertools.count(1)
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._ticker_stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick_forever, daemon=True)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> TpuApiEmulator:
        self._thread.start()
        self._ticker.start()
        return self

    def stop(self) -> None:
        self._ticker_stop.set()
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> TpuApiEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- controls --------------------------------------------------------------------------

    def fail_next(self, n: int, why: str = "capacity") -> None:
        """The next ``n`` queued resources created go FAILED after provisioning, ``why``: "capacity"
        (RESOURCE_EXHAUSTED, no capacity), "quota" (RESOURCE_EXHAUSTED, a quota named) or "invalid"
        (INVALID_ARGUMENT)."""
        if why not in _FAILURES:
            raise ValueError(f"no such failure {why!r} (known: {', '.join(_FAILURES)})")
        with self.lock:
            self.failures = [why] * n

    def refuse_creates(self, n: int, code: int = 403) -> None:
        """The next ``n`` creates are answered ``code``: 403 (a permission missing) or 400 (a bad field)."""
        answers = {
            403: (403, "PERMISSION_DENIED", "Permission 'tpu.queuedResources.create' denied on resource "
                  "'//tpu.googleapis.com/projects/{project}/locations/{zone}' (or it may not exist)."),
            400: (400, "INVALID_ARGUMENT", "Invalid value for field 'queuedResource.tpu.nodeSpec[0].node.tags[0]': "
                  "'Bad Tag'. Must be a match of regex '[a-z]([-a-z0-9]*[a-z0-9])?'"),
        }
        with self.lock:
            self.create_refusals = [answers[code]] * n

    def fail_create_operations(self, n: int, code: int = 3, message: str = "Invalid runtime configuration") -> None:
        """The next ``n`` creates are accepted but their operations end with this error, nothing made."""
        with self.lock:
            self.create_op_errors = [(code, message)] * n

    def unavailable_for(self, seconds: float, path_contains: str = "") -> None:
        """Every API request (whose path holds ``path_contains``) is answered 503 UNAVAILABLE for
        ``seconds`` from now (a burst)."""
        with self.lock:
            self.unavailable_until, self.unavailable_paths = time.time() + seconds, path_contains

    def set_health(self, node: str, health: str = "UNHEALTHY_MAINTENANCE", state: str | None = None) -> None:
        """A node's ``health`` (HEALTHY, TIMEOUT, UNHEALTHY_MAINTENANCE, ...) and, given, its ``state``
        (REPAIRING, UNKNOWN, RESTARTING, ...)."""
        with self.lock:
            n = self._node(node)
            n.health = health
            if state is not None:
                n.state = state

    def suspend(self, queued_resource: str) -> None:
        """The queued resource goes SUSPENDED (Google's API: its capacity was taken back)."""
        with self.lock:
            qr = next(r for q, r in self.queued.items() if q == queued_resource or q.endswith("/" + queued_resource))
            self._set(qr, "SUSPENDED", time.time())

    def unavailable_next(self, n: int, *, lost: bool = False) -> None:
        """The next ``n`` API requests are answered 503 UNAVAILABLE, as Google's API does now and
        then: before acting, or (``lost``) after acting, as when an answer is lost on the way."""
        with self.lock:
            self.unavailable_left, self.unavailable_lost = n, lost

    def _unavailable(self, *, acted: bool, path: str = "") -> None:
        with self.lock:
            if not acted and time.time() < self.unavailable_until and self.unavailable_paths in path:
                self.refused.append(path)
                raise _ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")
            if self.unavailable_left > 0 and self.unavailable_lost == acted:
                self.unavailable_left -= 1
                raise _ApiError(503, "UNAVAILABLE", "The service is currently unavailable.")

    def preempt(self, node: str, *, stop_hosts: bool = True) -> None:
        """Mark ``node`` (full or short name) PREEMPTED and stop its hosts' sshd (``stop_hosts``;
        without, the API says so before the VMs go, which only the API can tell)."""
        with self.lock:
            n = self._node(node)
            n.state = "PREEMPTED"
            self._suspend(self.queued.get(n.queued_resource), time.time())
            hosts = list(n.hosts) if stop_hosts else []
        for h in hosts:
            h.stop()

    def report_host_key(self, address: str, key: str | None) -> None:
        """What guest attributes report for ``address`` from now on (None: nothing)."""
        with self.lock:
            self.reported_keys[address] = key

    def auto_preempt(self, after_s: float, times: int) -> None:
        """Preempt each slice ``after_s`` seconds after it turns ACTIVE, ``times`` slices in all."""
        with self.lock:
            self.auto_preempt_after, self.auto_preemptions_left = after_s, times

    def active_nodes(self) -> list[str]:
        """Short names of the nodes of ACTIVE queued resources, in creation order."""
        with self.lock:
            self._advance_all()
            return [n.split("/")[-1] for qr in self.queued.values() if qr.state == "ACTIVE" for n in qr.node_names]

    def node_hosts(self, node: str) -> list[str]:
        """The addresses of ``node``'s workers, worker 0 first."""
        with self.lock:
            return [h.address for h in self._node(node).hosts]

    def queued_resource_names(self) -> list[str]:
        """Short names of every queued resource that exists."""
        with self.lock:
            return [q.split("/")[-1] for q in self.queued]

    def states(self) -> dict[str, list[str]]:
        """Each queued resource's states so far, in order (deleted ones included while known)."""
        with self.lock:
            self._advance_all()
            return {q.split("/")[-1]: list(r.history) for q, r in self.queued.items()}

    def requests(self, method: str | None = None, suffix: str = "") -> list[tuple[str, str, dict[str, Any]]]:
        """Logged requests, filtered by method and path ending."""
        with self.lock:
            return [r for r in self.log if (method is None or r[0] == method) and r[1].endswith(suffix)]

    # -- state machine -----------------------------------------------------------------------

    def _set(self, qr: _QueuedResource, state: str, now: float) -> None:
        qr.state, qr.changed = state, now
        qr.history.append(state)

    def _advance(self, qr: _QueuedResource, now: float) -> None:
        if qr.state in ("WAITING_FOR_RESOURCES", "PROVISIONING") and qr.valid_until is not None and now >= qr.valid_until:
            qr.error = (4, "The queued resource was not provisioned before its validUntil time")
            self._free(qr)
            self._set(qr, "FAILED", now)
            return
        if qr.state == "WAITING_FOR_RESOURCES" and now - qr.changed >= self.waiting_s:
            need = qr.vms_per_node * len(qr.node_names)
            usable = [h for h in self.free if h.running()]
            if qr.fail or len(usable) >= need:
                if not qr.fail:
                    qr.hosts = usable[:need]
                    for h in qr.hosts:
                        self.free.remove(h)
                self._set(qr, "PROVISIONING", now)
        if qr.state == "PROVISIONING" and now - qr.changed >= self.provisioning_s:
            if qr.fail:
                code, message = _FAILURES[qr.fail]
                qr.error = (code, message.format(zone=qr.name.split("/")[3]))
                self._set(qr, "FAILED", now)
                return
            body = qr.body["tpu"]["nodeSpec"][0]["node"]
            for i, name in enumerate(qr.node_names):
                hosts = qr.hosts[i * qr.vms_per_node:(i + 1) * qr.vms_per_node]
                self.nodes[name] = _Node(name, body, hosts, qr.name, now)
            self._set(qr, "ACTIVE", now)
            self._boot(qr.hosts, now)
        if (
            qr.state == "ACTIVE" and self.auto_preempt_after is not None and self.auto_preemptions_left > 0
            and now - qr.changed >= self.auto_preempt_after
            and all(self.nodes[n].state == "READY" for n in qr.node_names if n in self.nodes)
        ):
            self.auto_preemptions_left -= 1
            node = self.nodes[qr.node_names[-1]]
            node.state = "PREEMPTED"
            self._suspend(qr, now)
            for h in node.hosts:
                h.stop()

    def _boot(self, hosts: list[EmulatedHost], now: float) -> None:
        """Real VMs are ACTIVE before sshd and the ``ssh-keys`` user are there."""
        for h in hosts:
            if self.sshd_after_s > 0:
                h.stop()
                self._timers.append((now + self.sshd_after_s, lambda h=h: None if h.running() else h.start()))
            if self.logins_after_s > 0:
                h.refuse_logins(True)
                self._timers.append((now + self.logins_after_s, lambda h=h: h.refuse_logins(False)))

    def boot_now(self) -> None:
        """Hosts still booting (sshd not started, logins refused) are up now, not at their time."""
        with self.lock:
            timers, self._timers = self._timers, []
            for _, fn in timers:
                fn()

    def _run_timers(self, now: float) -> None:
        due = [t for t in self._timers if t[0] <= now]
        self._timers = [t for t in self._timers if t[0] > now]
        for _, fn in due:
            fn()
        for op in list(self.operations.values()):
            if op.then is not None and op.done_at <= now:
                then, op.then = op.then, None
                then()

    def _free(self, qr: _QueuedResource) -> None:
        """Its hosts back to the free list (a VM deleted: its processes die with it)."""
        for h in qr.hosts:
            h.stop()
            h.start()
            h.refuse_logins(False)
            self.free.append(h)
        qr.hosts = []

    def _suspend(self, qr: _QueuedResource | None, now: float) -> None:
        # Google's API: a spot queued resource goes SUSPENDED when one of its nodes is preempted.
        if qr is not None and qr.state == "ACTIVE" and "spot" in qr.body:
            self._set(qr, "SUSPENDED", now)

    def _advance_all(self) -> None:
        now = time.time()
        for qr in list(self.queued.values()):
            self._advance(qr, now)
        self._run_timers(now)

    def _tick_forever(self) -> None:
        while not self._ticker_stop.wait(0.05):
            with self.lock:
                self._advance_all()

    def _node(self, name: str) -> _Node:
        for full, n in self.nodes.items():
            if full == name or full.endswith("/" + name):
                return n
        raise KeyError(name)

    # -- the API ---------------------------------------------------------------------------

    def _create_qr(self, parent: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        if self.create_refusals:
            code, status, message = self.create_refusals.pop(0)
            _, project, _, zone = parent.split("/")
            raise _ApiError(code, status, message.format(project=project, zone=zone))
        qr_id = query.get("queuedResourceId") or f"qr-{next(self._ids)}"
        name = f"{parent}/queuedResources/{qr_id}"
        if name in self.queued:
            raise _ApiError(409, "ALREADY_EXISTS", f"queued resource {name} already exists")
        specs = body.get("tpu", {}).get("nodeSpec") or []
        if len(specs) != 1:
            raise _ApiError(400, "INVALID_ARGUMENT", "exactly one nodeSpec is supported")
        spec = specs[0]
        node = spec.get("node") or {}
        tpu_type = node.get("acceleratorType", "")
        if tpu_type not in ACCELERATOR_TYPES:
            raise _ApiError(400, "INVALID_ARGUMENT", f"Invalid value for field 'node.acceleratorType': {tpu_type!r} "
                            f"is not available in {parent.split('/')[-1]}")
        vms = tpu_topology(tpu_type).vm_count
        runtime = node.get("runtimeVersion")
        if not runtime:
            raise _ApiError(400, "INVALID_ARGUMENT", "node.runtimeVersion is required")
        if runtime not in RUNTIME_VERSIONS.get(tpu_type.rsplit("-", 1)[0], ()):
            raise _ApiError(400, "INVALID_ARGUMENT", f"Invalid value for field 'node.runtimeVersion': {runtime!r} "
                            f"is not supported for accelerator type {tpu_type!r}")
        self._check_tier(body, node)
        multi = spec.get("multisliceParams")
        if multi is not None:
            count = int(multi.get("nodeCount", 0))
            if count < 2:
                raise _ApiError(400, "INVALID_ARGUMENT", "multisliceParams.nodeCount must be > 1")
            prefix = multi.get("nodeIdPrefix") or qr_id
            node_names = [f"{parent}/nodes/" + self.node_name.format(prefix=prefix, i=i) for i in range(count)]
        elif spec.get("nodeId"):
            node_names = [f"{parent}/nodes/{spec['nodeId']}"]
        else:
            raise _ApiError(400, "INVALID_ARGUMENT", "nodeSpec needs nodeId or multisliceParams")
        clash = [n for n in node_names if n in self.nodes]
        if clash:
            raise _ApiError(409, "ALREADY_EXISTS", f"node {clash[0]} already exists")
        now = time.time()
        if self.create_op_errors:
            code, message = self.create_op_errors.pop(0)
            return self._operation(parent, "create", {}, error=(code, message), after=self.create_op_s)
        fail = self.failures.pop(0) if self.failures else None
        qr = _QueuedResource(name, body, now, node_names, tpu_type, vms, fail)
        valid = _duration_s((body.get("queueingPolicy") or {}).get("validUntilDuration"))
        qr.valid_until = now + valid if valid is not None else None
        qr.history.append("CREATING")
        self._set(qr, "WAITING_FOR_RESOURCES", now)
        self.queued[name] = qr
        return self._operation(parent, "create", {"@type": _QR_TYPE, **self._qr_json(qr)}, after=self.create_op_s)

    def _check_tier(self, body: dict[str, Any], node: dict[str, Any]) -> None:
        """At most one tier, and what each needs, as the API refuses otherwise."""
        scheduling = node.get("schedulingConfig") or {}
        tiers = [t for t in ("spot", "guaranteed") if t in body]
        if scheduling.get("preemptible"):
            tiers.append("schedulingConfig.preemptible")
        if len(tiers) > 1:
            raise _ApiError(400, "INVALID_ARGUMENT", f"only one capacity tier may be set, not {' and '.join(tiers)}")
        if body.get("reservationName") and not scheduling.get("reserved"):
            raise _ApiError(400, "INVALID_ARGUMENT", "reservationName needs node.schedulingConfig.reserved")
        if scheduling.get("reserved") and "guaranteed" not in body:
            raise _ApiError(400, "INVALID_ARGUMENT", "node.schedulingConfig.reserved needs the guaranteed tier")
        reservation = body.get("reservationName")
        if reservation and not reservation.startswith("projects/"):
            raise _ApiError(400, "INVALID_ARGUMENT", f"Invalid value for field 'reservationName': {reservation!r}")

    def _delete_qr(self, name: str, query: dict[str, str]) -> dict[str, Any]:
        qr = self.queued.get(name)
        if qr is None:
            raise _ApiError(404, "NOT_FOUND", f"queued resource {name} not found")
        if qr.state == "DELETING":
            raise _ApiError(400, "FAILED_PRECONDITION", f"queued resource {name} is being deleted")
        live = [n for n in qr.node_names if n in self.nodes]
        if live and query.get("force", "").lower() != "true":
            raise _ApiError(400, "FAILED_PRECONDITION",
                            f"queued resource {name} has nodes; delete them first or set force")
        parent = name.split("/queuedResources/")[0]

        def gone() -> None:
            for n in live:
                self.nodes.pop(n, None)
            self._free(qr)
            self.queued.pop(name, None)
            self.deleted.append(name.split("/")[-1])

        if self.delete_op_s <= 0:
            gone()
            return self._operation(parent, "delete", {"@type": _EMPTY_TYPE})
        self._set(qr, "DELETING", time.time())
        for n in live:
            self.nodes[n].state = "DELETING"
        return self._operation(parent, "delete", {"@type": _EMPTY_TYPE}, after=self.delete_op_s, then=gone)

    def _operation(self, parent: str, verb: str, response: dict[str, Any], *, after: float = 0.0,
                   error: tuple[int, str] | None = None, then: Callable[[], None] | None = None) -> dict[str, Any]:
        name = f"{parent}/operations/operation-{verb}-{uuid.uuid4().hex[:12]}"
        op = _Operation(name, time.time() + after, response, error, then)
        self.operations[name] = op
        if after <= 0 and then is not None:
            then()
            op.then = None
        return self._operation_json(op, verb)

    def _operation_json(self, op: _Operation, verb: str = "") -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": op.name,
            "metadata": {"@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata",
                         "verb": verb or op.name.rsplit("/", 1)[-1].split("-")[1]},
            "done": time.time() >= op.done_at,
        }
        if out["done"]:
            if op.error is not None:
                out["error"] = {"code": op.error[0], "message": op.error[1]}
            else:
                out["response"] = op.response
        return out

    def _qr_json(self, qr: _QueuedResource) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": qr.name,
            "createTime": _ts(qr.created),
            "tpu": qr.body.get("tpu", {}),
            "state": {"state": qr.state},
        }
        for tier in ("spot", "guaranteed"):
            if tier in qr.body:
                out[tier] = qr.body[tier]
        for key in ("queueingPolicy", "reservationName"):
            if key in qr.body:
                out[key] = qr.body[key]
        if qr.state == "FAILED" and qr.error is not None:
            out["state"]["failedData"] = {"error": {"code": qr.error[0], "message": qr.error[1]}}
        return out

    def _node_json(self, n: _Node) -> dict[str, Any]:
        out = {k: v for k, v in n.body.items() if k not in ("name", "state")}
        out.update(
            name=n.name,
            state=n.state,
            health=n.health,
            createTime=_ts(n.created),
            queuedResource=n.queued_resource,
            networkEndpoints=[
                {"ipAddress": h.address, "port": h.port, "accessConfig": {"externalIp": h.address}}
                for h in n.hosts
            ],
        )
        return out

    def _guest_attributes(self, n: _Node, body: dict[str, Any]) -> dict[str, Any]:
        path = body.get("queryPath", "")
        if path not in ("hostkeys/", "hostkeys"):
            return {}
        if time.time() - n.created < self.keys_after_s:
            return {}  # the guest agent has not written them yet
        entries = []
        for h in n.hosts:
            key = self.reported_keys.get(h.address, h.host_key)
            items = []
            if key:
                key_type, value = key.split()[:2]
                if self.key_style == "typed":
                    items.append({"namespace": "hostkeys", "key": key_type, "value": f"{key_type} {value} root@vm"})
                elif self.key_style == "joined":
                    # The agent's one entry may hold several keys; an unreadable one comes first here.
                    items.append({"namespace": "hostkeys", "key": "keys",
                                  "value": f"ssh-dss AAAAB3NzaC1kc3MAAACB\n{key_type} {value}\n"})
                else:
                    items.append({"namespace": "hostkeys", "key": key_type, "value": value})
            entries.append({"queryPath": "hostkeys/", "queryValue": {"items": items}})
        return {"guestAttributes": entries}

    def _page(self, field: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
        """One page of a list (``pageToken`` is the index to start at), as the API pages."""
        size = int(query.get("pageSize") or 0) or self.page_size or len(items) or 1
        start = int(query.get("pageToken") or 0)
        out: dict[str, Any] = {field: items[start:start + size]}
        if start + size < len(items):
            out["nextPageToken"] = str(start + size)
        return out

    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """Answer one API request (``path`` without ``/v2/`` and query)."""
        with self.lock:
            self.log.append((method, path, body))
            if self.api_disabled:
                project = path.split("/")[1] if path.startswith("projects/") else "?"
                raise _ApiError(403, "PERMISSION_DENIED", f"Cloud TPU API has not been used in project {project} "
                                "before or it is disabled. Enable it by visiting "
                                f"https://console.developers.google.com/apis/api/tpu.googleapis.com/overview?project={project}"
                                " then retry.")
            self._advance_all()
            parts = path.split("/")
            if len(parts) < 4 or parts[0] != "projects" or parts[2] != "locations":
                raise _ApiError(404, "NOT_FOUND", f"no such resource {path}")
            parent = "/".join(parts[:4])
            rest = parts[4:]
            if rest == ["queuedResources"]:
                if method == "POST":
                    return self._create_qr(parent, query, body)
                return self._page("queuedResources", [self._qr_json(q) for q in self.queued.values()
                                                       if q.name.startswith(parent + "/")], query)
            if len(rest) == 2 and rest[0] == "queuedResources":
                qr = self.queued.get(path)
                if method == "DELETE":
                    return self._delete_qr(path, query)
                if qr is None:
                    raise _ApiError(404, "NOT_FOUND", f"queued resource {path} not found")
                return self._qr_json(qr)
            if rest == ["nodes"]:
                return self._page("nodes", [self._node_json(n) for n in self.nodes.values()
                                            if n.name.startswith(parent + "/")], query)
            if rest == ["acceleratorTypes"]:
                return self._page("acceleratorTypes", [{"name": f"{parent}/acceleratorTypes/{t}", "type": t}
                                                       for t in ACCELERATOR_TYPES], query)
            if rest == ["runtimeVersions"]:
                versions = sorted({v for vs in RUNTIME_VERSIONS.values() for v in vs})
                return self._page("runtimeVersions", [{"name": f"{parent}/runtimeVersions/{v}", "version": v}
                                                      for v in versions], query)
            if len(rest) == 2 and rest[0] == "nodes":
                name, _, verb = path.partition(":")
                node = self.nodes.get(name)
                if node is None:
                    raise _ApiError(404, "NOT_FOUND", f"node {name} not found")
                if verb == "getGuestAttributes":
                    return self._guest_attributes(node, body)
                if verb:
                    raise _ApiError(400, "INVALID_ARGUMENT", f"unsupported method :{verb}")
                return self._node_json(node)
            if len(rest) == 2 and rest[0] == "operations":
                op = self.operations.get(path)
                if op is None:
                    raise _ApiError(404, "NOT_FOUND", f"operation {path} not found")
                return self._operation_json(op)
            raise _ApiError(404, "NOT_FOUND", f"no such resource {path}")

    def _control(self, method: str, path: str) -> dict[str, Any]:
        parts = path.strip("/").split("/")[1:]
        if method == "POST" and len(parts) == 2 and parts[0] == "preempt":
            self.preempt(parts[1])
            return {"preempted": parts[1]}
        if method == "POST" and len(parts) in (2, 3) and parts[0] == "fail":
            why = parts[2] if len(parts) == 3 else "capacity"
            self.fail_next(int(parts[1]), why)
            return {"fail_next": int(parts[1]), "why": why}
        if method == "POST" and len(parts) == 3 and parts[0] == "refuse-creates":
            self.refuse_creates(int(parts[1]), int(parts[2]))
            return {"refuse_creates": int(parts[1]), "code": int(parts[2])}
        if method == "POST" and len(parts) == 2 and parts[0] == "fail-create-operations":
            self.fail_create_operations(int(parts[1]))
            return {"fail_create_operations": int(parts[1])}
        if method == "POST" and len(parts) == 2 and parts[0] == "unavailable-for":
            self.unavailable_for(float(parts[1]))
            return {"unavailable_for": float(parts[1])}
        if method == "POST" and len(parts) == 3 and parts[0] == "health":
            self.set_health(parts[1], parts[2])
            return {"node": parts[1], "health": parts[2]}
        if method == "POST" and len(parts) == 3 and parts[0] == "node-state":
            self.set_health(parts[1], self._node(parts[1]).health, parts[2])
            return {"node": parts[1], "state": parts[2]}
        if method == "POST" and len(parts) == 2 and parts[0] == "api-disabled":
            self.api_disabled = parts[1] == "true"
            return {"api_disabled": self.api_disabled}
        if method == "POST" and len(parts) == 2 and parts[0] == "suspend":
            self.suspend(parts[1])
            return {"suspended": parts[1]}
        settable = {"create-op-s": "create_op_s", "delete-op-s": "delete_op_s", "keys-after-s": "keys_after_s",
                    "logins-after-s": "logins_after_s", "sshd-after-s": "sshd_after_s", "waiting-s": "waiting_s",
                    "provisioning-s": "provisioning_s", "page-size": "page_size", "key-style": "key_style"}
        if method == "POST" and len(parts) == 2 and parts[0] in settable:
            attr = settable[parts[0]]
            value: object = parts[1] if attr == "key_style" else int(parts[1]) if attr == "page_size" else float(parts[1])
            with self.lock:
                setattr(self, attr, value)
            return {attr: value}
        if method == "GET" and parts == ["state"]:
            with self.lock:
                self._advance_all()
                return {
                    "queued_resources": {q.split("/")[-1]: r.state for q, r in self.queued.items()},
                    "nodes": {n.split("/")[-1]: {"state": v.state, "health": v.health,
                                                 "hosts": [h.address for h in v.hosts]}
                              for n, v in self.nodes.items()},
                    "deleted": list(self.deleted),
                }
        raise _ApiError(404, "NOT_FOUND", f"no control {path}")

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        emulator = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                url = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                try:
                    body = json.loads(raw) if raw.strip() else {}
                    path = unquote(url.path)
                    if path.startswith("/emulator/"):
                        out, code = emulator._control(self.command, path), 200
                    elif path.startswith("/v2/"):
                        emulator._unavailable(acted=False, path=path)
                        out, code = emulator.handle(self.command, path[len("/v2/"):], query, body), 200
                        emulator._unavailable(acted=True)
                    else:
                        raise _ApiError(404, "NOT_FOUND", f"no such path {path}")
                except _ApiError as e:
                    out, code = {"error": {"code": e.code, "message": e.message, "status": e.status}}, e.code
                except (KeyError, ValueError) as e:
                    out, code = {"error": {"code": 400, "message": str(e), "status": "INVALID_ARGUMENT"}}, 400
                data = json.dumps(out).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = do_PATCH = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Handler


def fleet_hosts(fleet: Any) -> list[EmulatedHost]:
    """Emulated hosts over tests/fixtures_ssh.py's fake hosts (which share one host key)."""
    key = " ".join((fleet.root / "host_ed25519.pub").read_text().split()[:2])
    return [EmulatedHost(h.ip, key, h.start, h.stop, lambda h=h: h.running, refuse_logins=h.refuse_logins)
            for h in fleet.hosts]


def cluster_toml(emulator: TpuApiEmulator, fleet: Any, *, project: str = "emulated", zone: str = "us-central2-b",
                 known_hosts: Path | None = None, **gcp: object) -> str:
    """A cluster file whose ``[gcp]`` table points at ``emulator`` and whose ``[ssh]`` reaches the fleet."""
    known = known_hosts or fleet.root / "no_known_hosts"
    known.touch()
    ssh = {
        "user": "root", "port": fleet.hosts[0].port, "identity_file": str(fleet.client_key),
        "known_hosts": str(known), "ssh_config": str(fleet.ssh_config), "connect_timeout": 5,
        "remote_workdir": "~/marinbuild-work", "kill_grace": 1.0,
    }
    table: dict[str, object] = {"project": project, "zone": zone, "runtime_version": "tpu-ubuntu2204-base",
                                "api_endpoint": emulator.endpoint, "provision_timeout": 120}
    table.update(gcp)
    lines = ["[ssh]", *(f"{k} = {json.dumps(v)}" for k, v in ssh.items()), "", "[gcp]"]
    for k, v in table.items():
        if isinstance(v, dict):
            lines.append(f"{k} = {{ {', '.join(f'{a} = {json.dumps(b)}' for a, b in v.items())} }}")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    return "\n".join(lines) + "\n"


@dataclass
class _Standalone:
    fleet: Any
    emulator: TpuApiEmulator


def _serve(args: argparse.Namespace) -> Iterator[_Standalone]:
    from tests.fixtures_ssh import start_fleet, stop_fleet

    root = Path(args.dir).resolve()
    fleet = start_fleet(args.hosts, root / "hosts", same_port=True)
    try:
        emulator = TpuApiEmulator(fleet_hosts(fleet), waiting_s=args.waiting, provisioning_s=args.provisioning,
                                  port=args.port)
        with emulator:
            if args.fail:
                emulator.fail_next(args.fail)
            if args.preempt_after is not None:
                emulator.auto_preempt(args.preempt_after, args.preemptions)
            emulator.sshd_after_s, emulator.logins_after_s, emulator.keys_after_s = (
                args.sshd_after, args.logins_after, args.keys_after)
            emulator.create_op_s, emulator.delete_op_s = args.create_op, args.delete_op
            cluster = root / "cluster.toml"
            cluster.write_text(cluster_toml(emulator, fleet))
            yield _Standalone(fleet, emulator)
    finally:
        stop_fleet(fleet)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the emulator with its own loopback hosts until interrupted."""
    ap = argparse.ArgumentParser(prog="python -m tests.tpu_api_emulator", description=__doc__.split("\n")[0])
    ap.add_argument("--hosts", type=int, default=4, help="loopback sshd hosts to start (127.0.0.2 upwards)")
    ap.add_argument("--dir", default="/tmp/tpu-emulator", help="where host keys, homes and cluster.toml go")
    ap.add_argument("--port", type=int, default=0, help="the API's port on 127.0.0.1 (default: any free one)")
    ap.add_argument("--waiting", type=float, default=2.0, help="seconds in WAITING_FOR_RESOURCES")
    ap.add_argument("--provisioning", type=float, default=2.0, help="seconds in PROVISIONING")
    ap.add_argument("--fail", type=int, default=0, help="the first N queued resources go FAILED")
    ap.add_argument("--preempt-after", type=float, default=None, help="preempt each slice N seconds after ACTIVE")
    ap.add_argument("--preemptions", type=int, default=1, help="how many slices --preempt-after preempts")
    ap.add_argument("--sshd-after", type=float, default=0.0, help="each VM's sshd starts N seconds after ACTIVE")
    ap.add_argument("--logins-after", type=float, default=0.0, help="each VM refuses logins until N s after ACTIVE")
    ap.add_argument("--keys-after", type=float, default=0.0, help="host keys appear in guest attributes N s after ACTIVE")
    ap.add_argument("--create-op", type=float, default=0.0, help="seconds a create's operation takes")
    ap.add_argument("--delete-op", type=float, default=0.0, help="seconds a delete takes (DELETING meanwhile)")
    args = ap.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    for running in _serve(args):
        print(f"TPU API emulator on {running.emulator.endpoint}", flush=True)
        print(f"hosts: {', '.join(h.address for h in fleet_hosts(running.fleet))} (ssh port {running.fleet.hosts[0].port})")
        print(f"cluster file: {Path(args.dir).resolve() / 'cluster.toml'}", flush=True)
        try:
            while not stop.wait(0.5):
                pass
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
