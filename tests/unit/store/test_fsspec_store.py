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
from marinbuild.store.fsspec_store import FsspecStorage, _glob_literal, _is_gcs, single_attempt
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


def test_single_attempt_unwraps_retried_methods() -> None:
    def retried(fn):  # type: ignore[no-untyped-def]
        def wrapper(*a, **k):  # type: ignore[no-untyped-def]
            return ("retried", fn(*a, **k))

        wrapper.__wrapped__ = fn  # type: ignore[attr-defined]
        return wrapper

    class Client:
        @retried
        def _request(self) -> str:
            return "once"

        def other(self) -> str:
            return "plain"

    single = single_attempt(Client)
    assert single is single_attempt(Client)  # made once per class
    assert single()._request() == "once" and Client()._request() == ("retried", "once")
    assert single().other() == "plain"


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


def test_the_installed_gcsfs_retries_as_single_attempt_undoes() -> None:
    from gcsfs.core import GCSFileSystem

    from marinbuild.store.fsspec_store import check_gcsfs_retries

    check_gcsfs_retries(GCSFileSystem)  # the gcsfs of the gcs extra: nothing to refuse
    single = single_attempt(GCSFileSystem)
    assert single._request is GCSFileSystem._request.__wrapped__  # type: ignore[attr-defined]


def test_a_gcsfs_that_changed_its_retries_is_refused_in_one_line() -> None:
    from gcsfs.core import GCSFileSystem

    from marinbuild.errors import UserError
    from marinbuild.store.fsspec_store import check_gcsfs_retries

    class Changed(GCSFileSystem):  # type: ignore[misc]
        async def _request(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # retried some other way now
            return None

    with pytest.raises(UserError) as refused:
        check_gcsfs_retries(Changed)
    assert "Changed._request" in str(refused.value) and "\n" not in str(refused.value)
    assert "_get_file_request" not in str(refused.value)  # only what changed is named
