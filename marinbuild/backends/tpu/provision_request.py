"""What a step asks the TPU API for: a queued resource's name, labels, ``ssh-keys`` and body.

Every node carries labels naming marinbuild, the prefix, the step and its identity, and its
output path in its description, so that leftovers of a killed runner can be found and
deleted (:mod:`marinbuild.backends.tpu.leftovers`)::

    request = ProvisionRequest("train", out, prefix, "v4-32", 2)
    spec = queued_resource_spec(gcp, request, name=resource_name(request), valid_for_s=3600.0,
                                metadata=ssh_metadata(gcp, ssh))
"""

from __future__ import annotations

import getpass
import hashlib
import os
import secrets
from dataclasses import dataclass

from marinbuild.backends.tpu.cluster import GcpSettings, SshSettings
from marinbuild.backends.tpu.tpu_api import LABEL_PREFIX, QueuedResourceSpec, label_value
from marinbuild.errors import ClusterConfigError

__all__ = [
    "DESCRIPTION_PREFIX",
    "ProvisionRequest",
    "node_labels",
    "prefix_id",
    "public_key_line",
    "queued_resource_spec",
    "real_location",
    "resource_name",
    "ssh_metadata",
]

DESCRIPTION_PREFIX = "marinbuild output "
"""A created node's description: this, then the step's output path (where its lease lives)."""


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


def queued_resource_spec(gcp: GcpSettings, request: ProvisionRequest, *, name: str, valid_for_s: float,
                         metadata: dict[str, str]) -> QueuedResourceSpec:
    """The queued resource asked for ``request``, as the ``[gcp]`` table says to make it.

    ``valid_for_s``: how long the server keeps the request before it drops it (what is left of
    ``provision_timeout``), so that nothing a killed runner queued turns ACTIVE, and bills, after it.
    """
    return QueuedResourceSpec(
        name=name,
        tpu_type=request.tpu_type,
        count=request.count,
        runtime_version=gcp.runtime_for(request.tpu_type),
        spot=gcp.tier == "spot",
        tier=gcp.tier,
        reservation=gcp.reservation,
        valid_for_s=valid_for_s,
        labels=node_labels(gcp, request),
        metadata=metadata,
        description=DESCRIPTION_PREFIX + request.output_path,
        network=gcp.network,
        subnetwork=gcp.subnetwork,
        service_account=gcp.service_account,
        tags=gcp.tags,
        external_ips=gcp.external_ips,
    )


def resource_name(request: ProvisionRequest) -> str:
    """A new queued resource's name: the step's name and identity cut short, and a random tail.

    >>> name = resource_name(ProvisionRequest("Sweep/A", "/o/Sweep/A-3f2a", "/o", "v4-8", 1))
    >>> name.startswith("mb-sweep-a-3f2a-"), len(name)
    (True, 22)
    """
    step = label_value(request.step).replace("_", "-").strip("-")[:24] or "step"
    return f"mb-{step}-{label_value(request.identity)[:8]}-{secrets.token_hex(3)}".replace("--", "-")


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


def ssh_metadata(gcp: GcpSettings, ssh: SshSettings) -> dict[str, str]:
    """Created nodes' metadata: the ``[ssh]`` user and public key as ``ssh-keys``; none under OS Login."""
    if gcp.os_login:
        return {}
    return {"ssh-keys": f"{ssh.user or getpass.getuser()}:{public_key_line(ssh)}"}


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
