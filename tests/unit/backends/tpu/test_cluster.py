"""The cluster file: its [gcp] table, its static [[slices]], validation messages and SSH target resolution."""

from __future__ import annotations

import gc
import textwrap
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import (
    DEFAULT_HYGIENE_COMMAND,
    DEFAULT_PROVISION_TIMEOUT,
    load_cluster,
    parse_cluster,
    parse_host_entry,
)
from marinbuild.backends.tpu.ssh import export_env, remote_path, resolve_target
from marinbuild.errors import ClusterConfigError
from marinbuild.redact import redact_env, scrub, secret_values
from tests.helpers import REPO

GCP = {"project": "my-project", "zone": "us-central2-b", "runtime_version": "tpu-ubuntu2204-base"}


def test_gcp_alone_is_a_cluster_with_defaults() -> None:
    cluster = parse_cluster({"ssh": {"user": "ops"}, "gcp": GCP})
    assert cluster.slices == () and cluster.ssh.user == "ops"
    g = cluster.gcp
    assert g is not None and g.region == "us-central2" and g.provision_timeout == DEFAULT_PROVISION_TIMEOUT == 3600
    assert (g.spot, g.os_login, g.external_ips, g.api_endpoint, g.tags, g.labels) == (False, False, True, None, (), ())
    assert (g.tier, g.reservation, g.ssh_ready_timeout, g.api_retry_delay) == ("on-demand", None, 600.0, 0.5)


def test_every_key_is_read() -> None:
    table = {**GCP, "spot": True, "network": "n", "subnetwork": "s", "service_account": "sa@p.iam",
             "tags": ["t"], "labels": {"team": "a-b"}, "provision_timeout": 60, "api_endpoint": "http://127.0.0.1:1",
             "os_login": True, "external_ips": True, "api_retry_delay": 2}
    g = parse_cluster({"gcp": table}).gcp
    assert g is not None
    assert (g.spot, g.network, g.subnetwork, g.service_account, g.tags, g.labels, g.provision_timeout, g.api_endpoint,
            g.os_login, g.external_ips, g.api_retry_delay) == (True, "n", "s", "sa@p.iam", ("t",), (("team", "a-b"),),
                                                               60.0, "http://127.0.0.1:1", True, True, 2.0)


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
    ({"api_retry_delay": 0}, "'api_retry_delay' = 0 must be a number of seconds over 0 to 60$"),
    ({"api_retry_delay": float("nan")}, "'api_retry_delay' = nan must be a number of seconds over 0 to 60$"),
    ({"api_retry_delay": 3600}, "'api_retry_delay' = 3600 must be a number of seconds"),
    ({"api_retry_delay": "1s"}, "'api_retry_delay' = '1s' must be a number of seconds"),
    ({"api_retry_delay": True}, "'api_retry_delay' = True must be a number of seconds"),
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
    # Garbage an earlier test on this worker left (a client's cycle) would otherwise be collected in
    # the middle of the parser's deepest recursion, and its finalizer fail there, unrelated to this file.
    gc.collect()
    with pytest.raises(ClusterConfigError, match=r"deep\.toml: not valid TOML: nested too deeply"):
        load_cluster(deep)


# -- The cluster file: parsing, validation messages, and SSH target resolution.


EXAMPLE = REPO / "examples" / "tpu" / "cluster.toml"


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "cluster.toml"
    path.write_text(textwrap.dedent(body))
    return path


def test_example_cluster_file_loads() -> None:
    cluster = load_cluster(EXAMPLE)
    assert [s.name for s in cluster.slices] == ["v4-32-a", "v4-32-b"]
    assert cluster.slices_by_type() == {"v4-32": ("v4-32-a", "v4-32-b")}
    a, b = cluster.slices
    assert a.ssh.user == "marin" and b.ssh.user == "ops"
    assert b.ssh.identity_file == a.ssh.identity_file  # inherited from [ssh]
    assert a.ssh.megascale_port == 8081 and a.ssh.accept_unknown_host_keys is False
    assert a.ssh.hygiene_command == DEFAULT_HYGIENE_COMMAND
    assert "/tmp/libtpu_lockfile" in DEFAULT_HYGIENE_COMMAND and "/dev/accel" in DEFAULT_HYGIENE_COMMAND


def test_defaults_and_types_grouping(tmp_path: Path) -> None:
    cluster = load_cluster(write(tmp_path, """
        [[slices]]
        name = "small"
        tpu_type = "v4-8"
        hosts = ["h0"]

        [[slices]]
        name = "big"
        tpu_type = "v5litepod-16"
        hosts = ["b0", "b1", "b2", "b3"]

        [[slices]]
        name = "small2"
        tpu_type = "v4-8"
        hosts = ["h1"]
    """))
    assert cluster.slices_by_type() == {"v4-8": ("small", "small2"), "v5litepod-16": ("big",)}
    assert cluster.max_parallel == 32
    assert cluster.slice("big").hosts == ("b0", "b1", "b2", "b3")
    with pytest.raises(ClusterConfigError, match="no slice named 'nope'"):
        cluster.slice("nope")


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        ('name = "pod-x"\ntpu_type = "v4-32"\nhosts = ["a", "b", "c"]',
         r"slice 'pod-x': lists 3 host\(s\) but v4-32 has 4 VM\(s\)"),
        ('name = "pod-y"\ntpu_type = "v9-8"\nhosts = ["a"]', r"slice 'pod-y': unknown TPU type 'v9-8'"),
        ('name = "pod-z"\ntpu_type = "v4-8"\nhosts = ["a"]\ntpu-type = "v4-8"', r"slice 'pod-z': unknown key"),
        ('name = "pod-p"\ntpu_type = "v4-8"\nhosts = ["a"]\nssh = { port = 70000 }', r"slice 'pod-p'.*not a port"),
        ('name = "pod-q"\ntpu_type = "v4-8"\nhosts = ["a"]\nssh = { usr = "x" }', r"slice 'pod-q': unknown ssh setting 'usr'"),
        ('name = "pod-r"\ntpu_type = "v4-8"\nhosts = "a"', r"slice 'pod-r': 'hosts' must be a list"),
        ('tpu_type = "v4-8"\nhosts = ["a"]', r"slices\[0\] needs a non-empty 'name'"),
    ],
)
def test_validation_errors_name_the_slice(tmp_path: Path, body: str, pattern: str) -> None:
    path = write(tmp_path, "[[slices]]\n" + body + "\n")
    with pytest.raises(ClusterConfigError, match=pattern) as info:
        load_cluster(path)
    assert info.value.exit_code == 2
    assert "\n" not in str(info.value)


def test_duplicates_and_file_errors(tmp_path: Path) -> None:
    dup = 'name = "a"\ntpu_type = "v4-8"\nhosts = ["{}"]\n'
    path = write(tmp_path, "[[slices]]\n" + dup.format("h1") + "[[slices]]\n" + dup.format("h2"))
    with pytest.raises(ClusterConfigError, match="slice 'a' is declared twice"):
        load_cluster(path)
    path = write(tmp_path, "[[slices]]\n" + dup.format("h1") + '[[slices]]\nname = "b"\ntpu_type = "v4-8"\nhosts = ["h1"]\n')
    with pytest.raises(ClusterConfigError, match="slice 'b': host 'h1' already belongs to slice 'a'"):
        load_cluster(path)
    with pytest.raises(ClusterConfigError, match="cannot read cluster file"):
        load_cluster(tmp_path / "missing.toml")
    with pytest.raises(ClusterConfigError, match="not valid TOML"):
        load_cluster(write(tmp_path, "[[slices]\n"))
    with pytest.raises(ClusterConfigError, match="at least one"):
        load_cluster(write(tmp_path, "[ssh]\nuser = 'x'\n"))


def test_host_entries() -> None:
    assert parse_host_entry("h") == parse_host_entry("h")
    e = parse_host_entry("ops@[::1]:2200")
    assert (e.host, e.user, e.port) == ("::1", "ops", 2200)
    assert parse_host_entry("10.0.0.2").port is None
    with pytest.raises(ValueError):
        parse_host_entry("h:99999")


def test_ssh_config_is_honoured_but_cluster_file_wins(tmp_path: Path) -> None:
    cfg = tmp_path / "ssh_config"
    key = tmp_path / "id_test"
    cfg.write_text(f"Host tpu-*\n  HostName 10.9.9.9\n  User fromcfg\n  Port 2022\n  IdentityFile {key}\n")
    cluster = load_cluster(write(tmp_path, f"""
        [ssh]
        ssh_config = "{cfg}"

        [[slices]]
        name = "s"
        tpu_type = "v4-8"
        hosts = ["tpu-w0"]

        [[slices]]
        name = "t"
        tpu_type = "v4-8"
        hosts = ["tpu-w1:2300"]
        ssh = {{ user = "explicit" }}
    """))
    s, t = cluster.slices
    a = resolve_target(s.hosts[0], s.ssh)
    assert (a.hostname, a.user, a.port, a.identity_files) == ("10.9.9.9", "fromcfg", 2022, (str(key),))
    b = resolve_target(t.hosts[0], t.ssh)
    assert (b.hostname, b.user, b.port) == ("10.9.9.9", "explicit", 2300)


def test_redaction_and_quoting() -> None:
    env = {"HF_TOKEN": "hf_secretvalue", "wandb_api_key": "k" * 8, "DB_PASSWORD": "pw12345",
           "MY_SECRET": "s3cr3t!", "SEED": "1"}
    assert redact_env(env) == {"HF_TOKEN": "***", "wandb_api_key": "***", "DB_PASSWORD": "***",
                               "MY_SECRET": "***", "SEED": "1"}
    assert scrub("got hf_secretvalue and pw12345", secret_values(env)) == "got *** and ***"
    with pytest.raises(ValueError, match="not a valid shell name"):
        export_env({"A;rm -rf /": "x"})
    assert remote_path("~/w") == '"$HOME"/w'
    assert remote_path("/a b/$(x)") == "'/a b/$(x)'"
