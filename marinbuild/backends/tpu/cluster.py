"""The cluster file: which TPU slices exist, their hosts, and how to reach them over SSH.

A cluster file is TOML. ``[ssh]`` holds defaults; each ``[[slices]]`` entry names a slice,
its TPU type and its hosts, worker 0 first, and may override any ``[ssh]`` key in its own
``ssh`` table::

    max_parallel = 32              # SSH connections opened at once

    [ssh]
    user = "marin"
    identity_file = "~/.ssh/google_compute_engine"

    [[slices]]
    name = "pod-a"
    tpu_type = "v4-32"
    hosts = ["10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5"]

    [[slices]]
    name = "pod-b"
    tpu_type = "v4-32"
    hosts = ["b0", "b1", "b2", "b3"]       # aliases resolved through ~/.ssh/config
    ssh = { user = "ops", port = 2222 }

A slice marked ``preemptible = true`` (spot or preemptible VMs) is never given to a step
declaring ``ResourceConfig(preemptible=False)``.

A host may be written ``[user@]host[:port]``. ``internal_addresses`` (optional, one per
host) gives the addresses the hosts use to reach each other when they differ from the
ones used for SSH; the coordinator addresses are built from them.

A ``[gcp]`` table, beside or instead of ``[[slices]]``, lets marinbuild create slices on
demand as queued resources (see :class:`GcpSettings`)::

    [gcp]
    project = "my-project"
    zone = "us-central2-b"
    runtime_version = "tpu-ubuntu2204-base"
    spot = true
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from marinbuild.backends.cluster_file import read_toml
from marinbuild.errors import ClusterConfigError, MarinbuildError, ResourceError
from marinbuild.tpu_types import TpuTopology, tpu_topology

__all__ = [
    "CAPACITY_TIERS",
    "DEFAULT_API_RETRY_DELAY",
    "DEFAULT_HYGIENE_COMMAND",
    "DEFAULT_PROVISION_TIMEOUT",
    "DEFAULT_RUNTIME_VERSIONS",
    "DEFAULT_SSH_READY_TIMEOUT",
    "Cluster",
    "GcpSettings",
    "HostEntry",
    "SliceSpec",
    "SshSettings",
    "load_cluster",
    "parse_cluster",
    "parse_host_entry",
]

# A crashed run can leave a process holding the TPU and libtpu's lockfile behind; the next
# run then fails to open the device.  fuser is in psmisc, which TPU VM images ship; the
# /proc walk is the fallback when it is missing.
DEFAULT_HYGIENE_COMMAND = (
    "if command -v fuser >/dev/null 2>&1; then "
    "fuser -k -9 /dev/accel* /dev/vfio/* >/dev/null 2>&1; "
    "else for f in /proc/[0-9]*/fd/*; do "
    'case "$(readlink "$f" 2>/dev/null)" in /dev/accel*|/dev/vfio/*) '
    'p="${f#/proc/}"; kill -9 "${p%%/*}" 2>/dev/null;; esac; done; fi; '
    "rm -f /tmp/libtpu_lockfile 2>/dev/null || sudo -n rm -f /tmp/libtpu_lockfile 2>/dev/null; "
    "true"
)


@dataclass(frozen=True)
class SshSettings:
    """How to reach the hosts of a slice, and the ports and commands used on them.

    ``user``/``port``/``identity_file`` left as ``None`` fall back to ``~/.ssh/config``
    (``ssh_config``), then to the local user name, 22 and the usual key files or agent.

    >>> SshSettings().megascale_port
    8081
    """

    user: str | None = None
    port: int | None = None
    identity_file: str | None = None
    known_hosts: str = "~/.ssh/known_hosts"
    accept_unknown_host_keys: bool = False
    ssh_config: str | None = "~/.ssh/config"
    connect_timeout: float = 10.0
    coordinator_port: int = 8476
    megascale_port: int = 8081
    hygiene_command: str = DEFAULT_HYGIENE_COMMAND
    remote_workdir: str = "~/.marinbuild/work"
    kill_grace: float = 2.0
    python: str = "python3"
    """The interpreter that runs function steps on the hosts (it must import marinbuild)."""


@dataclass(frozen=True)
class HostEntry:
    """One ``[user@]host[:port]`` entry of a slice's host list.

    >>> parse_host_entry("ops@10.0.0.2:2222")
    HostEntry(host='10.0.0.2', user='ops', port=2222)
    """

    host: str
    user: str | None = None
    port: int | None = None


@dataclass(frozen=True)
class SliceSpec:
    """One TPU slice: its name, type, hosts (worker 0 first) and SSH settings."""

    name: str
    tpu_type: str
    hosts: tuple[str, ...]
    ssh: SshSettings = field(default_factory=SshSettings)
    internal_addresses: tuple[str, ...] = ()
    preemptible: bool = False
    """Marked ``preemptible = true`` in the cluster file: steps that must not be preempted avoid it."""

    @property
    def topology(self) -> TpuTopology:
        return tpu_topology(self.tpu_type)

    def host_entries(self) -> tuple[HostEntry, ...]:
        return tuple(parse_host_entry(h) for h in self.hosts)


DEFAULT_PROVISION_TIMEOUT = 3600.0
"""Seconds a queued resource may take to become ACTIVE, FAILED ones retried meanwhile (a slice
can take over 10 minutes to boot, and capacity can take longer to free up)."""
DEFAULT_SSH_READY_TIMEOUT = 600.0
"""Seconds after ACTIVE for every worker to report its host keys and accept the login: sshd,
the ``ssh-keys`` user and the guest agent's host keys arrive minutes after a VM boots."""
DEFAULT_API_RETRY_DELAY = 0.5
"""Seconds before the first retry of a TPU API call answered "try again" (429, 5xx, a deadline);
each next wait doubles, so a call's five tries span 0.5 + 1 + 2 + 4 s."""
_API_RETRY_DELAY_MAX = 60.0
"""Past a minute (doubled four times: a quarter of an hour per call) the setting is a typo."""
CAPACITY_TIERS = ("on-demand", "spot", "reserved", "best-effort")
"""``[gcp] capacity``: the queued resource's tier (Google's ``spot``, ``guaranteed.reserved``,
``best_effort``; on-demand is none of them)."""
DEFAULT_RUNTIME_VERSIONS: Mapping[str, str] = {
    "v4": "tpu-ubuntu2204-base",
    "v5p": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}
"""The TPU VM image per generation when the cluster file names none (``[gcp] runtime_versions``
wins, then ``runtime_version``, then these): one image does not boot every generation."""


@dataclass(frozen=True)
class GcpSettings:
    """The ``[gcp]`` table: where and how marinbuild creates TPU slices as queued resources.

    ``api_endpoint`` is the TPU API's address (Google's when None); an ``http://`` one on
    loopback is an emulator, reached without credentials.

    >>> g = GcpSettings("p", "us-central2-b")
    >>> g.region, g.provision_timeout, g.tier, g.runtime_for("v6e-8")
    ('us-central2', 3600.0, 'on-demand', 'v2-alpha-tpuv6e')
    """

    project: str
    zone: str
    runtime_version: str = ""
    """One image for every TPU type ("": the per-generation defaults)."""
    spot: bool = False
    network: str | None = None
    subnetwork: str | None = None
    service_account: str | None = None
    tags: tuple[str, ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    """Extra labels on every node created, as (key, value) pairs."""
    provision_timeout: float = DEFAULT_PROVISION_TIMEOUT
    api_endpoint: str | None = None
    os_login: bool = False
    """True: nodes log users in through OS Login, so no ``ssh-keys`` metadata is set."""
    external_ips: bool = True
    """True: nodes get external IPs and marinbuild connects to those, not to internal addresses."""
    capacity: str = ""
    """One of :data:`CAPACITY_TIERS`; "" reads ``spot`` (spot when true, else on-demand)."""
    reservation: str | None = None
    """A named reservation (``capacity = "reserved"``); None: any reservation of the project."""
    runtime_versions: tuple[tuple[str, str], ...] = ()
    """Per generation (``v6e``) or per type (``v6e-8``), as (key, image) pairs."""
    ssh_ready_timeout: float = DEFAULT_SSH_READY_TIMEOUT
    api_retry_delay: float = DEFAULT_API_RETRY_DELAY
    """Seconds before the first retry of an API call answered "try again"; each next wait doubles."""

    @property
    def region(self) -> str:
        """The zone's region: ``us-central2-b`` -> ``us-central2``."""
        return self.zone.rsplit("-", 1)[0] if self.zone.count("-") >= 2 else self.zone

    @property
    def tier(self) -> str:
        """The capacity tier asked for: ``capacity``, else ``spot`` read as it always was."""
        return self.capacity or ("spot" if self.spot else "on-demand")

    @property
    def preemptible(self) -> bool:
        """Whether the tier's VMs may be taken away (spot and best-effort)."""
        return self.tier in ("spot", "best-effort")

    def runtime_for(self, tpu_type: str) -> str:
        """The image for ``tpu_type``: the type's entry, its generation's, ``runtime_version``, the default."""
        table = dict(self.runtime_versions)
        generation = tpu_type.rsplit("-", 1)[0]
        found = table.get(tpu_type) or table.get(generation) or self.runtime_version
        return found or DEFAULT_RUNTIME_VERSIONS.get(generation, DEFAULT_RUNTIME_VERSIONS["v4"])


@dataclass(frozen=True)
class Cluster:
    """Every slice marinbuild may use, in file order, and how it may create more.

    >>> c = parse_cluster({"slices": [{"name": "a", "tpu_type": "v4-8", "hosts": ["h"]}]})
    >>> c.slices_by_type()
    {'v4-8': ('a',)}
    """

    slices: tuple[SliceSpec, ...]
    max_parallel: int = 32
    source: str = "<cluster>"
    gcp: GcpSettings | None = None
    """The ``[gcp]`` table: slices created on demand; None when the file has none."""
    ssh: SshSettings = field(default_factory=SshSettings)
    """The ``[ssh]`` table: how created slices are reached (static slices carry their own)."""
    progress_timeout: float | None = None
    """Top-level ``progress_timeout`` (seconds or ``"15m"``): the hang timeout of the steps run on
    this cluster that set none of their own; None: no hang detection by default."""

    def slices_by_type(self) -> dict[str, tuple[str, ...]]:
        """TPU type -> names of the slices of that type, in file order."""
        out: dict[str, list[str]] = {}
        for s in self.slices:
            out.setdefault(s.tpu_type, []).append(s.name)
        return {k: tuple(v) for k, v in out.items()}

    def slice(self, name: str) -> SliceSpec:
        """The slice called ``name``; a :class:`ClusterConfigError` when there is none."""
        for s in self.slices:
            if s.name == name:
                return s
        raise ClusterConfigError(f"{self.source}: no slice named {name!r}")


def parse_host_entry(text: str) -> HostEntry:
    """Split ``[user@]host[:port]`` (``[v6addr]:port`` for IPv6)."""
    user: str | None = None
    if "@" in text:
        user, text = text.rsplit("@", 1)
    port: int | None = None
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":"):
            port = int(rest[1:])
    elif text.count(":") == 1:
        host, _, p = text.partition(":")
        port = int(p)
    else:
        host = text
    if not host or (port is not None and not 0 < port < 65536):
        raise ValueError(text)
    return HostEntry(host, user or None, port)


_SSH_FIELDS = {f.name: f for f in fields(SshSettings)}
_SSH_TYPES: dict[str, type | tuple[type, ...]] = {
    "user": str, "identity_file": str, "ssh_config": str, "known_hosts": str,
    "hygiene_command": str, "remote_workdir": str, "accept_unknown_host_keys": bool, "python": str,
    "port": int, "coordinator_port": int, "megascale_port": int,
    "connect_timeout": (int, float), "kill_grace": (int, float),
}
_SLICE_KEYS = {"name", "tpu_type", "hosts", "ssh", "internal_addresses", "preemptible"}
_TOP_KEYS = {"ssh", "slices", "max_parallel", "gcp", "progress_timeout"}
_GCP_STRINGS = ("project", "zone", "runtime_version", "network", "subnetwork", "service_account", "api_endpoint",
                "capacity", "reservation")
_GCP_BOOLS = ("spot", "os_login", "external_ips")
_GCP_KEYS = {*_GCP_STRINGS, *_GCP_BOOLS, "tags", "labels", "provision_timeout", "runtime_versions", "ssh_ready_timeout",
             "api_retry_delay"}
# Google's rules: a project id is 6-30 lowercase letters, digits and hyphens (a domain-scoped one
# is ``example.com:id``); a zone is REGION-LETTER. Both go into API paths, so nothing else may pass.
_PROJECT = re.compile(r"(?:[a-z0-9][a-z0-9.-]{0,62}:)?[a-z][a-z0-9-]{4,28}[a-z0-9]\Z")
_ZONE = re.compile(r"[a-z]+(?:-[a-z]+)*[0-9]+-[a-z]\Z")
_RESOURCE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}\Z")
_SECONDS_MAX = {"connect_timeout": 3600.0, "kill_grace": 3600.0}
"""Upper bounds of the ``[ssh]`` numbers: past them a typo, not a setting (and sleep() overflows)."""
_LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}\Z")
_LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}\Z")


def _has_type(value: object, want: type | tuple[type, ...]) -> bool:
    # bool is an int to Python but never a port or a timeout here.
    return isinstance(value, bool) == (want is bool) and isinstance(value, want)


def _ssh_settings(base: SshSettings, table: Any, where: str) -> SshSettings:
    if not isinstance(table, Mapping):
        raise ClusterConfigError(f"{where}: 'ssh' must be a table")
    changes: dict[str, Any] = {}
    for key, value in table.items():
        f = _SSH_FIELDS.get(key)
        if f is None:
            raise ClusterConfigError(
                f"{where}: unknown ssh setting {key!r} (known: {', '.join(_SSH_FIELDS)})"
            )
        if not _has_type(value, _SSH_TYPES[key]):
            raise ClusterConfigError(f"{where}: ssh setting {key!r} has the wrong type")
        if key.endswith("port") and not 0 < value < 65536:
            raise ClusterConfigError(f"{where}: ssh setting {key!r} = {value} is not a port")
        if key in _SECONDS_MAX and not (0 < value <= _SECONDS_MAX[key] or (key == "kill_grace" and value == 0)):
            # NaN fails every comparison, so it lands here too.
            raise ClusterConfigError(
                f"{where}: ssh setting {key!r} = {value} must be a number of seconds "
                f"{'from 0' if key == 'kill_grace' else 'over 0'} to {_SECONDS_MAX[key]:g}"
            )
        changes[key] = float(value) if key in ("connect_timeout", "kill_grace") else value
    return replace(base, **changes)


def _parse_slice(raw: Any, index: int, defaults: SshSettings, source: str) -> SliceSpec:
    if not isinstance(raw, Mapping):
        raise ClusterConfigError(f"{source}: slices[{index}] must be a table")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise ClusterConfigError(f"{source}: slices[{index}] needs a non-empty 'name'")
    where = f"{source}: slice {name!r}"
    if name.startswith("@"):
        raise ClusterConfigError(f"{where}: a slice name may not start with '@' (kept for slices created on demand)")
    unknown = set(raw) - _SLICE_KEYS
    if unknown:
        raise ClusterConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    tpu_type = raw.get("tpu_type")
    if not isinstance(tpu_type, str):
        raise ClusterConfigError(f"{where}: needs a 'tpu_type' string such as \"v4-32\"")
    try:
        topo = tpu_topology(tpu_type)
    except ResourceError as e:
        raise ClusterConfigError(f"{where}: {e}") from None
    hosts = raw.get("hosts")
    if not isinstance(hosts, list) or not all(isinstance(h, str) and h for h in hosts):
        raise ClusterConfigError(f"{where}: 'hosts' must be a list of host names")
    if len(hosts) != topo.vm_count:
        raise ClusterConfigError(
            f"{where}: lists {len(hosts)} host(s) but {tpu_type} has {topo.vm_count} VM(s)"
        )
    for h in hosts:
        try:
            parse_host_entry(h)
        except ValueError:
            raise ClusterConfigError(f"{where}: bad host entry {h!r}") from None
    internal = raw.get("internal_addresses", [])
    if not isinstance(internal, list) or not all(isinstance(a, str) and a for a in internal):
        raise ClusterConfigError(f"{where}: 'internal_addresses' must be a list of addresses")
    if internal and len(internal) != len(hosts):
        raise ClusterConfigError(
            f"{where}: 'internal_addresses' has {len(internal)} entries for {len(hosts)} hosts"
        )
    ssh = _ssh_settings(defaults, raw.get("ssh", {}), where)
    preemptible = raw.get("preemptible", False)
    if not isinstance(preemptible, bool):
        raise ClusterConfigError(f"{where}: 'preemptible' must be true or false")
    return SliceSpec(name, tpu_type, tuple(hosts), ssh, tuple(internal), preemptible)


def _parse_gcp(raw: Any, source: str) -> GcpSettings:
    where = f"{source}: [gcp]"
    _check_gcp_keys(raw, where)
    tags, labels = _gcp_tags(raw, where), _gcp_labels(raw, where)
    _check_names(raw, where)
    timeout = _timeout(raw.get("provision_timeout", DEFAULT_PROVISION_TIMEOUT), "provision_timeout", where,
                       "must be a positive number of seconds")
    ready = _timeout(raw.get("ssh_ready_timeout", DEFAULT_SSH_READY_TIMEOUT), "ssh_ready_timeout", where,
                     "must be a positive number of seconds")
    retry_delay = _api_retry_delay(raw.get("api_retry_delay", DEFAULT_API_RETRY_DELAY), where)
    endpoint = raw.get("api_endpoint")
    if endpoint is not None and not endpoint.startswith(("http://", "https://")):
        raise ClusterConfigError(f"{where}: 'api_endpoint' must be an http:// or https:// URL, not {endpoint!r}")
    capacity = _capacity(raw, where)
    network_set = "network" in raw or "subnetwork" in raw
    return GcpSettings(
        project=raw["project"], zone=raw["zone"], runtime_version=raw.get("runtime_version", ""),
        spot=raw.get("spot", capacity == "spot"), network=raw.get("network"), subnetwork=raw.get("subnetwork"),
        service_account=raw.get("service_account"), tags=tags, labels=labels,
        provision_timeout=timeout, api_endpoint=endpoint,
        os_login=raw.get("os_login", False), external_ips=raw.get("external_ips", not network_set),
        capacity=capacity, reservation=raw.get("reservation"),
        runtime_versions=_runtime_versions(raw.get("runtime_versions", {}), where), ssh_ready_timeout=ready,
        api_retry_delay=retry_delay,
    )


def _check_gcp_keys(raw: Any, where: str) -> None:
    """A table of known keys, ``project`` and ``zone`` among them, each string and flag of its type."""
    if not isinstance(raw, Mapping):
        raise ClusterConfigError(f"{where} must be a table")
    unknown = set(raw) - _GCP_KEYS
    if unknown:
        raise ClusterConfigError(f"{where}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_GCP_KEYS))})")
    for key in ("project", "zone"):
        if key not in raw:
            raise ClusterConfigError(f"{where}: needs {key!r}")
    for key in _GCP_STRINGS:
        if key in raw and (not isinstance(raw[key], str) or not raw[key]):
            raise ClusterConfigError(f"{where}: {key!r} must be a non-empty string")
    for key in _GCP_BOOLS:
        if key in raw and not isinstance(raw[key], bool):
            raise ClusterConfigError(f"{where}: {key!r} must be true or false")


def _gcp_tags(raw: Mapping[str, Any], where: str) -> tuple[str, ...]:
    tags = raw.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) and t for t in tags):
        raise ClusterConfigError(f"{where}: 'tags' must be a list of strings")
    return tuple(tags)


def _gcp_labels(raw: Mapping[str, Any], where: str) -> tuple[tuple[str, str], ...]:
    labels = raw.get("labels", {})
    if not isinstance(labels, Mapping):
        raise ClusterConfigError(f"{where}: 'labels' must be a table of strings")
    for k, v in labels.items():
        if not _LABEL_KEY.match(k) or not isinstance(v, str) or not _LABEL_VALUE.match(v):
            raise ClusterConfigError(
                f"{where}: label {k!r} = {v!r} is not a GCP label (lowercase letters, digits, '-', '_'; "
                "keys start with a letter; at most 63 characters)"
            )
    return tuple(sorted(labels.items()))


def _capacity(raw: Mapping[str, Any], where: str) -> str:
    """``capacity``, agreeing with ``spot`` and ``reservation`` (a reservation alone reads as reserved)."""
    capacity: str = raw.get("capacity", "")
    if capacity and capacity not in CAPACITY_TIERS:
        raise ClusterConfigError(f"{where}: 'capacity' = {capacity!r} is not one of {', '.join(CAPACITY_TIERS)}")
    if capacity and "spot" in raw and raw["spot"] != (capacity == "spot"):
        raise ClusterConfigError(f"{where}: 'spot' = {str(raw['spot']).lower()} contradicts capacity = {capacity!r}")
    if "reservation" in raw and (capacity or "reserved") != "reserved":
        raise ClusterConfigError(f"{where}: 'reservation' needs capacity = \"reserved\", not {capacity!r}")
    return capacity or ("reserved" if "reservation" in raw else "")


def _check_names(raw: Mapping[str, Any], where: str) -> None:
    """Names that go into the API's URLs are what GCP allows, or refused in one line."""
    if not _PROJECT.match(raw["project"]):
        raise ClusterConfigError(
            f"{where}: 'project' = {raw['project']!r} is not a GCP project id (6-30 lowercase letters, digits "
            "and '-', starting with a letter)"
        )
    if not _ZONE.match(raw["zone"]):
        raise ClusterConfigError(f"{where}: 'zone' = {raw['zone']!r} is not a GCP zone (such as \"us-central2-b\")")
    for key in ("runtime_version", "reservation", "network", "subnetwork"):
        if key in raw and not _RESOURCE_NAME.match(raw[key]):
            raise ClusterConfigError(f"{where}: {key!r} = {raw[key]!r} is not a GCP resource name")


def _runtime_versions(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(raw, Mapping):
        raise ClusterConfigError(f"{where}: 'runtime_versions' must be a table such as {{ v6e = \"v2-alpha-tpuv6e\" }}")
    for key, value in raw.items():
        generation = key.rsplit("-", 1)[0] if key.rsplit("-", 1)[-1].isdigit() else key
        if generation not in DEFAULT_RUNTIME_VERSIONS and not re.fullmatch(r"v\d+[a-z]*", generation):
            raise ClusterConfigError(f"{where}: runtime_versions key {key!r} is not a TPU generation (v4, v5p, v6e, ...)")
        if not isinstance(value, str) or not _RESOURCE_NAME.match(value):
            raise ClusterConfigError(f"{where}: runtime_versions.{key} = {value!r} is not a runtime version name")
    return tuple(sorted(raw.items()))


def parse_cluster(data: Mapping[str, Any], *, source: str = "<cluster>") -> Cluster:
    """Validate an already-decoded cluster document (see the module docstring)."""
    unknown = set(data) - _TOP_KEYS
    if unknown:
        raise ClusterConfigError(f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))}")
    defaults = _ssh_settings(SshSettings(), data.get("ssh", {}), f"{source}: [ssh]")
    gcp = _parse_gcp(data["gcp"], source) if "gcp" in data else None
    raw_slices = data.get("slices", [])
    if not isinstance(raw_slices, list) or (not raw_slices and gcp is None):
        raise ClusterConfigError(f"{source}: needs at least one [[slices]] entry or a [gcp] table")
    max_parallel = data.get("max_parallel", 32)
    if not isinstance(max_parallel, int) or isinstance(max_parallel, bool) or max_parallel < 1:
        raise ClusterConfigError(f"{source}: 'max_parallel' must be a positive integer")
    slices: list[SliceSpec] = []
    seen_hosts: dict[tuple[str, int | None], str] = {}
    for i, raw in enumerate(raw_slices):
        s = _parse_slice(raw, i, defaults, source)
        if any(o.name == s.name for o in slices):
            raise ClusterConfigError(f"{source}: slice {s.name!r} is declared twice")
        for e in s.host_entries():
            key = (e.host, e.port or s.ssh.port)
            if key in seen_hosts:
                raise ClusterConfigError(
                    f"{source}: slice {s.name!r}: host {e.host!r} already belongs to "
                    f"slice {seen_hosts[key]!r}"
                )
            seen_hosts[key] = s.name
        slices.append(s)
    return Cluster(tuple(slices), max_parallel, source, gcp, defaults, _progress_timeout(data, source))


def _progress_timeout(data: Mapping[str, Any], source: str) -> float | None:
    raw = data.get("progress_timeout")
    if raw is None:
        return None
    return _timeout(raw, "progress_timeout", source, 'must be a duration over 0 s, such as "15m"')


_TIMEOUT_MAX = 30 * 86400.0
"""No timeout of the cluster file is longer: past it a typo (and a server-side bound the API refuses)."""


def _timeout(raw: Any, key: str, where: str, must: str) -> float:
    """A timeout of the cluster file, read as a step's are (seconds, ``"15m"``, ``h:mm:ss``): over 0 and finite.

    Infinity (TOML's ``inf``, or ``1e400``) is refused: it would reach ``attempts.json`` as
    ``Infinity``, which is not JSON, and "never" is no timeout anyone means.
    """
    from marinbuild.units import parse_timeout

    try:
        seconds = parse_timeout(raw) if not isinstance(raw, bool) else -1.0
    except MarinbuildError as e:
        raise ClusterConfigError(f"{where}: {key!r}: {e}") from None
    if seconds <= 0:
        raise ClusterConfigError(f"{where}: {key!r} {must}")
    if seconds > _TIMEOUT_MAX:
        raise ClusterConfigError(f"{where}: {key!r} = {seconds:g} s is over {_TIMEOUT_MAX / 86400:g} days")
    return seconds


def _api_retry_delay(raw: Any, where: str) -> float:
    """``api_retry_delay``: a number of seconds over 0, at most :data:`_API_RETRY_DELAY_MAX`."""
    # NaN fails every comparison, so it is refused with the rest.
    if not _has_type(raw, (int, float)) or not 0 < raw <= _API_RETRY_DELAY_MAX:
        raise ClusterConfigError(
            f"{where}: 'api_retry_delay' = {raw!r} must be a number of seconds over 0 to {_API_RETRY_DELAY_MAX:g}"
        )
    return float(raw)


def load_cluster(path: str | Path) -> Cluster:
    """Read and validate the cluster file at ``path``.

    Every problem is a :class:`ClusterConfigError` whose one-line message names the file
    and, where it concerns one, the slice::

        load_cluster("examples/tpu/cluster.toml").slices_by_type()
        # {'v4-32': ('v4-32-a', 'v4-32-b')}
    """
    p = Path(path).expanduser()
    data = read_toml(p)
    return parse_cluster(data, source=str(p))
