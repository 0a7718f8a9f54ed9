"""The cluster file: parsing, validation messages, and SSH target resolution."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import DEFAULT_HYGIENE_COMMAND, load_cluster, parse_host_entry
from marinbuild.backends.tpu.ssh import export_env, remote_path, resolve_target
from marinbuild.errors import ClusterConfigError
from marinbuild.redact import redact_env, scrub, secret_values

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "tpu" / "cluster.toml"


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
