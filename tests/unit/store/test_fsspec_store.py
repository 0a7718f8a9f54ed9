"""Unit tests of marinbuild.store.fsspec_store: a prefix reached through an fsspec filesystem.

A memory filesystem stands in for a remote store; one subclass of it fails some requests
once, as a network does, to show that only the failed requests are asked again.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from fsspec.implementations.memory import MemoryFileSystem

from marinbuild.errors import StorageError, UserError
from marinbuild.store.conditional import SerializedConditionalStore
from marinbuild.store.fsspec_store import FsspecStorage, _glob_literal, _is_gcs, open_filesystem
from marinbuild.store.retry import RetryPolicy


class Flaky(MemoryFileSystem):
    """Fails the first read of every path whose name starts with ``flaky``; counts reads."""

    cachable = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.failed: set[str] = set()
        self.reads: list[str] = []

    def cat_file(self, path: str, *args: Any, **kwargs: Any) -> bytes:
        self.reads.append(path)
        if path.rsplit("/", 1)[-1].startswith("flaky") and path not in self.failed:
            self.failed.add(path)
            raise ConnectionResetError("dropped")
        return super().cat_file(path, *args, **kwargs)  # type: ignore[no-any-return]


def _prefix() -> str:
    return f"memory://fs-{uuid.uuid4().hex[:8]}"


def test_open_a_memory_prefix() -> None:
    prefix = _prefix()
    s = FsspecStorage.open(prefix)
    assert s.prefix == prefix and not s.is_local and s.keeps_summary
    assert "memory" in s.protocols
    assert isinstance(s.conditional(), SerializedConditionalStore)
    assert prefix in repr(s)


def test_unknown_protocol_is_a_user_error() -> None:
    with pytest.raises(UserError, match="prefix 'bogus-proto://x'"):
        FsspecStorage.open("bogus-proto://x")


def test_read_many_asks_again_only_for_what_failed() -> None:
    prefix = _prefix()
    s = FsspecStorage(prefix, Flaky())
    for name in ("ok", "flaky1"):
        s.write_atomic(f"{prefix}/{name}", name)
    got = s.read_many([f"{prefix}/ok", f"{prefix}/flaky1", f"{prefix}/missing"])
    assert got == {f"{prefix}/ok": "ok", f"{prefix}/flaky1": "flaky1"}
    assert sum(r.endswith("/ok") for r in s.fs.reads) == 1
    assert sum(r.endswith("/flaky1") for r in s.fs.reads) == 2


def test_read_text_is_retried_after_a_transient_error() -> None:
    prefix = _prefix()
    s = FsspecStorage(prefix, Flaky())
    s.write_atomic(f"{prefix}/flaky", "x")
    assert s.read_text(f"{prefix}/flaky") == "x"
    assert s.read_text(f"{prefix}/absent") is None


def test_a_read_that_keeps_failing_is_one_storage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    class Down(MemoryFileSystem):
        def cat_file(self, path: str, *args: Any, **kwargs: Any) -> bytes:
            raise ConnectionResetError("down")

    prefix = _prefix()
    s = FsspecStorage(prefix, Down())
    monkeypatch.setattr("marinbuild.store.retry.DEFAULT_POLICY", RetryPolicy(attempts=2, base=0.001, cap=0.001))
    with pytest.raises(StorageError, match="read"):
        s.read_text(f"{prefix}/x")


def test_list_names_sees_writes_made_through_another_client() -> None:
    prefix = _prefix()
    s = FsspecStorage.open(prefix)
    s.write_atomic(f"{prefix}/a", "1")
    assert s.list_names(prefix) == ["a"]
    FsspecStorage.open(prefix).write_atomic(f"{prefix}/b", "2")
    assert sorted(s.list_names(prefix)) == ["a", "b"]
    assert s.list_names(f"{prefix}/none") == []


def test_makedirs_creates_nothing_on_an_object_store() -> None:
    prefix = _prefix()
    s = FsspecStorage.open(prefix)
    s.makedirs(f"{prefix}/folder")
    assert s.list_names(prefix) == []


def test_is_gcs_by_protocol() -> None:
    class P:
        def __init__(self, protocol: object) -> None:
            self.protocol = protocol

    assert _is_gcs(P(("gs", "gcs")))
    assert _is_gcs(P("gs"))
    assert not _is_gcs(P("memory"))


def test_list_holding_names_the_entries_that_hold_the_file() -> None:
    storage = FsspecStorage.open(f"memory://holding-{uuid.uuid4().hex[:8]}")
    base = storage.prefix
    storage.write_many({f"{base}/a-1/.marinbuild/status": "{}", f"{base}/b-2/logs/step.log": "x",
                        f"{base}/c-3/.marinbuild/info.json": "{}"})
    assert storage.list_holding(base, ".marinbuild/status") == ["a-1"]  # a folder without its marker is left out
    assert storage.list_holding(f"{base}/missing", ".marinbuild/status") == []


def test_glob_literal_puts_each_special_character_in_a_class() -> None:
    assert _glob_literal("plain/path-1/") == "plain/path-1/"
    assert _glob_literal("a*b?c[d{e\\f") == "a[*]b[?]c[[]d[{]e[\\]f"


def test_a_gs_url_opens_the_class_gcsfs_picks_with_a_single_attempt_session() -> None:
    import gcsfs

    from marinbuild.store.gcs_session import is_single_attempt

    fs, path = open_filesystem("gs://some-bucket/some/path", "prefix")
    assert type(fs) is gcsfs.GCSFileSystem  # no subclass of marinbuild's: gcsfs's own choice
    assert path == "some-bucket/some/path"
    assert is_single_attempt(fs.session_kwargs)
    assert open_filesystem("gs://some-bucket/other", "prefix")[0] is fs  # one instance, as fsspec caches it


def test_an_unknown_protocol_is_one_line() -> None:
    from marinbuild.errors import UserError

    with pytest.raises(UserError, match=r"^mirrored"):
        open_filesystem("nosuchproto://x/y", "mirrored('nosuchproto://x/y')")
