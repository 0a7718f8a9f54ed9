"""The cluster file's [gcp] table (static [[slices]] are covered by tests/test_cluster.py)."""

from __future__ import annotations

import pytest

from marinbuild.backends.tpu.cluster import DEFAULT_PROVISION_TIMEOUT, parse_cluster
from marinbuild.errors import ClusterConfigError

GCP = {"project": "p", "zone": "us-central2-b", "runtime_version": "tpu-ubuntu2204-base"}


def test_gcp_alone_is_a_cluster_with_defaults() -> None:
    cluster = parse_cluster({"ssh": {"user": "ops"}, "gcp": GCP})
    assert cluster.slices == () and cluster.ssh.user == "ops"
    g = cluster.gcp
    assert g is not None and g.region == "us-central2" and g.provision_timeout == DEFAULT_PROVISION_TIMEOUT == 3600
    assert (g.spot, g.os_login, g.external_ips, g.api_endpoint, g.tags, g.labels) == (False, False, False, None, (), ())


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
    with pytest.raises(ClusterConfigError, match="needs 'runtime_version'"):
        parse_cluster({"gcp": {"project": "p", "zone": "z"}})
    with pytest.raises(ClusterConfigError, match="needs at least one"):
        parse_cluster({})
    with pytest.raises(ClusterConfigError, match="may not start with '@'"):
        parse_cluster({"gcp": GCP, "slices": [{"name": "@gcp/0/0", "tpu_type": "v4-8", "hosts": ["h"]}]})
