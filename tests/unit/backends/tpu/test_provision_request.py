"""What a step asks the TPU API for: the queued resource's body as the emulator receives it, and its parts."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import GcpSettings, SshSettings
from marinbuild.backends.tpu.provision_request import (
    ProvisionRequest,
    node_labels,
    prefix_id,
    public_key_line,
    queued_resource_spec,
    resource_name,
    ssh_metadata,
)
from marinbuild.backends.tpu.tpu_api import label_value
from marinbuild.errors import ClusterConfigError
from tests.tpu_api_emulator import TpuApiEmulator

from .emulated import provider


def test_the_body_carries_the_tier_network_labels_and_the_servers_bound(tmp_path: Path) -> None:
    gcp = GcpSettings("p", "us-central2-b", capacity="reserved", reservation="res-a", network="net", tags=("t",),
                      labels=(("team", "x"),), external_ips=False)
    request = ProvisionRequest("Exp/One", "/o/Exp/One-ff00", "/o", "v6e-8", 2)
    spec = queued_resource_spec(gcp, request, name="mb-x", valid_for_s=90.0, metadata={"ssh-keys": "u:k"})
    assert (spec.name, spec.count, spec.tier, spec.reservation, spec.spot) == ("mb-x", 2, "reserved", "res-a", False)
    assert spec.runtime_version == "v2-alpha-tpuv6e" and spec.valid_for_s == 90.0
    assert spec.description == "marinbuild output /o/Exp/One-ff00"
    assert spec.labels["team"] == "x" and spec.labels["marinbuild-step"] == "exp-one"
    assert (spec.network, spec.tags, spec.external_ips, spec.metadata) == ("net", ("t",), False, {"ssh-keys": "u:k"})


def test_a_name_is_new_each_time_and_short_for_a_long_step() -> None:
    request = ProvisionRequest("a_" + "b" * 80, "/o/x-0123456789abcdef", "/o", "v4-8", 1)
    names = {resource_name(request) for _ in range(5)}
    assert len(names) == 5
    assert all(n.startswith("mb-a-" + "b" * 22 + "-01234567-") and len(n) <= 63 for n in names), names


def test_os_login_sets_no_ssh_keys_and_otherwise_the_users_public_key(tmp_path: Path) -> None:
    (tmp_path / "id.pub").write_text("ssh-ed25519 AAAAKEY me@here\n")
    ssh = SshSettings(user="ops", identity_file=str(tmp_path / "id"))
    assert ssh_metadata(GcpSettings("p", "z", os_login=True), ssh) == {}
    assert ssh_metadata(GcpSettings("p", "z"), ssh) == {"ssh-keys": "ops:ssh-ed25519 AAAAKEY"}


def test_multislice_queued_resource_is_labelled_keyed_and_read_in_worker_order(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=2, tpu_type="v5litepod-16", spot=True, labels={"team": "x"})
    got = p.acquire(threading.Event())
    body = emulator.requests("POST", "/queuedResources")[0][2]
    spec = body["tpu"]["nodeSpec"][0]
    assert spec["multisliceParams"]["nodeCount"] == 2 and "spot" in body
    node = spec["node"]
    assert node["metadata"] == {"ssh-keys": "ops:ssh-ed25519 AAAAPUBLIC"}
    assert node["labels"] == {"team": "x", "marinbuild": "managed", "marinbuild-prefix": "-out",
                              "marinbuild-prefix-id": prefix_id("/out"),
                              "marinbuild-step": "train-big", "marinbuild-identity": "0123abcd"}
    assert node["description"] == "marinbuild output /out/train/Big-0123abcd"
    assert [s.name for s in got.specs] == [f"{got.queued_resource}-0", f"{got.queued_resource}-1"]
    assert [s.hosts for s in got.specs] == [tuple(f"10.0.0.{i}" for i in range(2, 6)), tuple(f"10.0.0.{i}" for i in range(6, 10))]
    assert got.host_keys["10.0.0.7"] == ("ssh-ed25519 KEY10007",)
    assert all(s.ssh.user == "ops" for s in got.specs)
    assert emulator.states()[got.queued_resource][:2] == ["CREATING", "WAITING_FOR_RESOURCES"]
    p.release()
    assert emulator.queued_resource_names() == []


def test_one_slice_uses_node_id_and_os_login_sets_no_key(emulator: TpuApiEmulator, tmp_path: Path) -> None:
    p = provider(emulator, tmp_path, count=1, os_login=True, external_ips=True)
    got = p.acquire(threading.Event())
    node = emulator.requests("POST", "/queuedResources")[0][2]["tpu"]["nodeSpec"][0]
    assert node["nodeId"] == got.queued_resource and "metadata" not in node["node"]
    assert node["node"]["networkConfig"] == {"enableExternalIps": True}
    p.release()


def test_labels_and_public_key(tmp_path: Path) -> None:
    assert label_value("A" * 80 + "/x") == "a" * 63
    req = ProvisionRequest("Exp/One", "gs://b/p/Exp/One-ff00", "gs://b/p", "v4-8", 1)
    from marinbuild.backends.tpu.cluster import GcpSettings, SshSettings

    labels = node_labels(GcpSettings("p", "z", "r"), req)
    assert labels["marinbuild-prefix"] == "gs-b-p" and labels["marinbuild-identity"] == "ff00"
    with pytest.raises(ClusterConfigError, match="identity_file"):
        public_key_line(SshSettings())


@pytest.mark.parametrize(("gcp", "tier_keys", "scheduling"), [
    ({"capacity": "spot"}, {"spot"}, None),
    ({"capacity": "on-demand"}, set(), None),
    ({"capacity": "reserved", "reservation": "res-a"}, {"guaranteed", "reservationName"}, {"reserved": True}),
    ({"capacity": "best-effort"}, set(), {"preemptible": True}),
])
def test_capacity_tiers_and_the_servers_own_bound_are_asked_for(emulator: TpuApiEmulator, tmp_path: Path,
                                                                gcp: dict[str, object], tier_keys: set[str],
                                                                scheduling: dict[str, bool] | None) -> None:
    p = provider(emulator, tmp_path, count=1, tpu_type="v6e-8", **gcp)
    p.acquire(threading.Event())
    body = emulator.requests("POST", "/queuedResources")[-1][2]
    assert {k for k in ("spot", "guaranteed", "reservationName") if k in body} == tier_keys
    if "reservationName" in tier_keys:
        assert body["reservationName"] == "projects/my-project/locations/us-central2-b/reservations/res-a"
    assert body["tpu"]["nodeSpec"][0]["node"].get("schedulingConfig") == scheduling
    assert body["tpu"]["nodeSpec"][0]["node"]["runtimeVersion"] == "v2-alpha-tpuv6e"
    valid = float(body["queueingPolicy"]["validUntilDuration"].rstrip("s"))
    assert valid == 60  # what is left of provision_timeout (30 s here), at least a minute
