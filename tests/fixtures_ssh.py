"""Fake TPU hosts for tests: one real OpenSSH sshd per host on 127.0.0.N, plus a GCE metadata server.

Each host's sshd sets ``FAKE_HOST_ID``, its own ``HOME`` and ``GCE_METADATA_IP`` (pointing
at that host's metadata server) in every session, so hosts sharing this machine still
have separate work directories and separate preemption answers.  The plain functions
(:func:`start_fleet`, :func:`stop_fleet`) serve the benchmark too::

    fleet = start_fleet(2, Path("/tmp/fleet"))
    fleet.hosts[1].set_preempted(True)
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from marinbuild.backends.tpu.attempts import TpuJob, TpuResult, run_tpu_step
from marinbuild.backends.tpu.cluster import load_cluster

from .helpers import port_in_block

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
METADATA_PATH = "/computeMetadata/v1/instance/preempted"
FIRST_IP = 2  # 127.0.0.2 is the first fake host


# The coordinator port is probed here but bound later by JAX on host 0, on every address ([::]),
# so a port merely free on one loopback address when probed can be taken meanwhile by another
# xdist worker's sshd, metadata server or ssh client. Ports are therefore drawn below the kernel's
# ephemeral range (which every bind to port 0 and every outgoing connection draw from), from a
# block of this worker's own, and checked free on the wildcard address, which any bind conflicts with.
_PORTS_PER_WORKER = 400
_FIRST_COORDINATOR_PORT = 20000
_coordinator_ports = itertools.count()


_SSHD_PORTS_PER_WORKER = 300
_FIRST_SSHD_PORT = 10000
_sshd_ports = itertools.count()


def sshd_port() -> int:
    """A port for a fake host's sshd, free on every address, that nobody else is drawn meanwhile.

    A host that a test stops is started again on its own port, by then free for seconds: a
    port of the ephemeral range could be taken meanwhile by any process binding port 0 on
    every address (Ray's and gRPC's servers do, all the time). These are drawn below it, from
    this worker's own block, as the coordinators' are.
    """
    return port_in_block(_FIRST_SSHD_PORT, _SSHD_PORTS_PER_WORKER, _sshd_ports, "an sshd")


def coordinator_port() -> int:
    """A port for the fleet's JAX coordinator that no other test process will take meanwhile."""
    return port_in_block(_FIRST_COORDINATOR_PORT, _PORTS_PER_WORKER, _coordinator_ports, "a coordinator")


class MetadataServer:
    """Answers GCE's ``preempted`` query on one address; the test flips the answer."""

    def __init__(self, ip: str) -> None:
        self.preempted = False
        server_self = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path != METADATA_PATH:
                    self.send_error(404)
                    return
                if self.headers.get("Metadata-Flavor") != "Google":
                    self.send_error(403, "Missing Metadata-Flavor header")
                    return
                body = b"TRUE" if server_self.preempted else b"FALSE"
                self.send_response(200)
                self.send_header("Metadata-Flavor", "Google")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((ip, 0), Handler)
        self.server.daemon_threads = True
        self.address = f"{ip}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass
class FakeHost:
    """One fake TPU VM: an sshd on its own loopback address, a home, a metadata server."""

    index: int
    ip: str
    port: int
    home: Path
    config: Path
    metadata: MetadataServer
    proc: subprocess.Popen[bytes] | None = None

    @property
    def entry(self) -> str:
        """How a cluster file names this host."""
        return f"{self.ip}:{self.port}"

    def set_preempted(self, value: bool) -> None:
        self.metadata.preempted = value

    def refuse_logins(self, refuse: bool) -> None:
        """Refuse every login (sshd up, the key not yet authorized), as a VM does before its
        ``ssh-keys`` user is made; or accept them again. sshd reads the file at each login."""
        mine = self.config.parent / "authorized_keys"
        shared = self.config.parent.parent / "authorized_keys"
        if refuse:
            mine.unlink(missing_ok=True)
        else:
            tmp = mine.with_suffix(".tmp")
            tmp.write_text(shared.read_text())
            tmp.replace(mine)

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-f", str(self.config), "-E", str(self.config.with_suffix(".log"))],
            stdin=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection((self.ip, self.port), timeout=0.5) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd for fake host {self.index} did not start; see {self.config}.log")

    def stop(self) -> None:
        """Kill this host's sshd and every session under it, as a vanished VM would."""
        if self.proc is None:
            return
        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


@dataclass
class FakeFleet:
    """Started fake hosts and the client-side files that reach them."""

    root: Path
    hosts: list[FakeHost]
    client_key: Path
    known_hosts: Path
    ssh_config: Path
    coordinator_port: int = field(default=0)

    def cluster_toml(self, slices: Sequence[tuple[str, str, Sequence[int]]], **ssh: object) -> str:
        """A cluster file for ``(name, tpu_type, host indices)`` slices; ``ssh`` overrides defaults."""
        settings: dict[str, object] = {
            "user": "root",
            "identity_file": str(self.client_key),
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.ssh_config),
            "connect_timeout": 5,
            "coordinator_port": coordinator_port(),
            "remote_workdir": "~/marinbuild-work",
            "kill_grace": 1.0,
        }
        settings.update(ssh)
        lines = ["[ssh]"] + [f"{k} = {_toml(v)}" for k, v in settings.items()]
        for name, tpu_type, indices in slices:
            hosts = [self.hosts[i].entry for i in indices]
            lines += ["", "[[slices]]", f"name = {_toml(name)}", f"tpu_type = {_toml(tpu_type)}",
                      f"hosts = {_toml(hosts)}"]
        return "\n".join(lines) + "\n"

    def write_cluster(self, path: Path, slices: Sequence[tuple[str, str, Sequence[int]]], **ssh: object) -> Path:
        path.write_text(self.cluster_toml(slices, **ssh))
        return path


def _toml(value: object) -> str:
    # JSON's strings, numbers, booleans and arrays are valid TOML for these simple values.
    return json.dumps(value)


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children before their parents."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(d.name))
    out: list[int] = []

    def walk(p: int) -> None:
        for c in children.get(p, []):
            walk(c)
            out.append(c)

    walk(pid)
    return out


def pids_with_env(*pairs: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds every ``NAME=value`` in ``pairs``."""
    found: list[int] = []
    wanted = {p.encode() for p in pairs}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = set((d / "environ").read_bytes().split(b"\0"))
            state = (d / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if wanted <= env and state != "Z":
            found.append(int(d.name))
    return found


def _sshd_config(host_dir: Path, ip: str, port: int, index: int, host_key: Path,
                 authorized: Path, home: Path, metadata: str) -> str:
    return f"""\
ListenAddress {ip}:{port}
HostKey {host_key}
PidFile {host_dir / "sshd.pid"}
AuthorizedKeysFile {authorized}
PermitRootLogin yes
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
UseDNS no
MaxStartups 200
MaxSessions 64
LogLevel ERROR
Subsystem sftp internal-sftp
SetEnv FAKE_HOST_ID={index} HOME={home} GCE_METADATA_IP={metadata}
"""


def start_fleet(n: int, root: Path, *, same_port: bool = False) -> FakeFleet:
    """Generate keys and start ``n`` fake hosts on 127.0.0.2 upwards (``same_port``: all on one port)."""
    root.mkdir(parents=True, exist_ok=True)
    # sshd refuses to start without its privilege separation directory.
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    for key in (host_key, client_key):
        if not key.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    authorized = root / "authorized_keys"
    authorized.write_text((root / "client_ed25519.pub").read_text())
    host_pub = " ".join((root / "host_ed25519.pub").read_text().split()[:2])
    ssh_config = root / "ssh_config"
    ssh_config.write_text("")
    hosts: list[FakeHost] = []
    shared = sshd_port() if same_port else None  # free on every address: on every host's
    try:
        for i in range(n):
            ip = f"127.0.0.{FIRST_IP + i}"
            host_dir = root / f"host{i}"
            home = host_dir / "home"
            home.mkdir(parents=True, exist_ok=True)
            port = shared or sshd_port()
            metadata = MetadataServer(ip)
            config = host_dir / "sshd_config"
            # A file per host, so that one host can refuse logins while the others accept them.
            (host_dir / "authorized_keys").write_text(authorized.read_text())
            config.write_text(_sshd_config(host_dir, ip, port, i, host_key, host_dir / "authorized_keys", home,
                                           metadata.address))
            host = FakeHost(i, ip, port, home, config, metadata)
            hosts.append(host)
            host.start()
    except BaseException:
        for h in hosts:
            h.stop()
            h.metadata.stop()
        raise
    known_hosts = root / "known_hosts"
    known_hosts.write_text("".join(f"[{h.ip}]:{h.port} {host_pub}\n" for h in hosts))
    return FakeFleet(root, hosts, client_key, known_hosts, ssh_config)


def stop_fleet(fleet: FakeFleet) -> None:
    for h in fleet.hosts:
        h.stop()
        h.metadata.stop()



# -- helpers for tests that run jobs on the fleet ------------------------------------------


def run_job(
    fleet: FakeFleet,
    tmp_path: Path,
    slices: list[tuple[str, str, list[int]]],
    command: str,
    *,
    env: dict[str, str] | None = None,
    workdir: str | None = None,
    cancel: threading.Event | None = None,
    lines: list[str] | None = None,
    ssh: dict[str, object] | None = None,
    **job: object,
) -> TpuResult:
    """Run ``command`` as step "step" on ``slices`` of the fleet, output in ``tmp_path/out``."""
    cluster = load_cluster(fleet.write_cluster(tmp_path / "cluster.toml", slices, **(ssh or {})))
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    spec = TpuJob(name="step", output_path=str(out), command=command, env=env or {},
                  slices=tuple(s[0] for s in slices), **job)  # type: ignore[arg-type]
    sink = lines if lines is not None else []
    return run_tpu_step(spec, cluster, workdir=workdir, cancel=cancel or threading.Event(),
                        console=sink.append)


def wait_for(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.05)


def live_processes_matching(command: str) -> list[str]:
    """``PID STATE ARGS`` of each live process (zombies excluded) whose arguments are ``command``'s words.

    The whole argument list, read from /proc: a line of ``ps`` is cut at a width that depends on
    the terminal, and a driver whose own arguments merely mention the command would match a search
    for the text.
    """
    want = command.split()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0")[:-1]]
            with open(f"/proc/{name}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # gone meanwhile
        if argv == want and state != "Z":
            found.append(f"{name} {state} {' '.join(argv)}")
    return found


def processes_gone(text: str, seconds: float = 60) -> list[str]:
    """Wait up to ``seconds`` for no process to match ``text``; those still matching then."""
    deadline = time.monotonic() + seconds
    while live_processes_matching(text) and time.monotonic() < deadline:
        time.sleep(0.1)
    return live_processes_matching(text)


@pytest.fixture(scope="session")
def ssh_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeFleet]:
    """Four fake TPU hosts for the whole test session."""
    fleet = start_fleet(4, tmp_path_factory.mktemp("fleet"))
    try:
        yield fleet
    finally:
        stop_fleet(fleet)


@pytest.fixture
def fleet(ssh_fleet: FakeFleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeFleet]:
    """The session's fake hosts, every one up and answering "not preempted"; quick retries."""
    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.05")
    for h in ssh_fleet.hosts:
        h.set_preempted(False)
        if not h.running:
            h.start()
    yield ssh_fleet
    for h in ssh_fleet.hosts:
        h.set_preempted(False)
        if not h.running:
            h.start()
