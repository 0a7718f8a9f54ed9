"""Unit tests of marinbuild.backends.tpu.ssh: targets, quoting for a remote shell, real connections.

The connection tests use the session's fake hosts (real OpenSSH on loopback, tests/fixtures_ssh.py).
"""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import SshSettings
from marinbuild.backends.tpu.ssh import (
    HostKeyError,
    HostUnknown,
    HostUnreachable,
    SshConnection,
    export_env,
    remote_path,
    resolve_target,
)
from tests.fixtures_ssh import FakeFleet


def _sh(script: str) -> str:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, check=True).stdout


def test_export_env_never_expands_a_value(tmp_path: Path) -> None:
    marker = tmp_path / "touched"
    env = {"A": f"$(touch {marker})", "B": "it's `x` $HOME", "C": "line\nbreak"}
    out = _sh(f'{export_env(env)}; printf "%s|%s|%s" "$A" "$B" "$C"')
    assert out == f"$(touch {marker})|it's `x` $HOME|line\nbreak"
    assert not marker.exists()
    assert export_env({}) == "true"
    with pytest.raises(ValueError, match="not a valid shell name"):
        export_env({"BAD-NAME": "1"})


def test_remote_path_keeps_home_and_quotes_the_rest() -> None:
    assert _sh(f"HOME=/h; printf %s {remote_path('~/a b/c')}") == "/h/a b/c"
    assert _sh(f"HOME=/h; printf %s {remote_path('~')}") == "/h"
    assert _sh(f"printf %s {remote_path('/x/$(y)')}") == "/x/$(y)"


def test_resolve_target_cluster_file_wins_over_ssh_config(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host box\n  HostName 10.9.9.9\n  Port 2222\n  User fromconfig\n  IdentityFile /keys/id\n"
                      "  ProxyCommand nc %h %p\n")
    target = resolve_target("box", SshSettings(ssh_config=str(config), known_hosts="/kh", connect_timeout=3))
    assert (target.hostname, target.port, target.user, target.identity_files) == ("10.9.9.9", 2222, "fromconfig", ("/keys/id",))
    assert target.proxy_command and target.known_hosts == "/kh" and target.connect_timeout == 3
    mine = resolve_target("me@box:2200", SshSettings(ssh_config=str(config), identity_file="/mine", user="ignored"))
    assert (mine.user, mine.port, mine.identity_files, mine.alias) == ("me", 2200, ("/mine",), "me@box:2200")


def _settings(fleet: FakeFleet, **kw: object) -> SshSettings:
    base: dict[str, object] = dict(user="root", identity_file=str(fleet.client_key), known_hosts=str(fleet.known_hosts),
                                   ssh_config=None, connect_timeout=5.0)
    base.update(kw)
    return SshSettings(**base)  # type: ignore[arg-type]


def test_run_and_put_file_on_a_real_host(fleet: FakeFleet, tmp_path: Path) -> None:
    host = fleet.hosts[0]
    local = tmp_path / "payload.txt"
    local.write_text("payload")
    with SshConnection.connect(resolve_target(host.entry, _settings(fleet))) as conn:
        assert conn.alive
        done = conn.run('echo "$FAKE_HOST_ID"; echo oops >&2; exit 3')
        assert (done.exit_code, done.stdout, done.stderr) == (3, "0\n", "oops\n")
        remote = f"{host.home}/payload.txt"
        conn.put_file(local, remote)
        assert conn.run(f"cat {remote}").stdout == "payload"
    assert not conn.alive


def test_a_host_key_not_in_known_hosts_is_refused(fleet: FakeFleet, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    target = resolve_target(fleet.hosts[0].entry, _settings(fleet, known_hosts=str(empty)))
    with pytest.raises(HostKeyError):
        SshConnection.connect(target)


def test_host_keys_from_the_api_that_cannot_be_read_add_no_trust(fleet: FakeFleet, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    real = " ".join((fleet.root / "host_ed25519.pub").read_text().split()[:2])
    # ssh-dss (a type paramiko no longer reads) and a value that is not base64 beside the real key.
    unreadable = ("ssh-dss AAAAB3NzaC1kc3MAAACBAP1=", "ecdsa-sha2-nistp256 not*base64")
    target = dataclasses.replace(resolve_target(fleet.hosts[0].entry, _settings(fleet, known_hosts=str(empty))),
                                 trusted_host_keys=(*unreadable, real))
    with SshConnection.connect(target) as conn:
        assert conn.alive
    with pytest.raises(HostKeyError, match="no host key that can be read"):
        SshConnection.connect(dataclasses.replace(target, trusted_host_keys=unreadable))


def test_unreachable_and_unknown_hosts_are_told_apart(fleet: FakeFleet) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))  # bound, never listening: refused, and nobody else can take it meanwhile
        closed = s.getsockname()[1]
        with pytest.raises(HostUnreachable, match=r"cannot connect to 127\.0\.0\.1"):
            SshConnection.connect(resolve_target(f"127.0.0.1:{closed}", _settings(fleet)))
    with pytest.raises(HostUnknown, match="cannot resolve"):
        SshConnection.connect(resolve_target("no-such-host.invalid", _settings(fleet)))
