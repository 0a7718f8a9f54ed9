"""A real GCS endpoint for tests: ``gcp-storage-emulator`` behind ``tests/gcs_server.py``, reached through gcsfs.

The emulator runs in its own process (in-memory, a free port, one bucket); in front of it
the test server (``tests/gcs_server.py``) enforces preconditions as GCS does, answers the
storage control API that gcsfs's default filesystem asks about each bucket, and writes one
log line per request, which is how requests are counted. gcsfs runs with its defaults: it
finds the endpoint through ``STORAGE_EMULATOR_HOST``, ``FSSPEC_GS_TOKEN=anon`` stops it from
looking for credentials, and ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH`` makes gRPC trust the test
server's certificate (the control API is TLS gRPC, as on GCS). No variable changes which
filesystem class gcsfs hands out (``tests/test_gcs_defaults.py`` checks).
:attr:`Emulator.env` holds the three for a ``marinbuild run`` subprocess; the fixture sets
them in this process too. The plain functions serve the benchmark as well::

    emulator = start_emulator(Path("/tmp/emu"))
    ...
    emulator.stop()
"""

from __future__ import annotations

import itertools
import os
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import port_in_block

BUCKET = "marinbuild-test"
_REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) ')


@dataclass
class Emulator:
    """A running emulator: its endpoint, the environment that points gcsfs at it, its log."""

    process: subprocess.Popen[bytes]
    endpoint: str
    log: Path
    bucket: str = BUCKET
    front: subprocess.Popen[bytes] | None = None
    """The test server in front of the emulator (``tests/gcs_server.py``)."""
    certificate: Path | None = None

    @property
    def env(self) -> dict[str, str]:
        env = {"STORAGE_EMULATOR_HOST": self.endpoint, "FSSPEC_GS_TOKEN": "anon"}
        if self.certificate is not None:
            env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = str(self.certificate)
        return env

    def control(self, what: str, **query: object) -> dict[str, Any]:
        """Ask the test server (``tests/gcs_server.py``): ``fail``, ``clear``, ``hold``, ``release``, ``held``."""
        import json
        import urllib.parse
        import urllib.request

        url = f"{self.endpoint}/_test/{what}?{urllib.parse.urlencode(query)}"
        with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=30) as r:
            answer: dict[str, Any] = json.loads(r.read() or b"{}")
            return answer

    def requests(self) -> int:
        """Requests the emulator has answered so far."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if _REQUEST.search(line))

    def prefix(self) -> str:
        """A fresh ``gs://`` prefix no other test uses."""
        return f"gs://{self.bucket}/{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        for process in (self.front, self.process):
            if process is None:
                continue
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


_LAUNCH = (
    # The emulator answers one request at a time from a listen queue of 5: a hundred
    # parallel reads overflow it and the kernel retries the dropped connections after
    # 1, 3, 7... seconds. A longer queue lets them wait their turn instead.
    # In memory, every write also serialized the whole object table to a ".meta" file that
    # is only read back at start-up: quadratic in the number of objects (minutes for
    # 10,000), so it is skipped.
    "import sys, socketserver; socketserver.TCPServer.request_queue_size = 1024; "
    "from gcp_storage_emulator.storage import Storage; Storage._write_config_to_file = lambda self: None; "
    "from gcp_storage_emulator.__main__ import main; main(sys.argv[1:])"
)


# Both ports are drawn below the kernel's ephemeral range, from this worker's own block: a
# port found free by binding port 0 and closing it can be taken before the server binds it
# (by any bind to port 0, any outgoing connection), and the readiness check would then
# reach the taker and the tests hang on a server that never answers.
_PORTS_PER_WORKER = 25
_FIRST_PORT = 32000  # up to 30 workers: 32000..32749, below Linux's ephemeral 32768
_ports = itertools.count()


def _free_port() -> int:
    return port_in_block(_FIRST_PORT, _PORTS_PER_WORKER, _ports, "a storage emulator")


def start_emulator(folder: Path, bucket: str = BUCKET, preconditions: bool = True) -> Emulator:
    """Start the emulator and the test server in front of it on free loopback ports; wait until both answer.

    ``preconditions=False``: the server ignores preconditions, as the bare emulator does
    (for the tests of marinbuild's fallback on such a server).
    """
    from tests.gcs_server import make_certificate

    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    with open(folder / "emulator.log", "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, "start", "--host", "127.0.0.1", "--port", str(port),
             "--in-memory", "--default-bucket", bucket],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    certificate = make_certificate(folder / "certs")
    front_port = _free_port()
    log = folder / "requests.log"
    log.touch()
    ready = folder / "server.ready"
    ready.unlink(missing_ok=True)
    command = [sys.executable, str(Path(__file__).with_name("gcs_server.py")), "--port", str(front_port),
               "--upstream", f"http://127.0.0.1:{port}", "--log", str(log), "--certs", str(folder / "certs"),
               "--ready", str(ready)]
    with open(folder / "server.log", "wb") as out:
        front = subprocess.Popen(command + ([] if preconditions else ["--no-preconditions"]), stdout=out,
                                 stderr=subprocess.STDOUT, start_new_session=True)
    emulator = Emulator(process, f"http://127.0.0.1:{front_port}", log, bucket, front, certificate)
    deadline = time.monotonic() + 30
    # The test server says itself when its port is bound: a connection alone could reach another process.
    for what, up in ((process, lambda: _answers(port)), (front, ready.exists)):
        while not up():
            if what.poll() is not None:
                emulator.stop()
                raise RuntimeError(f"the storage emulator exited: {_tail(folder)}")
            if time.monotonic() > deadline:
                emulator.stop()
                raise RuntimeError("the storage emulator did not start within 30 s")
            time.sleep(0.1)
    return emulator


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(folder: Path) -> str:
    return " | ".join(f.read_text(errors="replace")[-1000:] for f in (folder / "emulator.log", folder / "server.log")
                      if f.exists())


def point_gcsfs_at(emulator: Emulator) -> None:
    """Make ``gs://`` in this process reach the emulator, however gcsfs was imported before."""
    os.environ.update(emulator.env)
    import fsspec
    import fsspec.config
    import gcsfs

    fsspec.config.conf.setdefault("gs", {})["token"] = "anon"
    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    gcsfs.GCSFileSystem.clear_instance_cache()


def gcs_filesystem(emulator: Emulator) -> Any:
    """A gcsfs filesystem on the emulator, of the class gcsfs picks (no instance cache, so nothing stale)."""
    import gcsfs

    return gcsfs.GCSFileSystem(endpoint_url=emulator.endpoint, token="anon", skip_instance_cache=True)


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """One emulator for the session; ``gs://`` in this process points at it."""
    emulator = start_emulator(tmp_path_factory.mktemp("gcs-emulator"))
    saved = {k: os.environ.get(k) for k in emulator.env}
    point_gcsfs_at(emulator)
    try:
        yield emulator
    finally:
        emulator.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def gcs_emulator_without_preconditions(tmp_path_factory: pytest.TempPathFactory,
                                       gcs_emulator: Emulator) -> Iterator[Emulator]:
    """A second endpoint whose server ignores preconditions (marinbuild's fallback); not pointed at by default."""
    emulator = start_emulator(tmp_path_factory.mktemp("gcs-emulator-no-preconditions"), preconditions=False)
    try:
        yield emulator
    finally:
        emulator.stop()


@pytest.fixture
def gcs_prefix(gcs_emulator: Emulator) -> str:
    """A fresh ``gs://`` prefix on the session's emulator."""
    return gcs_emulator.prefix()
