"""Helpers for tests of created slices: hosts without sshd, cluster files for the emulator."""

from __future__ import annotations

from pathlib import Path

from marinbuild.backends.tpu.cluster import Cluster, parse_cluster
from marinbuild.backends.tpu.provision import SliceProvider
from marinbuild.backends.tpu.provision_request import ProvisionRequest
from marinbuild.backends.tpu.tpu_api import TpuApi
from tests.tpu_api_emulator import EmulatedHost, TpuApiEmulator


class StandIn:
    """A host whose sshd is a flag: enough for the API's side of things."""

    def __init__(self, address: str) -> None:
        self.address, self.up, self.stops = address, True, 0

    def host(self) -> EmulatedHost:
        def stop() -> None:
            self.up, self.stops = False, self.stops + 1

        def start() -> None:
            self.up = True

        return EmulatedHost(self.address, f"ssh-ed25519 KEY{self.address.replace('.', '')}", start, stop, lambda: self.up)


def no_sshd(entry: str, spec: object, keys: tuple[str, ...]) -> None:
    """Stand-in hosts have no sshd to log into: reported keys are all a booting one can show here."""
    return None


def cluster_for(emulator: TpuApiEmulator, tmp_path: Path, **gcp: object) -> Cluster:
    key = tmp_path / "id"
    (tmp_path / "id.pub").write_text("ssh-ed25519 AAAAPUBLIC me@here\n")
    key.write_text("private")
    table = {"project": "my-project", "zone": "us-central2-b", "api_endpoint": emulator.endpoint,
             "provision_timeout": 30, **gcp}
    return parse_cluster({"ssh": {"user": "ops", "identity_file": str(key)}, "gcp": table})


def provider(emulator: TpuApiEmulator, tmp_path: Path, count: int = 2, tpu_type: str = "v4-8", **gcp: object) -> SliceProvider:
    cluster = cluster_for(emulator, tmp_path, **gcp)
    assert cluster.gcp is not None
    request = ProvisionRequest("train/Big", "/out/train/Big-0123abcd", "/out", tpu_type, count)
    return SliceProvider(TpuApi(cluster.gcp), cluster, request, poll=0.01, probe=no_sshd)
