"""An ACTIVE queued resource's nodes: read into slices with their host keys, and judged gone or unwell.

Each node is one slice (slice 0 first); its workers' endpoints, in worker order, are the
slice's hosts, and the keys the guest attributes report are the hosts' trusted keys.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from marinbuild.backends.tpu.activation import CapacityUnavailable, ProvisionCancelled, StepApi
from marinbuild.backends.tpu.cluster import GcpSettings, SliceSpec, SshSettings
from marinbuild.backends.tpu.tpu_api import NodeInfo, QueuedResourceInfo, QueuedResourceSpec, TpuApi, TpuApiError
from marinbuild.tpu_types import tpu_topology

__all__ = ["NodeHealth", "ProvisionedSlices", "judge_nodes", "read_slices_patiently"]

_GONE_STATES = frozenset({"PREEMPTED", "TERMINATED", "STOPPED", "STOPPING", "DELETING", "HIDDEN", "HIDING"})
_UNWELL_STATES = frozenset({"REPAIRING", "UNKNOWN", "RESTARTING", "REIMAGING"})
"""Node states in which the slice cannot be trusted with the step: it is lost (re-provisioned)."""
_UNWELL_HEALTH = frozenset({"TIMEOUT", "UNHEALTHY_TENSORFLOW", "UNHEALTHY_MAINTENANCE"})
_RUNTIME_PORT = 8470  # the port Google's API reports for TPU workers (the runtime's)
_KEY_ORDER = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")


@dataclass(frozen=True)
class ProvisionedSlices:
    """One ACTIVE queued resource: a slice spec per node (slice 0 first) and their host keys."""

    queued_resource: str
    specs: tuple[SliceSpec, ...]
    host_keys: Mapping[str, tuple[str, ...]]
    """SSH address -> the ``TYPE BASE64`` keys guest attributes report (absent: none reported)."""


def read_slices_patiently(asking: StepApi, ssh: SshSettings, spec: QueuedResourceSpec,
                          cancel: threading.Event) -> ProvisionedSlices:
    """The ACTIVE queued resource's nodes, asked again while the API says "try again"
    (until ``ssh_ready_timeout``): a burst of 503s must not cost a slice that is there."""
    deadline = asking.clock() + asking.gcp.ssh_ready_timeout
    while True:
        try:
            return _read_slices(asking.api, asking.gcp, ssh, spec)
        except TpuApiError as e:
            if not e.transient or asking.clock() >= deadline:
                raise
            asking.report(f"queued resource {spec.name} is ACTIVE; the TPU API answers \"try again\" "
                          f"for its nodes; asking again ({e})")
        if cancel.wait(asking.poll):
            raise ProvisionCancelled(f"cancelled while the nodes of queued resource {spec.name} were read")


def _read_slices(api: TpuApi, gcp: GcpSettings, ssh: SshSettings, spec: QueuedResourceSpec) -> ProvisionedSlices:
    specs: list[SliceSpec] = []
    keys: dict[str, tuple[str, ...]] = {}
    vms = tpu_topology(spec.tpu_type).vm_count
    for node in _nodes_of(api, spec):
        name = node.name
        if not node.addresses:
            raise CapacityUnavailable(f"queued resource {spec.name} is ACTIVE but node {name} has no endpoints")
        if len(node.addresses) != vms:
            raise TpuApiError(f"node {name} has {len(node.addresses)} worker(s) but {spec.tpu_type} has {vms}")
        addresses = node.addresses
        if gcp.external_ips:
            if not all(node.external_addresses):
                raise TpuApiError(f"node {name} has a worker without an external IP (external_ips = true)")
            addresses = tuple(a for a in node.external_addresses if a)
        ports = node.ports or (0,) * len(addresses)
        hosts = tuple(_host_entry(gcp, ssh, a, p) for a, p in zip(addresses, ports, strict=False))
        reported: list[tuple[str, ...]] = api.host_keys(name)
        for entry, worker_keys in zip(hosts, reported, strict=False):
            if worker_keys:
                keys[entry] = _preferred_first(worker_keys)
        specs.append(SliceSpec(name, spec.tpu_type, hosts, ssh, node.addresses, gcp.preemptible))
    return ProvisionedSlices(spec.name, tuple(specs), keys)


def _nodes_of(api: TpuApi, spec: QueuedResourceSpec) -> list[NodeInfo]:
    """The queued resource's nodes, slice 0 first: by the names asked for, else as the API lists them."""
    named = [api.node(name) for name in spec.node_names()]
    if all(n is not None for n in named):
        return [n for n in named if n is not None]
    listed = api.nodes_of(spec.name)
    if len(listed) != spec.count:
        raise CapacityUnavailable(f"queued resource {spec.name} is ACTIVE but has {len(listed)} of {spec.count} nodes")
    return listed


def _host_entry(gcp: GcpSettings, ssh: SshSettings, address: str, port: int) -> str:
    """The SSH host entry of a worker: its address, on ``[ssh] port`` (22 unless set).

    An emulator (an ``http://`` API) may put each loopback host's SSH port in its endpoint;
    Google's API gives the TPU runtime's port there (8470), never SSH's, so it is not used.
    """
    emulated = (gcp.api_endpoint or "").startswith("http://")
    if not emulated or ssh.port is not None or port in (0, _RUNTIME_PORT):
        return address
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def _preferred_first(keys: tuple[str, ...]) -> tuple[str, ...]:
    """Keys in the order paramiko should ask for them (it asks for the first type only)."""
    def rank(line: str) -> int:
        kind = line.split()[0]
        return _KEY_ORDER.index(kind) if kind in _KEY_ORDER else len(_KEY_ORDER)

    return tuple(sorted(keys, key=rank))


@dataclass(frozen=True)
class NodeHealth:
    """What the API says of a slice set's nodes: those ``lost``, and how the unwell among them are."""

    lost: tuple[str, ...] = ()
    """Gone (preempted, deleted), or unwell; every node when the queued resource is gone or not ACTIVE."""
    unwell: Mapping[str, str] = field(default_factory=dict)
    """Node -> its health other than HEALTHY (``UNHEALTHY_MAINTENANCE``) or its state (``REPAIRING``)."""


def judge_nodes(info: QueuedResourceInfo | None, specs: tuple[SliceSpec, ...],
                node_of: Callable[[str], NodeInfo | None]) -> NodeHealth:
    """The health of the nodes ``specs`` name, their queued resource being ``info`` (None: gone)."""
    everything = tuple(s.name for s in specs)
    if info is None:
        return NodeHealth(everything)
    gone = []
    unwell: dict[str, str] = {}
    for s in specs:
        node = node_of(s.name)
        if node is None or node.state in _GONE_STATES:
            gone.append(s.name)
        elif node.state in _UNWELL_STATES or node.health in _UNWELL_HEALTH:
            unwell[s.name] = node.health if node.health in _UNWELL_HEALTH else node.state
    # A spot queued resource goes SUSPENDING/SUSPENDED when one of its nodes is preempted:
    # the nodes say which; when none does, the whole slice set is gone.
    if info.state != "ACTIVE" and not gone:
        return NodeHealth(everything, unwell)
    return NodeHealth(tuple(gone) or tuple(unwell), unwell)
