"""The storage layer: one retry loop (gcsfs makes each request once) and lease I/O that ends at its deadline."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marinbuild.errors import StorageError
from marinbuild.store import retry
from marinbuild.store.conditional import conditional_store
from marinbuild.store.fsspec_store import FsspecStorage, single_attempt
from marinbuild.store.local import LocalStorage
from marinbuild.store.retry import RetryPolicy, bounded, each_request_within
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]


@contextlib.contextmanager
def retry_policy(policy: RetryPolicy) -> Iterator[None]:
    saved = retry.DEFAULT_POLICY
    retry.DEFAULT_POLICY = policy
    try:
        yield
    finally:
        retry.DEFAULT_POLICY = saved


def gcs_storage(endpoint: str, prefix: str) -> FsspecStorage:
    import gcsfs.core

    cls = single_attempt(gcsfs.core.GCSFileSystem)
    return FsspecStorage(prefix, cls(endpoint_url=endpoint, token="anon", skip_instance_cache=True))


class Dropper:
    """An HTTP server on loopback that answers every request ``503 Service Unavailable``, counting them."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)  # the request (small: a GET)
                self.accepted += 1
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def dropper() -> Iterator[Dropper]:
    d = Dropper()
    yield d
    d.close()


def test_storage_for_prefix_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(Storage.for_prefix(str(tmp_path)), LocalStorage)
    assert isinstance(Storage.for_prefix("memory://picked"), FsspecStorage)


def test_gcs_requests_are_made_once_and_retried_by_marinbuild_alone(
    dropper: Dropper, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "DEFAULT_POLICY", RetryPolicy(attempts=3, base=0.001, cap=0.01))
    storage = gcs_storage(dropper.endpoint, "gs://bucket/p")
    with pytest.raises(StorageError, match=r"^read gs://bucket/p/x failed after 3 attempts: HttpError"):
        storage.read_text("gs://bucket/p/x")
    # gcsfs alone retries a 503 six times per call (18 requests here, with waits of up to 32 s).
    assert dropper.accepted == 3


def test_gcs_storage_opened_from_a_prefix_makes_requests_once(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    assert isinstance(storage, FsspecStorage)
    assert not hasattr(type(storage.fs)._request, "__wrapped__")  # gcsfs's own retry decorator is gone
    storage.write_atomic(f"{gcs_prefix}/a", "hi")
    assert storage.read_text(f"{gcs_prefix}/a") == "hi"


def test_lease_io_ends_at_its_deadline(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    from bench.latency_proxy import start_proxy

    proxy = start_proxy(gcs_emulator.endpoint, delay=120.0)  # a store that stopped answering
    try:
        store = conditional_store(gcs_storage(proxy.endpoint, gcs_prefix), deadline=1.0)
        with pytest.raises(StorageError, match="did not finish in time"):
            store.read(f"{gcs_prefix}/s/.marinbuild/lease")
        with pytest.raises(StorageError, match="did not finish in time"):
            store.create(f"{gcs_prefix}/s/.marinbuild/lease", "mine")
        plain = gcs_storage(proxy.endpoint, gcs_prefix)
        leases = [f"{gcs_prefix}/s/.marinbuild/lease", f"{gcs_prefix}/t/.marinbuild/lease"]
        with bounded(1.0), pytest.raises(StorageError, match="did not finish in time"):
            plain.read_many(leases)
        # A batch of lease reads bounds each request, and retries those that hung under the one policy.
        quick = RetryPolicy(attempts=2, base=0.001, cap=0.01)
        with retry_policy(quick), each_request_within(1.0), pytest.raises(StorageError, match="after 2 attempts"):
            plain.read_many(leases)
    finally:
        proxy.stop()


def test_bounded_keeps_the_earlier_deadline() -> None:
    with bounded(100.0):
        outer = retry.remaining()
        with bounded(1000.0):
            inner = retry.remaining()
    assert outer is not None and inner is not None and inner <= outer
    assert retry.remaining() is None


def test_write_many_writes_and_removes_together(tmp_path: Path) -> None:
    for storage in (Storage.for_prefix(str(tmp_path)), Storage.for_prefix("memory://together")):
        a, b, c = (storage.join(storage.prefix, n) for n in ("d/a", "d/b", "d/c"))
        storage.write_atomic(c, "old")
        storage.write_many({a: "1", b: b"2"}, remove=[c, storage.join(storage.prefix, "d/missing")])
        assert storage.read_many([a, b, c]) == {a: "1", b: "2"}
