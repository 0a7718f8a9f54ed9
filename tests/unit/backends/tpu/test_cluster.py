"""The cluster file's [gcp] table (static [[slices]] are covered by tests/test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import DEFAULT_PROVISION_TIMEOUT, parse_cluster
from marinbuild.errors import ClusterConfigError

GCP = {"project": "my-project", "zone": "us-central2-b", "runtime_version": "tpu-ubuntu2204-base"}


def test_gcp_alone_is_a_cluster_with_defaults() -> None:
    cluster = parse_cluster({"ssh": {"user": "ops"}, "gcp": GCP})
    assert cluster.slices == () and cluster.ssh.user == "ops"
    g = cluster.gcp
    assert g is not None and g.region == "us-central2" and g.provision_timeout == DEFAULT_PROVISION_TIMEOUT == 3600
    assert (g.spot, g.os_login, g.external_ips, g.api_endpoint, g.tags, g.labels) == (False, False, True, None, (), ())
    assert (g.tier, g.reservation, g.ssh_ready_timeout) == ("on-demand", None, 600.0)


def test_every_key_is_read() -> None:
    table = {**GCP, "spot": True, "network": "n", "subnetwork": "s", "service_account": "sa@p.iam",
             "tags": ["t"], "labels": {"team": "a-b"}, "provision_timeout": 60, "api_endpoint": "http://127.0.0.1:1",
             "os_login": True, "external_ips": True}
    g = parse_cluster({"gcp": table}).gcp
    assert g is not None
    assert (g.spot, g.network, g.subnetwork, g.service_account, g.tags, g.labels, g.provision_timeout, g.api_endpoint,
            g.os_login, g.external_ips) == (True, "n", "s", "sa@p.iam", ("t",), (("team", "a-b"),), 60.0,
                                             "http://127.0.0.1:1", True, True)


@pytest.mark.parametrize(("change", "message"), [
    ({"zonee": "x"}, r"\[gcp\]: unknown key\(s\) zonee"),
    ({"spot": "yes"}, "'spot' must be true or false"),
    ({"provision_timeout": 0}, "'provision_timeout' must be a positive number"),
    ({"provision_timeout": float("inf")}, "'provision_timeout': duration inf must be a finite number"),
    ({"provision_timeout": float("nan")}, "'provision_timeout': duration nan must be a finite number"),
    ({"labels": {"Team": "x"}}, "is not a GCP label"),
    ({"labels": {"team": "X Y"}}, "is not a GCP label"),
    ({"api_endpoint": "127.0.0.1:8080"}, "must be an http:// or https:// URL"),
    ({"tags": "t"}, "'tags' must be a list"),
])
def test_bad_gcp_tables_are_one_line(change: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message) as e:
        parse_cluster({"gcp": {**GCP, **change}}, source="c.toml")
    assert str(e.value).startswith("c.toml: [gcp]") and "\n" not in str(e.value)


def test_missing_keys_and_reserved_names() -> None:
    with pytest.raises(ClusterConfigError, match="needs 'zone'"):
        parse_cluster({"gcp": {"project": "my-project"}})
    with pytest.raises(ClusterConfigError, match="needs at least one"):
        parse_cluster({})
    with pytest.raises(ClusterConfigError, match="may not start with '@'"):
        parse_cluster({"gcp": GCP, "slices": [{"name": "@gcp/0/0", "tpu_type": "v4-8", "hosts": ["h"]}]})


def test_external_ips_default_to_true_unless_a_network_is_named() -> None:
    def external(**table: object) -> bool:
        g = parse_cluster({"gcp": {**GCP, **table}}).gcp
        assert g is not None
        return g.external_ips

    assert external() is True
    assert external(network="vpc") is False and external(subnetwork="sub") is False
    assert external(network="vpc", external_ips=True) is True


@pytest.mark.parametrize(("table", "tier", "reservation"), [
    ({}, "on-demand", None),
    ({"spot": True}, "spot", None),
    ({"capacity": "spot"}, "spot", None),
    ({"capacity": "best-effort"}, "best-effort", None),
    ({"capacity": "reserved"}, "reserved", None),
    ({"capacity": "reserved", "reservation": "my-res"}, "reserved", "my-res"),
    ({"reservation": "projects/p/reservations/r"}, "reserved", "projects/p/reservations/r"),
])
def test_capacity_tiers(table: dict[str, object], tier: str, reservation: str | None) -> None:
    g = parse_cluster({"gcp": {**GCP, **table}}).gcp
    assert g is not None and (g.tier, g.reservation) == (tier, reservation)
    assert g.spot == (tier == "spot") and g.preemptible == (tier in ("spot", "best-effort"))


def test_runtime_versions_per_generation() -> None:
    g = parse_cluster({"gcp": {"project": "my-project", "zone": "us-central2-b"}}).gcp
    assert g is not None
    assert [g.runtime_for(t) for t in ("v4-32", "v5p-8", "v5litepod-16", "v6e-8")] == [
        "tpu-ubuntu2204-base", "tpu-ubuntu2204-base", "v2-alpha-tpuv5-lite", "v2-alpha-tpuv6e"]
    g = parse_cluster({"gcp": {**GCP, "runtime_versions": {"v6e": "v2-alpha-tpuv6e-next", "v5litepod-8": "lite8"}}}).gcp
    assert g is not None
    assert g.runtime_for("v6e-256") == "v2-alpha-tpuv6e-next" and g.runtime_for("v5litepod-8") == "lite8"
    assert g.runtime_for("v5litepod-16") == "tpu-ubuntu2204-base"  # the file's one runtime_version, then defaults


@pytest.mark.parametrize(("change", "message"), [
    ({"zone": "../../x"}, r"'zone' = '../../x' is not a GCP zone"),
    ({"zone": "us-central2"}, "is not a GCP zone"),
    ({"project": "a/b?c=d"}, r"'project' = 'a/b\?c=d' is not a GCP project id"),
    ({"project": "p"}, "is not a GCP project id"),
    ({"capacity": "cheap"}, "'capacity' = 'cheap' is not one of on-demand, spot, reserved, best-effort"),
    ({"capacity": "on-demand", "spot": True}, "contradicts capacity"),
    ({"capacity": "spot", "reservation": "r"}, "'reservation' needs capacity"),
    ({"runtime_versions": {"v9x-q": 3}}, "is not a TPU generation|is not a runtime version"),
    ({"runtime_versions": {"gpu": "x"}}, "is not a TPU generation"),
    ({"runtime_version": "a b"}, "is not a GCP resource name"),
    ({"ssh_ready_timeout": 0}, "'ssh_ready_timeout' must be a positive number"),
    ({"provision_timeout": 1e308}, "is over 30 days"),
])
def test_bad_names_and_tiers_are_one_line(change: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterConfigError, match=message) as e:
        parse_cluster({"gcp": {**GCP, **change}}, source="c.toml")
    assert str(e.value).startswith("c.toml: [gcp]") and "\n" not in str(e.value)


@pytest.mark.parametrize(("key", "value"), [
    ("kill_grace", -1e308), ("kill_grace", float("nan")), ("kill_grace", 1e308),
    ("connect_timeout", float("nan")), ("connect_timeout", 0), ("connect_timeout", float("inf")),
])
def test_ssh_seconds_are_bounded(key: str, value: float) -> None:
    with pytest.raises(ClusterConfigError, match=f"ssh setting '{key}' = .* must be a number of seconds") as e:
        parse_cluster({"ssh": {key: value}, "gcp": GCP}, source="c.toml")
    assert "\n" not in str(e.value)
    assert parse_cluster({"ssh": {"kill_grace": 0, "connect_timeout": 2.5}, "gcp": GCP}).ssh.kill_grace == 0


def test_a_cluster_file_that_is_not_utf8_or_nested_too_deeply_is_one_line(tmp_path: Path) -> None:
    from marinbuild.backends.tpu.cluster import load_cluster

    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[gcp]\nproject = "caf\xe9"\n')
    with pytest.raises(ClusterConfigError, match=r"latin1.toml: not valid TOML: not UTF-8 \(byte 20\)"):
        load_cluster(bad)
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ClusterConfigError, match=r"deep\.toml: not valid TOML: nested too deeply"):
        load_cluster(deep)
