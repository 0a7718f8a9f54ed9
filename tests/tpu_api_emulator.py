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

Controls for tests: :meth:`TpuApiEmulator.preempt` (node PREEMPTED, its hosts' sshd stopped),
:meth:`fail_next` (the next N queued resources go FAILED), :attr:`waiting_s` /
:attr:`provisioning_s`, :meth:`report_host_key` (what guest attributes say about a host).

Standalone, it starts its own loopback hosts and writes a cluster file::

    python -m tests.tpu_api_emulator --hosts 4 --dir /tmp/tpu-emu --preempt-after 5 --preemptions 2

and takes control requests while it runs (``curl -X POST http://127.0.0.1:PORT/emulator/preempt/NODE``,
``.../emulator/fail/N``; ``GET .../emulator/state``).
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


@dataclass
class _Node:
    name: str
    body: dict[str, Any]
    hosts: list[EmulatedHost]
    queued_resource: str
    created: float
    state: str = "READY"


@dataclass
class _QueuedResource:
    name: str
    body: dict[str, Any]
    created: float
    node_names: list[str]
    tpu_type: str
    vms_per_node: int
    fail: bool
    state: str = "WAITING_FOR_RESOURCES"
    changed: float = 0.0
    hosts: list[EmulatedHost] = field(default_factory=list)
    history: list[str] = field(default_factory=list)


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
        self.failures_left = 0
        self.unavailable_left = 0
        self.unavailable_lost = False
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

    def fail_next(self, n: int) -> None:
        """The next ``n`` queued resources created go FAILED (no capacity) after provisioning."""
        with self.lock:
            self.failures_left = n

    def unavailable_next(self, n: int, *, lost: bool = False) -> None:
        """The next ``n`` API requests are answered 503 UNAVAILABLE, as Google's API does now and
        then: before acting, or (``lost``) after acting, as when an answer is lost on the way."""
        with self.lock:
            self.unavailable_left, self.unavailable_lost = n, lost

    def _unavailable(self, *, acted: bool) -> None:
        with self.lock:
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
                self._set(qr, "FAILED", now)
                return
            body = qr.body["tpu"]["nodeSpec"][0]["node"]
            for i, name in enumerate(qr.node_names):
                hosts = qr.hosts[i * qr.vms_per_node:(i + 1) * qr.vms_per_node]
                self.nodes[name] = _Node(name, body, hosts, qr.name, now)
            self._set(qr, "ACTIVE", now)
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

    def _suspend(self, qr: _QueuedResource | None, now: float) -> None:
        # Google's API: a spot queued resource goes SUSPENDED when one of its nodes is preempted.
        if qr is not None and qr.state == "ACTIVE" and "spot" in qr.body:
            self._set(qr, "SUSPENDED", now)

    def _advance_all(self) -> None:
        now = time.time()
        for qr in list(self.queued.values()):
            self._advance(qr, now)

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
        try:
            vms = tpu_topology(tpu_type).vm_count
        except Exception:
            raise _ApiError(400, "INVALID_ARGUMENT", f"unknown acceleratorType {tpu_type!r}") from None
        if not node.get("runtimeVersion"):
            raise _ApiError(400, "INVALID_ARGUMENT", "node.runtimeVersion is required")
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
        fail = self.failures_left > 0
        if fail:
            self.failures_left -= 1
        now = time.time()
        qr = _QueuedResource(name, body, now, node_names, tpu_type, vms, fail)
        qr.history.append("CREATING")
        self._set(qr, "WAITING_FOR_RESOURCES", now)
        self.queued[name] = qr
        return self._operation(parent, "create", {"@type": _QR_TYPE, **self._qr_json(qr)})

    def _delete_qr(self, name: str, query: dict[str, str]) -> dict[str, Any]:
        qr = self.queued.get(name)
        if qr is None:
            raise _ApiError(404, "NOT_FOUND", f"queued resource {name} not found")
        live = [n for n in qr.node_names if n in self.nodes]
        if live and query.get("force", "").lower() != "true":
            raise _ApiError(400, "FAILED_PRECONDITION",
                            f"queued resource {name} has nodes; delete them first or set force")
        for n in live:
            del self.nodes[n]
        # A deleted VM's processes die with it; its address is given out again later.
        for h in qr.hosts:
            h.stop()
            h.start()
            self.free.append(h)
        del self.queued[name]
        self.deleted.append(name.split("/")[-1])
        parent = name.split("/queuedResources/")[0]
        return self._operation(parent, "delete", {"@type": _EMPTY_TYPE})

    def _operation(self, parent: str, verb: str, response: dict[str, Any]) -> dict[str, Any]:
        return {
            "name": f"{parent}/operations/operation-{verb}-{uuid.uuid4().hex[:12]}",
            "metadata": {"@type": "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata", "verb": verb},
            "done": True,
            "response": response,
        }

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
        if qr.state == "FAILED":
            out["state"]["failedData"] = {"error": {"code": 8, "message": "There is no more capacity in the zone"}}
        return out

    def _node_json(self, n: _Node) -> dict[str, Any]:
        out = {k: v for k, v in n.body.items() if k not in ("name", "state")}
        out.update(
            name=n.name,
            state=n.state,
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
        entries = []
        for h in n.hosts:
            key = self.reported_keys.get(h.address, h.host_key)
            items = []
            if key:
                key_type, value = key.split()[:2]
                items.append({"namespace": "hostkeys", "key": key_type, "value": value})
            entries.append({"queryPath": "hostkeys/", "queryValue": {"items": items}})
        return {"guestAttributes": entries}

    def handle(self, method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        """Answer one API request (``path`` without ``/v2/`` and query)."""
        with self.lock:
            self.log.append((method, path, body))
            self._advance_all()
            parts = path.split("/")
            if len(parts) < 4 or parts[0] != "projects" or parts[2] != "locations":
                raise _ApiError(404, "NOT_FOUND", f"no such resource {path}")
            parent = "/".join(parts[:4])
            rest = parts[4:]
            if rest == ["queuedResources"]:
                if method == "POST":
                    return self._create_qr(parent, query, body)
                return {"queuedResources": [self._qr_json(q) for q in self.queued.values() if q.name.startswith(parent + "/")]}
            if len(rest) == 2 and rest[0] == "queuedResources":
                qr = self.queued.get(path)
                if method == "DELETE":
                    return self._delete_qr(path, query)
                if qr is None:
                    raise _ApiError(404, "NOT_FOUND", f"queued resource {path} not found")
                return self._qr_json(qr)
            if rest == ["nodes"]:
                return {"nodes": [self._node_json(n) for n in self.nodes.values() if n.name.startswith(parent + "/")]}
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
                # Every operation is done when it is returned; asking again gives that answer.
                return {"name": path, "done": True, "response": {"@type": _EMPTY_TYPE}}
            raise _ApiError(404, "NOT_FOUND", f"no such resource {path}")

    def _control(self, method: str, path: str) -> dict[str, Any]:
        parts = path.strip("/").split("/")[1:]
        if method == "POST" and len(parts) == 2 and parts[0] == "preempt":
            self.preempt(parts[1])
            return {"preempted": parts[1]}
        if method == "POST" and len(parts) == 2 and parts[0] == "fail":
            self.fail_next(int(parts[1]))
            return {"fail_next": int(parts[1])}
        if method == "GET" and parts == ["state"]:
            with self.lock:
                self._advance_all()
                return {
                    "queued_resources": {q.split("/")[-1]: r.state for q, r in self.queued.items()},
                    "nodes": {n.split("/")[-1]: {"state": v.state, "hosts": [h.address for h in v.hosts]}
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
                        emulator._unavailable(acted=False)
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
    return [EmulatedHost(h.ip, key, h.start, h.stop, lambda h=h: h.running) for h in fleet.hosts]


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
