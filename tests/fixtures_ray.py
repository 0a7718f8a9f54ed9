"""A real Ray cluster on this machine for tests: a head node and an extra node offering ``special``.

Each node is a ``ray start --block`` process started in its own process group, so the
fixture stops exactly the processes it started by killing those groups (``ray stop``
would stop every Ray on the machine). Every cluster gets its own short temporary
directory and free ports. Ray replaces ``127.0.0.1`` as a node address with the
machine's own address; drivers still reach the head at ``127.0.0.1:PORT``.

::

    cluster = start_cluster(Path("/tmp/x"), extra_node=True)
    cluster.address       # "127.0.0.1:40123"
    cluster.extra_node    # node id of the node offering {"special": 1}
    stop_cluster(cluster)
"""

from __future__ import annotations

import itertools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .helpers import REPO, port_in_block

RAY = str(Path(sys.executable).with_name("ray"))
HEAD_CPUS = 2
EXTRA_RESOURCES = {"special": 1}
OBJECT_STORE = 100 * 2**20


_PORTS_PER_WORKER = 30
_FIRST_PORT = 8000  # up to 30 workers: 8000..8899, clear of the other fixtures' blocks
_ports = itertools.count()


def free_port() -> int:
    """A port for a Ray server to bind later: one drawn by binding port 0 could be taken meanwhile by
    another process drawing an ephemeral port, as Ray's own workers and gRPC's servers do."""
    return port_in_block(_FIRST_PORT, _PORTS_PER_WORKER, _ports, "a Ray server")


@dataclass
class RayCluster:
    """A running test cluster: where it is, what a driver's environment needs, its processes."""

    address: str
    root: Path
    env: dict[str, str]
    """Variables a driver needs to join (auth mode, token)."""
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    head_node: str = ""
    extra_node: str = ""


def _node_env(auth: dict[str, str]) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        env.pop(name, None)
    env.update(auth)
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _start_node(cluster: RayCluster, args: list[str], name: str) -> None:
    # Ray's workers bind ports of 10002..19999 by default, the SSH fixtures' block: they bind port 0 instead.
    ports = ["--dashboard-agent-listen-port", str(free_port()), "--min-worker-port", "0", "--max-worker-port", "0",
             "--object-store-memory", str(OBJECT_STORE)]
    log = (cluster.root / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [RAY, "start", *args, *ports, "--temp-dir", str(cluster.root / "ray"), "--disable-usage-stats", "--block"],
        env=_node_env(cluster.env),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    cluster.processes.append(proc)


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise RuntimeError(f"the Ray head did not open port {port}")


_NODES_SCRIPT = """
import json, sys, time, ray
ray.init(address=sys.argv[1], log_to_driver=False)
want = int(sys.argv[2])
deadline = time.monotonic() + 90
while True:
    nodes = [n for n in ray.nodes() if n["Alive"]]
    if len(nodes) >= want or time.monotonic() > deadline:
        break
    time.sleep(0.2)
print(json.dumps([{"id": n["NodeID"], "resources": n["Resources"]} for n in nodes]))
"""


def start_cluster(root: Path, *, extra_node: bool = True, token: str | None = None, cpus: int = HEAD_CPUS) -> RayCluster:
    """Start a head (``cpus`` CPUs) and, optionally, a node with 1 CPU and ``special``; wait for both."""
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token} if token else {"RAY_AUTH_MODE": "disabled"}
    port = free_port()
    cluster = RayCluster(address=f"127.0.0.1:{port}", root=root, env=auth)
    root.mkdir(parents=True, exist_ok=True)
    try:
        head = [
            "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", str(cpus),
            "--include-dashboard", "false", "--dashboard-port", str(free_port()),
            "--ray-client-server-port", str(free_port()),
        ]
        _start_node(cluster, head, "head")
        _wait_for_port(port, cluster.processes[0])
        if extra_node:
            extra = ["--address", cluster.address, "--node-ip-address", "127.0.0.1", "--num-cpus", "1",
                     "--resources", json.dumps(EXTRA_RESOURCES)]
            _start_node(cluster, extra, "extra")
        found = subprocess.run(
            [sys.executable, "-c", _NODES_SCRIPT, cluster.address, "2" if extra_node else "1"],
            env=_node_env(auth), capture_output=True, text=True, timeout=150, check=True,
        )
        nodes = json.loads(found.stdout.strip().splitlines()[-1])
        for node in nodes:
            if "special" in node["resources"]:
                cluster.extra_node = node["id"]
            else:
                cluster.head_node = node["id"]
        if extra_node and not cluster.extra_node:
            raise RuntimeError(f"the extra node did not join: {nodes}")
    except BaseException:
        stop_cluster(cluster)
        raise
    return cluster


def stop_cluster(cluster: RayCluster) -> None:
    """Stop the nodes' process groups: politely, then by force; remove the temp dir."""
    for proc in cluster.processes:
        _signal_group(proc, signal.SIGTERM)
    deadline = time.monotonic() + 3
    for proc in cluster.processes:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in cluster.processes:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()
    shutil.rmtree(cluster.root, ignore_errors=True)


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def short_root(prefix: str) -> Path:
    # Ray's socket paths must stay under the 107-character limit of a Unix socket name.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


CLUSTER_FIXTURES = ("ray_cluster", "ray_token_cluster")
"""The session fixtures below, each a cluster of its own (tests/conftest.py groups their tests)."""

# A cluster's daemons take CPU while idle (raylet, the GCS, the log monitor: about 0.3 of a
# core), and every test of a cluster runs on one worker (tests/conftest.py, group ``ray``): each
# cluster is stopped after the last test of this process that uses it, not at the session's end.
_users: dict[str, int] = {}
_clusters: dict[str, RayCluster] = {}


def pytest_collection_finish(session: pytest.Session) -> None:
    for name in CLUSTER_FIXTURES:
        _users[name] = sum(name in getattr(item, "fixturenames", ()) for item in session.items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    try:
        return (yield)
    finally:
        for name in _users:
            if name in getattr(item, "fixturenames", ()):
                _users[name] -= 1
                if _users[name] <= 0:
                    _stop(name)


def _stop(name: str) -> None:
    cluster = _clusters.pop(name, None)
    if cluster is not None:
        stop_cluster(cluster)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A head node (2 CPUs) and an extra node (1 CPU, ``special``: 1), token auth off."""
    _clusters["ray_cluster"] = start_cluster(short_root("mbray-"), extra_node=True)
    yield _clusters["ray_cluster"]
    _stop("ray_cluster")


@pytest.fixture(scope="session")
def ray_token_cluster() -> Iterator[RayCluster]:
    """A one-node cluster with Ray's token authentication on; ``env`` holds the token."""
    _clusters["ray_token_cluster"] = start_cluster(short_root("mbrayt-"), extra_node=False, token=secrets.token_hex(32))
    yield _clusters["ray_token_cluster"]
    _stop("ray_token_cluster")
