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
"""Calls answered "try again" (429, 500, 502, 503, 504, a deadline) are made this many times in all,
waiting ``[gcp] api_retry_delay`` before the first retry and twice as long before each next."""
_NOT_LABEL = re.compile(r"[^a-z0-9_-]+")


class TpuApiError(MarinbuildError):
    """A TPU API call failed; the message is one line naming the call.

    ``final``: the API refused the request itself (400, 403: a field, a permission, the
    API not enabled), which no retry changes. ``transient``: it kept answering "try again".
    """

    def __init__(self, message: str, *, final: bool = False, transient: bool = False) -> None:
        super().__init__(message)
        self.final = final
        self.transient = transient


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
    """Shorthand of ``tier="spot"`` (what ``[gcp] spot = true`` always meant)."""
    labels: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)
    description: str = ""
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    tags: Sequence[str] = ()
    external_ips: bool = False
    tier: str = ""
    """``on-demand``, ``spot``, ``reserved`` or ``best-effort`` ("": by ``spot``)."""
    reservation: str | None = None
    """A named reservation for the ``reserved`` tier (``reservation_name``)."""
    valid_for_s: float | None = None
    """The server's own bound (``queueing_policy.valid_until_duration``): not ACTIVE by then, never."""

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
    error_code: int = 0
    """The FAILED one's ``google.rpc.Code`` (8: RESOURCE_EXHAUSTED, 3: INVALID_ARGUMENT, ...); 0: none given."""


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
    health: str = "HEALTHY"
    """``HEALTHY``, ``TIMEOUT``, ``UNHEALTHY_MAINTENANCE``, ... (``HEALTH_UNSPECIFIED`` when not said)."""


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
        delay = self.gcp.api_retry_delay  # the first wait; each next one doubles
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
                        f"TPU API: {what} in {self.parent} failed ({tries} tries): {_why(e)}", transient=True
                    ) from None
                time.sleep(delay)
                delay *= 2
            except (exceptions.Forbidden, exceptions.Unauthorized, exceptions.BadRequest) as e:
                raise TpuApiError(_refusal(what, self.gcp.project, e), final=True) from None
            except Exception as e:
                raise TpuApiError(f"TPU API: {what} in {self.parent} failed: {_why(e)}") from None
        raise AssertionError("unreachable")

    def create(self, spec: QueuedResourceSpec) -> Any:
        """Ask for the queued resource; it starts queued, and :meth:`get` follows it.

        Returns the create's long-running operation (None when a retry met the queued resource
        already made): :meth:`operation_state` says whether it is done and how it ended.
        """
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
        tier = spec.tier or ("spot" if spec.spot else "on-demand")
        # Set before the node is put in its spec: proto-plus copies a message on assignment.
        if tier == "reserved":
            node.scheduling_config = t.SchedulingConfig(reserved=True)
        elif tier == "best-effort":
            # tpu_v2 has no best_effort field (v2alpha1 does): its VMs are the preemptible kind.
            node.scheduling_config = t.SchedulingConfig(preemptible=True)
        node_spec = t.QueuedResource.Tpu.NodeSpec(parent=self.parent, node=node)
        if spec.count == 1:
            node_spec.node_id = spec.name
        else:
            node_spec.multislice_params = t.QueuedResource.Tpu.NodeSpec.MultisliceParams(
                node_count=spec.count, node_id_prefix=spec.name
            )
        qr = t.QueuedResource(tpu=t.QueuedResource.Tpu(node_spec=[node_spec]))
        if tier == "spot":
            qr.spot = t.QueuedResource.Spot()
        elif tier == "reserved":
            # tpu_v2 spells the reserved tier as guaranteed capacity from the project's reservations.
            qr.guaranteed = t.QueuedResource.Guaranteed()
            if spec.reservation:
                qr.reservation_name = _reservation_path(spec.reservation, self.gcp)
        if spec.valid_for_s:
            from datetime import timedelta

            qr.queueing_policy = t.QueuedResource.QueueingPolicy(
                valid_until_duration=timedelta(seconds=round(spec.valid_for_s)))
        return self._call(f"creating queued resource {spec.name}", self._client.create_queued_resource,
                          parent=self.parent, queued_resource=qr, queued_resource_id=spec.name)

    def operation_state(self, operation: Any, what: str) -> tuple[bool, str | None]:
        """Whether a long-running operation is done, and the error it ended with (one line).

        Asking is one GET of the operation; a passing "try again" answer counts as not done.
        """
        if operation is None:
            return True, None
        try:
            done = self._call(f"reading the operation of {what}", lambda timeout: operation.done(retry=None))
        except TpuApiError as e:
            if e.transient:
                return False, None
            raise
        if not done:
            return False, None
        error = operation.exception(timeout=0)
        return True, None if error is None else _why(error)

    def get(self, name: str) -> QueuedResourceInfo | None:
        """The queued resource called ``name``; None when there is none (deleted)."""
        from google.api_core import exceptions

        try:
            qr = self._call(f"reading queued resource {name}", self._client.get_queued_resource,
                            name=f"{self.parent}/queuedResources/{name}")
        except exceptions.NotFound:
            return None
        return self._info(qr)

    def accelerator_types(self) -> list[str]:
        """The accelerator types the zone offers (``v4-8``, ...)."""
        pages = self._call("listing accelerator types", self._client.list_accelerator_types, parent=self.parent)
        return [a.type_ for a in pages]

    def runtime_versions(self) -> list[str]:
        """The runtime versions the zone offers."""
        pages = self._call("listing runtime versions", self._client.list_runtime_versions, parent=self.parent)
        return [v.version for v in pages]

    def queued_resources(self) -> list[QueuedResourceInfo]:
        """Every queued resource in the zone."""
        pages = self._call("listing queued resources", self._client.list_queued_resources, parent=self.parent)
        try:
            return [self._info(qr) for qr in pages]
        except Exception as e:  # a later page can fail too
            raise TpuApiError(f"TPU API: listing queued resources in {self.parent} failed: {_why(e)}") from None

    def delete(self, name: str, *, force: bool = True, wait: float | None = None, tries: int | None = None) -> bool:
        """Delete the queued resource and its nodes (asking ``tries`` times at most, 5 by default);
        False when it was already gone.

        The delete is a long-running operation (a minute or more on Google's API): once the API
        has accepted it the queued resource is DELETING, which counts as deleted, and this
        returns; ``wait`` seconds waits for the operation too."""
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

    def nodes(self) -> list[NodeInfo]:
        """Every node in the zone."""
        pages = self._call("listing nodes", self._client.list_nodes, parent=self.parent)
        try:
            return [_node_info(n) for n in pages]
        except Exception as e:  # a later page can fail too
            raise TpuApiError(f"TPU API: listing nodes in {self.parent} failed: {_why(e)}") from None

    def nodes_of(self, queued_resource: str) -> list[NodeInfo]:
        """The nodes the API says belong to ``queued_resource``, by name (slice order for ``NAME-i``)."""
        mine = [n for n in self.nodes() if n.queued_resource == queued_resource]
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
            out.append(tuple(line for item in worker.query_value.items
                             if item.key and item.value and item.namespace in ("", "hostkeys")
                             for line in _key_lines(item.key, item.value)))
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
        failed = qr.state.state.name == "FAILED"
        error = qr.state.failed_data.error.message or None if failed else None
        code = int(qr.state.failed_data.error.code or 0) if failed else 0
        return QueuedResourceInfo(
            name=_short(qr.name),
            state=qr.state.state.name,
            tpu_type=node.accelerator_type if node is not None else "",
            node_names=names,
            labels=dict(node.labels) if node is not None else {},
            description=node.description if node is not None else "",
            created=_epoch_seconds(qr.create_time),
            error=error,
            error_code=code,
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
        health=n.health.name,
    )


def _reservation_path(name: str, gcp: GcpSettings) -> str:
    """A reservation's full name: as given when it is one, else in the project and zone.

    >>> _reservation_path("r1", GcpSettings("my-project", "us-central2-b"))
    'projects/my-project/locations/us-central2-b/reservations/r1'
    """
    if name.startswith("projects/"):
        return name
    return f"projects/{gcp.project}/locations/{gcp.zone}/reservations/{name}"


def _key_lines(key: str, value: str) -> list[str]:
    r"""``TYPE BASE64`` lines from a guest attribute, as the guest agent writes them: the key
    names the type and the value is the key, or the value holds whole ``TYPE BASE64 [comment]``
    lines, several of them newline-joined.

    >>> _key_lines("ssh-ed25519", "AAAA"), _key_lines("ssh-ed25519", "ssh-ed25519 AAAA root@vm")
    (['ssh-ed25519 AAAA'], ['ssh-ed25519 AAAA'])
    >>> _key_lines("keys", "ssh-rsa BBBB\necdsa-sha2-nistp256 CCCC x@y\n")
    ['ssh-rsa BBBB', 'ecdsa-sha2-nistp256 CCCC']
    """
    out = []
    for line in value.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.append(f"{parts[0]} {parts[1]}")
        elif len(parts) == 1:
            out.append(f"{key} {parts[0]}")
    return out


_URL = re.compile(r"\b(?:GET|POST|DELETE|PATCH|PUT) https?://\S+:?\s*|https?://\S+")
_PERMISSION = re.compile(r"Permission '([^']+)'")


def _why(e: BaseException) -> str:
    """The API's message in one line, without the request's URL (``POST http://…?%24alt=json…``)."""
    text = str(getattr(e, "message", "") or e)
    text = " ".join(_URL.sub("", text).split())
    return text or type(e).__name__


def _refusal(what: str, project: str, e: BaseException) -> str:
    """One line for a request the API refused: the permission or field it names, and the fix's place."""
    why = _why(e)
    permission = _PERMISSION.search(why)
    if permission is not None:
        return (f"TPU API: {what} refused in project {project}: permission {permission.group(1)} is missing "
                f"(grant a role holding it, such as roles/tpu.admin, to the credentials in use)")
    if isinstance(e, _exceptions().Unauthorized):
        return (f"TPU API: {what} refused in project {project}: not authenticated "
                "(gcloud auth application-default login)")
    return f"TPU API: {what} refused in project {project}: {why}"


def _exceptions() -> Any:
    from google.api_core import exceptions

    return exceptions
