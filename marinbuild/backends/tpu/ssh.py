"""SSH connections to TPU hosts (paramiko) and the quoting of everything sent to a remote shell.

>>> export_env({"MSG": "$(touch /tmp/x)"})
"export MSG='$(touch /tmp/x)'"
"""

from __future__ import annotations

import base64
import binascii
import getpass
import logging
import os
import re
import shlex
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import paramiko
from paramiko.pkey import UnknownKeyType

from marinbuild.backends.tpu.cluster import SshSettings, parse_host_entry
from marinbuild.errors import MarinbuildError
from marinbuild.redact import redact_env

__all__ = [
    "CommandResult",
    "ConnectionLost",
    "HostKeyError",
    "HostTarget",
    "HostUnknown",
    "HostUnreachable",
    "SshAuthError",
    "SshConnection",
    "SshError",
    "export_env",
    "redact_env",
    "remote_path",
    "resolve_target",
]

# paramiko logs a traceback for every failed handshake; with no logging configured
# Python's last-resort handler would print them all on the terminal. What went wrong
# reaches the user as one line per host in the attempt's message instead.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Keepalives make a silently vanished peer (a preempted VM drops no FIN) surface as a
# failed send within about a minute instead of never.
_KEEPALIVE_S = 15


class SshError(MarinbuildError):
    """Talking to ``host`` over SSH failed."""

    def __init__(self, host: str, message: str) -> None:
        super().__init__(f"{host}: {message}")
        self.host = host


class HostKeyError(SshError):
    """The host's key is unknown (and not accepted) or differs from known_hosts."""


class SshAuthError(SshError):
    """The host refused every key offered."""


class HostUnknown(SshError):
    """The host's name does not resolve: a configuration problem, not a VM that went away."""


class HostUnreachable(SshError):
    """No SSH session could be set up: refused, timed out, reset."""


class ConnectionLost(SshError):
    """An established connection died."""


@dataclass(frozen=True)
class HostTarget:
    """Everything needed to open one SSH connection, after ``~/.ssh/config`` is applied.

    ``alias`` is the host as the cluster file writes it; messages use it.
    """

    alias: str
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    known_hosts: str | None = None
    accept_unknown_host_keys: bool = False
    connect_timeout: float = 10.0
    proxy_command: str | None = None
    trusted_host_keys: tuple[str, ...] = ()
    """``TYPE BASE64`` keys the TPU API reports for this host: when given, the only keys
    accepted (``known_hosts`` is not read, nothing is written to it)."""


@dataclass(frozen=True)
class CommandResult:
    """What a finished remote command left: exit code and its two streams."""

    exit_code: int
    stdout: str
    stderr: str


@lru_cache(maxsize=8)
def _ssh_config(path: str, mtime: float) -> paramiko.SSHConfig:
    del mtime  # part of the cache key only: an edited file is read again
    return paramiko.SSHConfig.from_path(path)


def resolve_target(entry: str, settings: SshSettings) -> HostTarget:
    """Combine a host entry, the slice's SSH settings and ``~/.ssh/config``.

    Values written in the cluster file win over ``~/.ssh/config``, as command-line options
    win over it for ``ssh``.

    >>> resolve_target("u@10.1.2.3:2200", SshSettings(ssh_config=None)).port
    2200
    """
    e = parse_host_entry(entry)
    cfg: dict[str, object] = {}
    if settings.ssh_config:
        path = os.path.expanduser(settings.ssh_config)
        if os.path.isfile(path):
            cfg = dict(_ssh_config(path, os.path.getmtime(path)).lookup(e.host))
    identity = settings.identity_file
    identity_files: tuple[str, ...]
    if identity:
        identity_files = (os.path.expanduser(identity),)
    else:
        raw = cfg.get("identityfile") or ()
        identity_files = tuple(
            os.path.expanduser(str(p)) for p in (raw if isinstance(raw, list) else [raw])
        )
    known = settings.known_hosts or str(cfg.get("userknownhostsfile", "") or "") or None
    return HostTarget(
        alias=entry,
        hostname=str(cfg.get("hostname", e.host)),
        port=int(e.port or settings.port or int(str(cfg.get("port", 22)))),
        user=e.user or settings.user or str(cfg.get("user") or getpass.getuser()),
        identity_files=identity_files,
        known_hosts=os.path.expanduser(known.split()[0]) if known else None,
        accept_unknown_host_keys=settings.accept_unknown_host_keys,
        connect_timeout=settings.connect_timeout,
        proxy_command=str(cfg["proxycommand"]) if cfg.get("proxycommand") else None,
    )


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Refuse keys missing from known_hosts unless the cluster file opts in.

    Accepted keys are kept in memory only: writing them to known_hosts would turn a
    one-off opt-in into lasting trust.
    """

    def __init__(self, target: HostTarget) -> None:
        self.target = target

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        if self.target.accept_unknown_host_keys:
            client.get_host_keys().add(hostname, key.get_name(), key)
            return
        where = self.target.known_hosts or "no known_hosts file"
        raise HostKeyError(
            self.target.alias,
            f"unknown host key ({key.get_name()} {key.get_fingerprint().hex()}) not in "
            f"{where}; add it with ssh-keyscan or set accept_unknown_host_keys = true",
        )


def _trust_keys(client: paramiko.SSHClient, target: HostTarget) -> None:
    """Accept exactly ``target.trusted_host_keys`` for the host's address, in memory only."""
    name = target.hostname if target.port == 22 else f"[{target.hostname}]:{target.port}"
    keys = client.get_host_keys()
    unreadable = ""
    for line in target.trusted_host_keys:
        try:
            key_type, data = line.split()[:2]
            key = paramiko.PKey.from_type_string(key_type, base64.b64decode(data))
        except (ValueError, binascii.Error, paramiko.SSHException, UnknownKeyType) as e:
            # Another kind of entry, or a type this client no longer reads (ssh-dss): it adds
            # no trust, and the keys that can be read still decide.
            unreadable = unreadable or f"{line.split()[0] if line.split() else line!r}: {e}"
            continue
        keys.add(name, key.get_name(), key)
    if unreadable and not keys.lookup(name):
        raise HostKeyError(target.alias, f"the TPU API reports no host key that can be read ({unreadable})")


class SshConnection:
    """One authenticated SSH connection to a host; close it (or use ``with``) when done.

    Commands are run by ``/bin/sh`` whatever the user's login shell is::

        with SshConnection.connect(resolve_target("10.0.0.2", settings)) as conn:
            conn.run("hostname").stdout
    """

    def __init__(self, target: HostTarget, client: paramiko.SSHClient) -> None:
        self.target = target
        self._client = client

    @classmethod
    def connect(cls, target: HostTarget) -> SshConnection:
        """Open and authenticate a connection, mapping paramiko's failures to :class:`SshError`."""
        client = paramiko.SSHClient()
        if target.trusted_host_keys:
            _trust_keys(client, target)
        elif target.known_hosts and os.path.isfile(target.known_hosts):
            client.load_host_keys(target.known_hosts)
        client.set_missing_host_key_policy(_HostKeyPolicy(target))
        sock = paramiko.ProxyCommand(target.proxy_command) if target.proxy_command else None
        t = target.connect_timeout
        try:
            client.connect(
                target.hostname,
                port=target.port,
                username=target.user,
                key_filename=list(target.identity_files) or None,  # type: ignore[arg-type]
                look_for_keys=not target.identity_files,
                allow_agent=True,
                timeout=t,
                banner_timeout=t,
                auth_timeout=t,
                channel_timeout=t,
                sock=sock,
            )
        except SshError:
            client.close()
            raise
        except paramiko.BadHostKeyException as e:
            client.close()
            source = "the one the TPU API reports" if target.trusted_host_keys else f"the one in {target.known_hosts}"
            raise HostKeyError(
                target.alias,
                f"host key ({e.key.get_name()}) differs from {source}; refusing to connect",
            ) from None
        except socket.gaierror as e:
            client.close()
            # A name that does not resolve is a configuration problem, not a VM that
            # went away: it must not be retried as a preemption.
            raise HostUnknown(target.alias, f"cannot resolve {target.hostname!r}: {e}") from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise SshAuthError(
                target.alias, f"authentication as {target.user!r} failed: {e}"
            ) from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            client.close()
            raise HostUnreachable(
                target.alias, f"cannot connect to {target.hostname}:{target.port}: {_connect_failure(e, t)}"
            ) from None
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(_KEEPALIVE_S)
        return cls(target, client)

    @property
    def alive(self) -> bool:
        transport = self._client.get_transport()
        return transport is not None and transport.is_active()

    def _transport(self) -> paramiko.Transport:
        transport = self._client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionLost(self.target.alias, "connection closed")
        return transport

    def open_command(self, command: str, *, hold_stdin: bool = False) -> paramiko.Channel:
        """Start ``command`` with stderr merged into stdout; the caller reads the channel.

        With ``hold_stdin`` the command's stdin stays open for as long as this side
        holds the channel, so the remote side can notice when this side goes away.
        """
        try:
            chan = self._transport().open_session(timeout=self.target.connect_timeout)
            chan.set_combine_stderr(True)
            chan.exec_command(_posix(command))
            if not hold_stdin:
                chan.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise ConnectionLost(self.target.alias, f"cannot start a command: {e}") from None
        return chan

    def run(self, command: str, *, timeout: float | None = 120.0) -> CommandResult:
        """Run ``command`` to completion; ``timeout`` bounds each wait for output."""
        try:
            chan = self._transport().open_session(timeout=self.target.connect_timeout)
            chan.settimeout(timeout)
            chan.exec_command(_posix(command))
            chan.shutdown_write()
            # Control commands print little, so reading stdout to its end before stderr
            # cannot fill the window and stall the remote side.
            out = _read_all(chan.recv)
            err = _read_all(chan.recv_stderr)
            code = chan.recv_exit_status()
            chan.close()
        except TimeoutError:
            raise ConnectionLost(self.target.alias, f"no answer within {timeout} s") from None
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise ConnectionLost(self.target.alias, f"command failed: {e}") from None
        return CommandResult(code, out.decode(errors="replace"), err.decode(errors="replace"))

    def put_file(self, local: str | Path, remote: str) -> None:
        """Copy a local file to an absolute remote path over SFTP."""
        try:
            sftp = self._client.open_sftp()
            try:
                sftp.put(str(local), remote)
            finally:
                sftp.close()
        except (OSError, EOFError, paramiko.SSHException) as e:
            raise ConnectionLost(self.target.alias, f"upload to {remote} failed: {e}") from None

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> SshConnection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _connect_failure(e: BaseException, timeout: float | None) -> str:
    """Why a connection could not be set up, in a few words ("connection refused")."""
    if isinstance(e, paramiko.ssh_exception.NoValidConnectionsError):
        # paramiko's own text is "[Errno None] Unable to connect to port 1 on 127.0.0.1".
        causes = {(err.strerror or str(err)) for err in e.errors.values() if err is not None}
        return "; ".join(sorted(c[:1].lower() + c[1:] for c in causes)) or "connection failed"
    if isinstance(e, TimeoutError | socket.timeout):
        return f"no answer within {timeout:g} s" if timeout else "timed out"
    if isinstance(e, OSError) and e.strerror:
        return e.strerror[:1].lower() + e.strerror[1:]
    return str(e) or type(e).__name__


def _posix(command: str) -> str:
    # The login shell could be anything (zsh, fish); marinbuild's scripts are POSIX sh.
    return "exec /bin/sh -c " + shlex.quote(command)


def _read_all(recv: Callable[[int], bytes]) -> bytes:
    chunks: list[bytes] = []
    while True:
        data = recv(65536)
        if not data:
            return b"".join(chunks)
        chunks.append(data)


def export_env(env: Mapping[str, str]) -> str:
    """A shell ``export`` of ``env`` with every value quoted, so none is ever expanded.

    A name that is not a shell identifier is refused (``ValueError``): it could not be
    exported and would otherwise reach the shell as code.

    >>> export_env({"A": "x y", "B": "it's"})
    'export A=\\'x y\\' B=\\'it\\'"\\'"\\'s\\''
    """
    for name in env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"environment variable name {name!r} is not a valid shell name")
    if not env:
        return "true"
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())


def remote_path(path: str) -> str:
    """A shell word for a remote path: quoted, except that a leading ``~/`` means ``$HOME``.

    >>> remote_path("~/.marinbuild/work")
    '"$HOME"/.marinbuild/work'
    >>> remote_path("/data/my dir")
    "'/data/my dir'"
    """
    if path == "~":
        return '"$HOME"'
    if path.startswith("~/"):
        return '"$HOME"/' + shlex.quote(path[2:])
    return shlex.quote(path)
