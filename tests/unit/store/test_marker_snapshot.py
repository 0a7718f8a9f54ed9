"""The stat-checked snapshot of status markers: it saves the reads of unchanged markers and
never stands in for a marker that changed (a hand edit of the same size with its mtime put
back, a file renamed over it, a removal, a folder in its place, an edit during the read)."""

from __future__ import annotations

import json
import marshal
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash

from marinbuild.errors import StorageError
from marinbuild.store import marker_snapshot
from marinbuild.store.local import LocalStorage
from marinbuild.store.marker_snapshot import SETTLED_NS, SNAPSHOT_FILE, MarkerSnapshot
from marinbuild.store.markers import UNREADABLE, StatusRecord, read_statuses, status_path, write_status

_FIELDS = ("status", "time", "error", "duration", "owner", "name", "identity", "drift", "retries", "inputs",
           "starting_over", "inputs_digest", "leased_by", "mismatch")


@pytest.fixture
def prefix(tmp_path: Path) -> str:
    return str(tmp_path / "out")


def _build(prefix: str, n: int = 4) -> tuple[LocalStorage, list[str]]:
    storage = LocalStorage(prefix)
    outputs = []
    for i in range(n):
        out = f"{prefix}/s{i}-{i:016x}"
        os.makedirs(out)
        write_status(storage, out, "SUCCESS", name=f"s{i}", identity=f"{i:016x}", owner="host:1", duration=0.5,
                     drift="ab12", retries=None, inputs=(("s0", 12.5),) if i else None)
        outputs.append(out)
    return storage, outputs


def _settle(paths: list[str]) -> None:
    """Wait until every marker's change time is older than what the snapshot keeps."""
    newest = max(os.stat(status_path(p)).st_ctime_ns for p in paths)
    while time.time_ns() - SETTLED_NS <= newest:
        time.sleep(0.05)


class _Pool:
    """Prefixes of markers built together and settled together: one wait of SETTLED_NS for the
    module's tests on this worker, not one each. Each prefix is handed out once."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.free: dict[int, list[tuple[str, LocalStorage, list[str]]]] = {4: [], 6: []}
        built = []
        for n, count in ((4, 40), (6, 6)):
            for _ in range(count):
                built.append((n, self._build(n)))
        _settle([o for _, (_, _, outputs) in built for o in outputs])
        for n, entry in built:
            self.free[n].append(entry)

    def _build(self, n: int) -> tuple[str, LocalStorage, list[str]]:
        prefix = tempfile.mkdtemp(dir=self.root) + "/out"
        return (prefix, *_build(prefix, n))

    def take(self, n: int = 4) -> tuple[str, LocalStorage, list[str]]:
        """A prefix of ``n`` settled SUCCESS markers, its storage and its outputs."""
        if self.free.get(n):
            return self.free[n].pop()
        entry = self._build(n)  # more tests than built: this one waits on its own
        _settle(entry[2])
        return entry


Settled = Callable[..., tuple[str, LocalStorage, list[str]]]


@pytest.fixture(scope="module")
def _pool(tmp_path_factory: pytest.TempPathFactory) -> _Pool:
    return _Pool(tmp_path_factory.mktemp("settled"))


@pytest.fixture
def settled(_pool: _Pool) -> Settled:
    """``settled(n=4)``: a fresh prefix of ``n`` SUCCESS markers whose change times are settled."""
    return _pool.take


def _outcome(read: Callable[[], StatusRecord]) -> tuple[object, ...]:
    """The record's fields, or the one-line refusal a command would end with."""
    try:
        return _fields(read())
    except StorageError as e:
        return ("refused", str(e))


def _fields(record: StatusRecord) -> tuple[object, ...]:
    return tuple(getattr(record, f) for f in _FIELDS)  # the compare=False ones too


class _Reads:
    """Which outputs the snapshot sent to the markers' own read."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.outputs: list[str] = []
        real = marker_snapshot.read_records

        def spy(storage, outputs):  # type: ignore[no-untyped-def]
            outputs = list(outputs)
            self.outputs += outputs
            return real(storage, outputs)

        monkeypatch.setattr(marker_snapshot, "read_records", spy)


def _saved(prefix: str, storage: LocalStorage, outputs: list[str]) -> None:
    snapshot = MarkerSnapshot(prefix)
    snapshot.read_statuses(storage, outputs)
    snapshot.save()


def test_unchanged_markers_are_not_read_again_and_come_back_as_read(settled: Settled, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, storage, outputs = settled()
    identities = {o: o.rsplit("-", 1)[1] for o in outputs} | {outputs[1]: "f" * 16}
    _saved(prefix, storage, outputs)
    assert os.path.isfile(os.path.join(prefix, ".marinbuild", SNAPSHOT_FILE))

    reads = _Reads(monkeypatch)
    got = MarkerSnapshot(prefix).read_statuses(storage, outputs, identities)
    assert reads.outputs == []
    expected = read_statuses(storage, outputs, identities)
    assert {o: _fields(r) for o, r in got.items()} == {o: _fields(r) for o, r in expected.items()}
    assert got[outputs[1]].mismatch is not None  # the identity is compared after, as for a read
    assert got[outputs[0]].mismatch is None and got[outputs[2]].inputs == (("s0", 12.5),)


def test_a_hand_edit_of_the_same_size_with_its_mtime_put_back_is_read(settled: Settled, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    marker = status_path(outputs[2])
    before = os.stat(marker)
    text = Path(marker).read_text()
    edited = text.replace('"SUCCESS"', '"RUNNERS"')  # same length, same size
    assert len(edited) == len(text) and edited != text
    with open(marker, "r+") as f:  # in place: the same inode
        f.write(edited)
    os.utime(marker, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(marker)
    assert (after.st_ino, after.st_size, after.st_mtime_ns) == (before.st_ino, before.st_size, before.st_mtime_ns)

    reads = _Reads(monkeypatch)
    got = MarkerSnapshot(prefix).read_statuses(storage, outputs)
    assert reads.outputs == [outputs[2]]
    assert got[outputs[2]].status == "RUNNERS"
    assert got[outputs[0]].status == "SUCCESS"


def test_a_file_renamed_over_a_marker_is_read(settled: Settled) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    marker = status_path(outputs[0])
    before = os.stat(marker)
    record = json.loads(Path(marker).read_text())
    replacement = marker + ".new"
    Path(replacement).write_text(json.dumps({**record, "status": "FAILED", "error": "x"}))
    os.utime(replacement, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.rename(replacement, marker)

    got = MarkerSnapshot(prefix).read_statuses(storage, outputs)
    assert got[outputs[0]].status == "FAILED" and got[outputs[0]].error == "x"


def test_a_removed_marker_is_no_status_and_leaves_the_snapshot(settled: Settled) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    os.unlink(status_path(outputs[3]))
    snapshot = MarkerSnapshot(prefix)
    got = snapshot.read_statuses(storage, outputs)
    assert outputs[3] not in got and len(got) == 3
    snapshot.save()
    assert outputs[3] not in MarkerSnapshot(prefix)._loaded()


@pytest.mark.parametrize("kind", ["folder", "fifo", "not_utf8"])
def test_what_cannot_be_read_is_named_as_a_read_names_it_each_time(settled: Settled, kind: str) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    marker = status_path(outputs[1])
    os.unlink(marker)
    if kind == "folder":
        os.mkdir(marker)
    elif kind == "fifo":
        os.mkfifo(marker)
    else:
        Path(marker).write_bytes(b'{"status": "SUCC\xff"}')
    expected = _outcome(lambda: read_statuses(storage, outputs)[outputs[1]])
    assert expected[0] == UNREADABLE or "is not a regular file (a FIFO)" in str(expected)
    for _ in range(2):  # and again once saved: an unreadable marker is never kept
        snapshot = MarkerSnapshot(prefix)
        assert _outcome(lambda s=snapshot: s.read_statuses(storage, outputs)[outputs[1]]) == expected
        snapshot.save()
    assert outputs[1] not in MarkerSnapshot(prefix)._loaded()


def test_a_marker_changed_moments_ago_is_not_kept(prefix: str, monkeypatch: pytest.MonkeyPatch) -> None:
    storage, outputs = _build(prefix)  # not settled: each ctime is within SETTLED_NS of now
    _saved(prefix, storage, outputs)
    reads = _Reads(monkeypatch)
    MarkerSnapshot(prefix).read_statuses(storage, outputs)
    assert reads.outputs == outputs


def test_a_marker_edited_during_its_read_is_not_kept(settled: Settled, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, storage, outputs = settled()
    real = marker_snapshot.read_records

    def read_then_edit(storage, wanted):  # type: ignore[no-untyped-def]
        records = real(storage, wanted)
        with open(status_path(outputs[0]), "a") as f:  # lands after the read, before the check
            f.write(" ")
        return records

    monkeypatch.setattr(marker_snapshot, "read_records", read_then_edit)
    snapshot = MarkerSnapshot(prefix)
    snapshot.read_statuses(storage, outputs)
    entries = snapshot._loaded()
    assert outputs[0] not in entries and set(entries) == set(outputs[1:])


def _rewrite(path: str, body: bytes) -> None:
    Path(path).write_bytes(b"marinbuild markers 1\n" + xxhash.xxh3_64_digest(body) + body)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "garbage", "empty", "other_parser", "short_stats", "folder"])
def test_a_damaged_snapshot_reads_as_empty_and_the_markers_decide(settled: Settled, damage: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    path = os.path.join(prefix, ".marinbuild", SNAPSHOT_FILE)
    data = Path(path).read_bytes()
    head = len(b"marinbuild markers 1\n") + 8
    if damage == "truncated":
        Path(path).write_bytes(data[: len(data) // 2])
    elif damage == "flipped":
        Path(path).write_bytes(data[:-5] + bytes([data[-5] ^ 1]) + data[-4:])
    elif damage == "garbage":
        Path(path).write_bytes(os.urandom(len(data)))
    elif damage == "empty":
        Path(path).write_bytes(b"")
    elif damage == "other_parser":
        key, outs, stats, values = marshal.loads(data[head:])
        _rewrite(path, marshal.dumps((b"another version", outs, stats, values)))
    elif damage == "short_stats":
        key, outs, stats, values = marshal.loads(data[head:])
        _rewrite(path, marshal.dumps((key, outs, stats[:-1], values)))
    else:
        os.unlink(path)
        os.mkdir(path)
    # Every marker says FAILED now; a snapshot trusted in spite of its damage would say SUCCESS.
    for out in outputs:
        marker = status_path(out)
        before = os.stat(marker)
        text = Path(marker).read_text().replace('"SUCCESS"', '"FAILED!"')
        Path(marker).write_text(text)
        os.utime(marker, ns=(before.st_atime_ns, before.st_mtime_ns))
    reads = _Reads(monkeypatch)
    got = MarkerSnapshot(prefix).read_statuses(storage, outputs)
    assert sorted(reads.outputs) == sorted(outputs)
    assert {r.status for r in got.values()} == {"FAILED!"}


def test_a_snapshot_another_user_owns_is_not_trusted(settled: Settled, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    real_uid = os.geteuid()
    monkeypatch.setattr(marker_snapshot.os, "geteuid", lambda: real_uid + 1)  # the file is now another's
    reads = _Reads(monkeypatch)
    MarkerSnapshot(prefix).read_statuses(storage, outputs)
    assert sorted(reads.outputs) == sorted(outputs)


def test_a_snapshot_that_cannot_be_saved_is_no_error_and_leaves_no_file(settled: Settled) -> None:
    prefix, storage, outputs = settled()
    folder = os.path.join(prefix, ".marinbuild")
    os.makedirs(os.path.join(folder, SNAPSHOT_FILE))  # a folder where it belongs: the rename fails, for root too
    snapshot = MarkerSnapshot(prefix)
    assert len(snapshot.read_statuses(storage, outputs)) == 4
    snapshot.save()
    assert [n for n in os.listdir(folder) if n != SNAPSHOT_FILE] == []
    assert MarkerSnapshot(prefix)._loaded() == {}


def test_two_runners_saving_at_once_leave_a_sound_snapshot(settled: Settled) -> None:
    prefix, storage, outputs = settled(6)
    first, second = MarkerSnapshot(prefix), MarkerSnapshot(prefix)
    first.read_statuses(storage, outputs[:3])
    second.read_statuses(storage, outputs[3:])
    first.save()
    second.save()  # the last one wins; what the first kept is read again next time
    assert set(MarkerSnapshot(prefix)._loaded()) == set(outputs[3:])
    assert [n for n in os.listdir(os.path.join(prefix, ".marinbuild")) if n != SNAPSHOT_FILE] == []


def test_nothing_is_written_when_every_marker_came_from_the_snapshot(settled: Settled) -> None:
    prefix, storage, outputs = settled()
    _saved(prefix, storage, outputs)
    path = os.path.join(prefix, ".marinbuild", SNAPSHOT_FILE)
    inode = os.stat(path).st_ino
    _saved(prefix, storage, outputs)
    assert os.stat(path).st_ino == inode


def test_outputs_not_asked_about_stay_while_their_markers_exist(settled: Settled) -> None:
    prefix, storage, outputs = settled(6)
    _saved(prefix, storage, outputs)
    shutil.rmtree(outputs[5])  # cleaned away by hand
    os.unlink(status_path(outputs[0]))
    snapshot = MarkerSnapshot(prefix)
    snapshot.read_statuses(storage, outputs[:2])  # another target: only two are asked about
    snapshot.save()
    assert set(MarkerSnapshot(prefix)._loaded()) == set(outputs[1:5])
