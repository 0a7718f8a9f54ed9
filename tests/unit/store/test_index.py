"""Unit tests of marinbuild.store.index: the status summary in object names, on ``memory://``."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from marinbuild.store.index import INDEX_DIR, Entry, StatusIndex, entry_names, forget, index_of, write_marker
from marinbuild.store.markers import FAILED, RUNNING, SUCCESS, StatusRecord, status_path
from marinbuild.store.storage import Storage


@pytest.fixture
def storage() -> Storage:
    return Storage.for_prefix(f"memory://index-{uuid.uuid4().hex[:8]}")


def _out(storage: Storage, name: str = "s-abc") -> str:
    return Storage.join(storage.prefix, name)


def _entries(storage: Storage) -> list[str]:
    return sorted(storage.list_names(Storage.join(storage.prefix, INDEX_DIR)))


def _write(storage: Storage, output: str, record: StatusRecord) -> None:
    write_marker(storage, status_path(output), output, record)


@pytest.mark.parametrize("key", ["s-abc", "sweep/lr=0.1@x-1", "with space/and%percent!"])
def test_entry_names_round_trip(key: str) -> None:
    for entry in (
        Entry(key, "id1", RUNNING),
        Entry(key, "id1", FAILED),
        Entry.success(key, "id1", 1700000000.25, 3.5, "d1g"),
        Entry.success(key, "id1", 1.0, None),
        Entry.success(key, "id1", 1.0, 2.0, "d1g", retries="f1.3_p4.100_h0.2_i0.2_v2.3600.0"),
    ):
        assert "/" not in entry.name
        parsed = Entry.parse(entry.name)
        assert parsed == entry
        assert parsed is not None and parsed.sound


def test_an_edited_success_entry_is_not_sound() -> None:
    entry = Entry.success("k", "id", 1.0, 2.0)
    edited = Entry.parse(entry.name.replace("@1.0@", "@5.0@"))
    assert edited is not None and not edited.sound


def test_a_success_entry_carries_its_retries_by_cause_and_an_edit_of_them_is_caught(storage: Storage) -> None:
    out = _out(storage)
    _write(storage, out, StatusRecord(RUNNING, 1.0, identity="abc"))
    _write(storage, out, StatusRecord(SUCCESS, 2.0, duration=1.0, identity="abc", retries="f1.3_h0.2"))
    (name,) = _entries(storage)
    assert "@rf1.3_h0.2@" in name
    index = StatusIndex(storage)
    believed = index.believed(index.read(), out, "abc")
    assert believed is not None and believed.retries == "f1.3_h0.2"
    edited = Entry.parse(name.replace("@rf1.3_", "@rf0.3_"))
    assert edited is not None and not edited.sound  # the check covers the counts
    assert Entry.parse(name.replace("@rf1.3_h0.2@", "@rf1;3@")) is None


@pytest.mark.parametrize("name", ["junk", "k@id@WHAT", "k@id@SUCCESS@nan@-@-@c", "k@id@SUCCESS@x@-@-@c", "k@id@SUCCESS@1.0"])
def test_names_that_are_not_entries_parse_to_none(name: str) -> None:
    assert Entry.parse(name) is None


def test_key_is_the_path_under_the_prefix(storage: Storage) -> None:
    index = StatusIndex(storage)
    assert index.key(_out(storage, "a/b")) == "a/b"
    assert index.key("memory://elsewhere/x") is None
    assert index.key(storage.prefix) is None


def test_success_leaves_one_entry_and_is_believed(storage: Storage) -> None:
    out = _out(storage)
    _write(storage, out, StatusRecord(RUNNING, 1.0, identity="abc"))
    _write(storage, out, StatusRecord(SUCCESS, 2.0, duration=1.0, identity="abc", drift="dd"))
    assert len(_entries(storage)) == 1
    index = StatusIndex(storage)
    seen = index.read()
    believed = index.believed(seen, out, "abc")
    assert believed is not None
    assert (believed.status, believed.time, believed.duration, believed.drift) == (SUCCESS, 2.0, 1.0, "dd")
    assert index.believed(seen, out, "another-identity") is None


def test_the_marker_is_written_with_its_entry(storage: Storage) -> None:
    out = _out(storage)
    _write(storage, out, StatusRecord(SUCCESS, 2.0, identity="abc"))
    assert storage.read_text(status_path(out)) == StatusRecord(SUCCESS, 2.0, identity="abc").to_json()


def test_failed_is_never_believed(storage: Storage) -> None:
    out = _out(storage)
    _write(storage, out, StatusRecord(FAILED, 2.0, error="boom", identity="abc"))
    index = StatusIndex(storage)
    assert index.believed(index.read(), out, "abc") is None
    assert index.without_success(out)


def test_two_entries_for_one_output_are_not_believed(storage: Storage) -> None:
    out = _out(storage)
    index = StatusIndex(storage)
    for entry in (Entry("s-abc", "abc", RUNNING), Entry.success("s-abc", "abc", 1.0, None)):
        storage.write_atomic(index.path(entry), "")
    seen = index.read()
    assert len(seen["s-abc"]) == 2
    assert index.believed(seen, out, "abc") is None
    assert not index.without_success(out)


def test_a_rerun_retires_the_earlier_success_entry(storage: Storage) -> None:
    out = _out(storage)
    index = index_of(storage)
    _write(storage, out, StatusRecord(SUCCESS, 1.0, identity="abc"))
    index.read()
    _write(storage, out, StatusRecord(RUNNING, 2.0, identity="abc"))
    names = _entries(storage)
    assert len(names) == 1 and names[0].endswith("@RUNNING")
    _write(storage, out, StatusRecord(SUCCESS, 3.0, identity="abc"))
    fresh = StatusIndex(storage)
    believed = fresh.believed(fresh.read(), out, "abc")
    assert believed is not None and believed.time == 3.0


def test_local_disk_keeps_no_summary(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    out = _out(storage)
    _write(storage, out, StatusRecord(SUCCESS, 1.0, identity="abc"))
    assert (Path(out) / ".marinbuild" / "status").exists()
    assert not (tmp_path / INDEX_DIR).exists()
    assert forget(storage, [out]) == 0


def test_forget_removes_the_entries_of_given_outputs(storage: Storage) -> None:
    a, b = _out(storage, "a-1"), _out(storage, "b-1")
    _write(storage, a, StatusRecord(SUCCESS, 1.0, identity="1"))
    _write(storage, b, StatusRecord(SUCCESS, 1.0, identity="1"))
    assert forget(storage, [a, "memory://elsewhere/z"]) == 1
    assert [Entry.parse(n).key for n in _entries(storage)] == ["b-1"]  # type: ignore[union-attr]


def test_entry_names_match_what_a_runner_writes(storage: Storage) -> None:
    out = _out(storage)
    record = StatusRecord(SUCCESS, 4.0, duration=1.5, identity="abc")
    _write(storage, out, record)
    [path] = entry_names(storage, [(out, "abc", record), ("memory://elsewhere/x", "abc", record)])
    assert storage.exists(path)


def test_index_of_is_one_per_storage(storage: Storage) -> None:
    assert index_of(storage) is index_of(storage)
