"""A real GCS endpoint for tests: ``gcp-storage-emulator`` on loopback, reached through gcsfs.

The emulator runs in its own process (in-memory, a free port, one bucket) and writes one
log line per request, which is how requests are counted. gcsfs finds it through
``STORAGE_EMULATOR_HOST``; ``FSSPEC_GS_TOKEN=anon`` stops it from looking for credentials,
and ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` keeps gcsfs from asking a gRPC control API
the emulator does not have about each bucket. :attr:`Emulator.env` holds the three for a
``marinbuild run`` subprocess; the fixture sets them in this process too. The plain
functions serve the benchmark as well::

    emulator = start_emulator(Path("/tmp/emu"))
    ...
    emulator.stop()
"""

from __future__ import annotations

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

BUCKET = "marinbuild-test"
_REQUEST = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) ')


@dataclass
class Emulator:
    """A running emulator: its endpoint, the environment that points gcsfs at it, its log."""

    process: subprocess.Popen[bytes]
    endpoint: str
    log: Path
    bucket: str = BUCKET

    @property
    def env(self) -> dict[str, str]:
        return {
            "STORAGE_EMULATOR_HOST": self.endpoint,
            "FSSPEC_GS_TOKEN": "anon",
            "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        }

    def requests(self) -> int:
        """Requests the emulator has answered so far."""
        return sum(1 for line in self.log.read_text(errors="replace").splitlines() if _REQUEST.search(line))

    def prefix(self) -> str:
        """A fresh ``gs://`` prefix no other test uses."""
        return f"gs://{self.bucket}/{uuid.uuid4().hex[:12]}"

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_emulator(folder: Path, bucket: str = BUCKET) -> Emulator:
    """Start the emulator on a free loopback port and wait until it answers."""
    folder.mkdir(parents=True, exist_ok=True)
    port = _free_port()
    log = folder / "emulator.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-c", _LAUNCH, "start", "--host", "127.0.0.1", "--port", str(port),
             "--in-memory", "--default-bucket", bucket],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    emulator = Emulator(process, f"http://127.0.0.1:{port}", log, bucket)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the storage emulator exited: {log.read_text(errors='replace')[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return emulator
        except OSError:
            time.sleep(0.1)
    emulator.stop()
    raise RuntimeError("the storage emulator did not start within 30 s")


def point_gcsfs_at(emulator: Emulator) -> None:
    """Make ``gs://`` in this process reach the emulator, however gcsfs was imported before."""
    os.environ.update(emulator.env)
    import fsspec
    import fsspec.config
    import gcsfs.core

    fsspec.config.conf.setdefault("gs", {})["token"] = "anon"
    fsspec.config.conf.setdefault("gcs", {})["token"] = "anon"
    for protocol in ("gs", "gcs"):
        fsspec.register_implementation(protocol, gcsfs.core.GCSFileSystem, clobber=True)
    gcsfs.core.GCSFileSystem.clear_instance_cache()


def gcs_filesystem(emulator: Emulator) -> Any:
    """A gcsfs filesystem on the emulator (no instance cache, so nothing stale)."""
    import gcsfs.core

    return gcsfs.core.GCSFileSystem(endpoint_url=emulator.endpoint, token="anon", skip_instance_cache=True)


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


@pytest.fixture
def gcs_prefix(gcs_emulator: Emulator) -> str:
    """A fresh ``gs://`` prefix on the session's emulator."""
    return gcs_emulator.prefix()
