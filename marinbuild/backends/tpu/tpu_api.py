"""The Cloud TPU API as marinbuild uses it: queued resources, their nodes, and host keys.

A thin layer over ``google-cloud-tpu`` (``tpu_v2``, REST transport) returning small values,
and turning the client's exceptions into one-line :class:`TpuApiError` messages::

    api = TpuApi(GcpSettings("my-project", "us-central2-b", "tpu-ubuntu2204-base"))
    api.create(QueuedResourceSpec("mb-train-1a2b", "v4-32", count=2, runtime_version=...))
    api.get("mb-train-1a2b").state          # "WAITING_FOR_RESOURCES", ..., "ACTIVE"
    api.node("mb-train-1a2b-0").addresses   # worker 0 first

An ``http://`` endpoint (``[gcp] api_endpoint``) is an emulator and gets anonymous
credentials; otherwise the client finds Application Default Credentials as ``gcloud`` does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from marinbuild.backends.tpu.cluster import GcpSettings
from marinbuild.errors import MarinbuildError, MissingExtra

__all__ = [
    "LABEL_PREFIX",
    "NodeInfo",
    "QueuedResourceInfo",
    "QueuedResourceSpec",
    "TpuApi",
    "TpuApiError",
    "label_value",
]

LABEL_PREFIX = "marinbuild"
"""Label key (and key prefix) on every node marinbuild creates: how its leftovers are found."""
_TIMEOUT_S = 60.0
_TRIES = 5
"""Calls answered "try again" (429, 500, 502, 503, 504, a deadline) are made this many times in all."""
_RETRY_DELAY_S = 0.5
"""The first wait before such a retry; each next one doubles (0.5 + 1 + 2 + 4 s in all)."""
_NOT_LABEL = re.compile(r"[^a-z0-9_-]+")


class TpuApiError(MarinbuildError):
    """A TPU API call failed; the message is one line naming the call."""


def label_value(text: str) -> str:
    """``text`` as a GCP label value: lowercase letters, digits, ``-`` and ``_``, at most 63.

    >>> label_value("Sweep/LR=0.1")
    'sweep-lr-0-1'
    """
    return _NOT_LABEL.sub("-", text.lower())[:63]


@dataclass(frozen=True)
class QueuedResourceSpec:
    """What to ask for: ``count`` nodes (slices) of ``tpu_type``, named after ``name``."""

    name: str
    tpu_type: str
    count: int
    runtime_version: str
    spot: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    tags: Sequence[str] = ()
    external_ips: bool = False

    def node_names(self) -> tuple[str, ...]:
        """The nodes' names, slice 0 first: the queued resource's own for one, ``NAME-i`` for several."""
        return (self.name,) if self.count == 1 else tuple(f"{self.name}-{i}" for i in range(self.count))


@dataclass(frozen=True)
class QueuedResourceInfo:
    """A queued resource as listed: short name, state, what it holds, and marinbuild's labels."""

    name: str
    state: str
    tpu_type: str
    node_names: tuple[str, ...]
    labels: Mapping[str, str]
    description: str
    created: float | None
    """Seconds since the epoch; None when the API gave none."""
    error: str | None = None
    """Why a FAILED one failed, when the API says."""


@dataclass(frozen=True)
class NodeInfo:
    """A node (one slice): its state and its workers' addresses, worker 0 first."""

    name: str
    state: str
    addresses: tuple[str, ...]
    external_addresses: tuple[str | None, ...]
    ports: tuple[int, ...] = ()
    """Each endpoint's port as the API gives it (0: none); Google's API gives the TPU runtime's."""
    queued_resource: str = ""
    """The short name of the queued resource the node belongs to, when it says."""


def _client_module() -> Any:
    try:
        from google.cloud import tpu_v2
    except ImportError:
        raise MissingExtra(
            "TPU slices created on demand ([gcp] in the cluster file) need google-cloud-tpu, which is not "
            "installed: pip install 'marinbuild[tpu]' (in a checkout: pip install -e '.[tpu]')"
        ) from None
    return tpu_v2


def _short(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _epoch_seconds(ts: Any) -> float | None:
    try:
        t = ts.timestamp()
    except (AttributeError, ValueError, OverflowError):
        return None
    return float(t) if t > 0 else None


class TpuApi:
    """A client of the TPU API for one project and zone (close it, or use ``with``)."""

    def __init__(self, gcp: GcpSettings) -> None:
        self.gcp = gcp
        self._tpu = _client_module()
        self.parent = f"projects/{gcp.project}/locations/{gcp.zone}"
        options: dict[str, Any] = {}
        credentials = None
        if gcp.api_endpoint:
            options["api_endpoint"] = gcp.api_endpoint
            if gcp.api_endpoint.startswith("http://"):
                from google.auth.credentials import AnonymousCredentials

                credentials = AnonymousCredentials()
        try:
            self._client = self._tpu.TpuClient(transport="rest", credentials=credentials, client_options=options)
        except Exception as e:  # missing credentials, a bad endpoint: one line, not a traceback
            raise TpuApiError(f"TPU API for {self.parent}: cannot create a client: {_why(e)}") from None

    def close(self) -> None:
        transport = getattr(self._client, "transport", None)
        if transport is not None:
            transport.close()

    def __enter__(self) -> TpuApi:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, what: str, fn: Any, *args: Any, tries: int = _TRIES, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, retried while the API answers "try again" (up to ``tries``
        times in all); NotFound passes through.

        Google's APIs answer 503 or 429 now and then: giving up at once would end an attempt
        (losing the queue position of a slice still waiting for capacity) or leave a queued
        resource undeleted. A create retried after an answer that was lost on the way may meet
        its own queued resource (ALREADY_EXISTS): that is success, the name being ours alone.
        """
        from google.api_core import exceptions

        transient = (exceptions.TooManyRequests, exceptions.InternalServerError, exceptions.BadGateway,
                     exceptions.ServiceUnavailable, exceptions.GatewayTimeout, exceptions.DeadlineExceeded)
        delay = _RETRY_DELAY_S
        for attempt in range(1, tries + 1):
            try:
                return fn(*args, timeout=_TIMEOUT_S, **kwargs)
            except exceptions.NotFound:
                raise
            except exceptions.Conflict as e:
                if attempt > 1:
                    return None
                raise TpuApiError(f"TPU API: {what} in {self.parent} failed: {_why(e)}") from None
            except transient as e:
                if attempt == tries:
                    raise TpuApiError(
                        f"TPU API: {what} in {self.parent} failed ({tries} tries): {_why(e)}"
                    ) from None
                time.sleep(delay)
                delay *= 2
            except Exception as e:
                raise TpuApiError(f"TPU API: {what} in {self.parent} failed: {_why(e)}") from None
        raise AssertionError("unreachable")

    def create(self, spec: QueuedResourceSpec) -> None:
        """Ask for the queued resource; it starts queued, and :meth:`get` follows it."""
        t = self._tpu
        node = t.Node(
            accelerator_type=spec.tpu_type,
            runtime_version=spec.runtime_version,
            description=spec.description,
            labels=dict(spec.labels),
            metadata=dict(spec.metadata),
            tags=list(spec.tags),
            network_config=t.NetworkConfig(
                network=spec.network or "", subnetwork=spec.subnetwork or "", enable_external_ips=spec.external_ips
            ),
        )
        if spec.service_account:
            node.service_account = t.ServiceAccount(email=spec.service_account)
        node_spec = t.QueuedResource.Tpu.NodeSpec(parent=self.parent, node=node)
        if spec.count == 1:
            node_spec.node_id = spec.name
        else:
            node_spec.multislice_params = t.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=spec.count, node_id_prefix=spec.name
            )
        qr = t.QueuedResource(tpu=t.QueuedResource.Tpu(node_spec=[node_spec]))
        if spec.spot:
            qr.spot = t.QueuedResource.Spot()
        self._call(f"creating queued resource {spec.name}", self._client.create_queued_resource,
                   parent=self.parent, queued_resource=qr, queued_resource_id=spec.name)

    def get(self, name: str) -> QueuedResourceInfo | None:
        """The queued resource called ``name``; None when there is none (deleted)."""
        from google.api_core import exceptions

        try:
            qr = self._call(f"reading queued resource {name}", self._client.get_queued_resource,
                            name=f"{self.parent}/queuedResources/{name}")
        except exceptions.NotFound:
            return None
        return self._info(qr)

    def queued_resources(self) -> list[QueuedResourceInfo]:
        """Every queued resource in the zone."""
        pages = self._call("listing queued resources", self._client.list_queued_resources, parent=self.parent)
        try:
            return [self._info(qr) for qr in pages]
        except Exception as e:  # a later page can fail too
            raise TpuApiError(f"TPU API: listing queued resources in {self.parent} failed: {_why(e)}") from None

    def delete(self, name: str, *, force: bool = True, wait: float | None = _TIMEOUT_S, tries: int | None = None) -> bool:
        """Delete the queued resource and its nodes (asking ``tries`` times at most, 5 by default);
        False when it was already gone."""
        from google.api_core import exceptions

        request = self._tpu.DeleteQueuedResourceRequest(name=f"{self.parent}/queuedResources/{name}", force=force)
        try:
            operation = self._call(f"deleting queued resource {name}", self._client.delete_queued_resource,
                                   request=request, tries=tries or _TRIES)
        except exceptions.NotFound:
            return False
        if wait:
            try:
                self._call(f"waiting for the deletion of queued resource {name}",
                           lambda timeout: operation.result(timeout=wait))
            except exceptions.NotFound:
                return True
        return True

    def node(self, name: str) -> NodeInfo | None:
        """The node called ``name``; None when there is none."""
        from google.api_core import exceptions

        try:
            n = self._call(f"reading node {name}", self._client.get_node, name=f"{self.parent}/nodes/{name}")
        except exceptions.NotFound:
            return None
        return _node_info(n)

    def nodes_of(self, queued_resource: str) -> list[NodeInfo]:
        """The nodes the API says belong to ``queued_resource``, by name (slice order for ``NAME-i``)."""
        pages = self._call("listing nodes", self._client.list_nodes, parent=self.parent)
        try:
            found = [_node_info(n) for n in pages]
        except Exception as e:  # a later page can fail too
            raise TpuApiError(f"TPU API: listing nodes in {self.parent} failed: {_why(e)}") from None
        mine = [n for n in found if n.queued_resource == queued_resource]
        return sorted(mine, key=lambda n: (len(n.name), n.name))

    def host_keys(self, name: str) -> list[tuple[str, ...]]:
        """Each worker's SSH host keys (``TYPE BASE64``), worker 0 first, from guest attributes.

        A worker the API knows no key of gets an empty tuple; the list is empty when the API
        reports nothing at all (a node still booting, an image without the guest agent).
        """
        from google.api_core import exceptions

        request = self._tpu.GetGuestAttributesRequest(name=f"{self.parent}/nodes/{name}", query_path="hostkeys/")
        try:
            answer = self._call(f"reading host keys of node {name}", self._client.get_guest_attributes,
                                request=request)
        except exceptions.NotFound:
            return []
        out: list[tuple[str, ...]] = []
        for worker in answer.guest_attributes:
            out.append(tuple(_key_line(item.key, item.value) for item in worker.query_value.items
                             if item.key and item.value and item.namespace in ("", "hostkeys")))
        return out

    def _info(self, qr: Any) -> QueuedResourceInfo:
        specs = list(qr.tpu.node_spec)
        node = specs[0].node if specs else None
        names: tuple[str, ...] = ()
        if specs:
            spec = specs[0]
            if spec.node_id:
                names = (spec.node_id,)
            elif spec.multislice_params.node_count:
                prefix = spec.multislice_params.node_id_prefix or _short(qr.name)
                names = tuple(f"{prefix}-{i}" for i in range(spec.multislice_params.node_count))
        error = qr.state.failed_data.error.message or None if qr.state.state.name == "FAILED" else None
        return QueuedResourceInfo(
            name=_short(qr.name),
            state=qr.state.state.name,
            tpu_type=node.accelerator_type if node is not None else "",
            node_names=names,
            labels=dict(node.labels) if node is not None else {},
            description=node.description if node is not None else "",
            created=_epoch_seconds(qr.create_time),
            error=error,
        )


def _node_info(n: Any) -> NodeInfo:
    endpoints = list(n.network_endpoints)
    return NodeInfo(
        name=_short(n.name),
        state=n.state.name,
        addresses=tuple(e.ip_address for e in endpoints),
        external_addresses=tuple((e.access_config.external_ip or None) for e in endpoints),
        ports=tuple(int(e.port or 0) for e in endpoints),
        queued_resource=_short(n.queued_resource) if n.queued_resource else "",
    )


def _key_line(key: str, value: str) -> str:
    """``TYPE BASE64`` from a guest attribute: the key names the type, the value is the key
    (some agents put the whole ``TYPE BASE64`` line in the value).

    >>> _key_line("ssh-ed25519", "AAAA"), _key_line("ssh-ed25519", "ssh-ed25519 AAAA root@vm")
    ('ssh-ed25519 AAAA', 'ssh-ed25519 AAAA')
    """
    parts = value.split()
    if len(parts) >= 2:
        return f"{parts[0]} {parts[1]}"
    return f"{key} {value.strip()}"


def _why(e: BaseException) -> str:
    text = " ".join(str(getattr(e, "message", "") or e).split())
    return text or type(e).__name__
