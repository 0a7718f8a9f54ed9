"""The storage layer: one retry loop (gcsfs makes each request once) and lease I/O that ends at its deadline."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marinbuild.errors import StorageError
from marinbuild.store import retry
from marinbuild.store.conditional import conditional_store
from marinbuild.store.fsspec_store import FsspecStorage
from marinbuild.store.gcs_session import single_attempt_session
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
    import gcsfs

    fs = gcsfs.GCSFileSystem(endpoint_url=endpoint, token="anon", skip_instance_cache=True,
                             session_kwargs=single_attempt_session())
    return FsspecStorage(prefix, fs)


def test_storage_for_prefix_picks_the_implementation(tmp_path: Path) -> None:
    assert isinstance(Storage.for_prefix(str(tmp_path)), LocalStorage)
    assert isinstance(Storage.for_prefix("memory://picked"), FsspecStorage)


def tries(emulator: Emulator, pattern: str) -> int:
    """Requests the test server answered whose line matches ``pattern``."""
    return len(re.findall(pattern, emulator.log.read_text()))


def test_gcs_requests_are_made_once_and_retried_by_marinbuild_alone(
    gcs_emulator: Emulator, gcs_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    key = gcs_prefix.split("/", 3)[3]
    gcs_emulator.control("fail", pattern=f"GET /[a-z/]*storage/v1/b/[^/]+/o/{key}%2Fx", status=503, count=100)
    try:
        monkeypatch.setattr(retry, "DEFAULT_POLICY", RetryPolicy(attempts=3, base=0.001, cap=0.01))
        with pytest.raises(StorageError, match=rf"^read {gcs_prefix}/x failed after 3 attempts: StoreUnavailable: HTTP 503"):
            storage.read_text(f"{gcs_prefix}/x")
        # gcsfs alone retries a 503 six times per call (18 requests here, with waits of up to 32 s).
        assert tries(gcs_emulator, rf'"GET /[a-z/]*storage/v1/b/[^/]+/o/{key}%2Fx[ ?]') == 3
    finally:
        gcs_emulator.control("clear")
    assert tries(gcs_emulator, rf'"GET /[a-z/]*storage/v1/b/[^/]+/o/{key}%2Fx[ ?]') == 3


def test_an_upload_answered_503_is_tried_once_per_marinbuild_attempt(
    gcs_emulator: Emulator, gcs_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    key = gcs_prefix.split("/", 3)[3]
    gcs_emulator.control("fail", pattern=f"POST /upload/storage/v1/b/[^/]+/o.* object={key}/y$", status=503, count=4)
    monkeypatch.setattr(retry, "DEFAULT_POLICY", RetryPolicy(base=0.001, cap=0.01))
    storage.write_atomic(f"{gcs_prefix}/y", "at last")  # four refusals, then the fifth of six attempts lands
    assert storage.read_text(f"{gcs_prefix}/y") == "at last"
    assert tries(gcs_emulator, rf'"POST /upload/storage/v1/b/[^/]+/o\?.* object={key}/y\n') == 5


def test_gcs_storage_opened_from_a_prefix_is_the_filesystem_gcsfs_picks(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    import gcsfs
    from gcsfs.extended_gcsfs import ExtendedGcsFileSystem

    storage = Storage.for_prefix(gcs_prefix)
    assert isinstance(storage, FsspecStorage)
    assert type(storage.fs) is gcsfs.GCSFileSystem is ExtendedGcsFileSystem  # gcsfs's default, not a subclass
    assert storage.fs.session_kwargs == single_attempt_session()
    storage.write_atomic(f"{gcs_prefix}/a", "hi")
    assert storage.read_text(f"{gcs_prefix}/a") == "hi"
    assert Storage.for_prefix(gcs_prefix).fs is storage.fs  # fsspec's instance cache still finds it


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


def test_a_mirrored_gs_source_is_retried_by_marinbuild_alone(
    gcs_emulator: Emulator, gcs_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from marinbuild import mirrored
    from marinbuild.store.mirror import ensure_mirrored

    source = f"{gcs_prefix}/elsewhere/vocab.json"
    Storage.for_prefix(gcs_prefix).write_atomic(source, '{"a": 1}')
    key = source.split("/", 3)[3].replace("/", "%2F")
    # The source's download answers 503 twice: marinbuild's second retry gets it, one request each.
    gcs_emulator.control("fail", pattern=f"GET /download/storage/v1/b/[^/]+/o/{key}[?]", status=503, count=2)
    monkeypatch.setattr(retry, "DEFAULT_POLICY", RetryPolicy(base=0.001, cap=0.01))
    copy = ensure_mirrored(mirrored(source, budget_gb=1), Storage.for_prefix(str(tmp_path / "prefix")))
    assert Path(copy).read_text() == '{"a": 1}'
    assert tries(gcs_emulator, rf'"GET /download/storage/v1/b/[^/]+/o/{key}[?]') == 3  # gcsfs alone: 6 a call
