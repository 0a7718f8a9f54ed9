"""Unit tests of marinbuild.store.local: plain paths through ``os``, whole files only."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from marinbuild.store.conditional import LocalConditionalStore
from marinbuild.store.local import LocalStorage


@pytest.fixture
def store(tmp_path: Path) -> LocalStorage:
    return LocalStorage(str(tmp_path))


def test_paths_are_plain_and_local(store: LocalStorage, tmp_path: Path) -> None:
    assert store.prefix == str(tmp_path)
    assert store.is_local and not store.keeps_summary
    assert isinstance(store.conditional(), LocalConditionalStore)
    assert str(tmp_path) in repr(store)


def test_write_atomic_replaces_and_leaves_no_temporary(store: LocalStorage, tmp_path: Path) -> None:
    path = str(tmp_path / "m" / "status")
    store.write_atomic(path, "a")
    store.write_atomic(path, "b")
    assert Path(path).read_text() == "b"
    assert os.listdir(tmp_path / "m") == ["status"]


def test_read_many_raises_on_bytes_that_are_not_utf8(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "bad").write_bytes(b"\xff")
    with pytest.raises(UnicodeDecodeError):
        store.read_many([str(tmp_path / "bad")])


def test_read_text_of_a_path_under_a_file_is_none(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert store.read_text(str(tmp_path / "f" / "below")) is None
    assert store.list_names(str(tmp_path / "f")) == []


def test_remove_a_symlink_removes_the_link_only(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "keep").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "target")
    store.remove(str(tmp_path / "link"))
    assert not (tmp_path / "link").exists() and (tmp_path / "target" / "keep").exists()


def test_exists_sees_a_dangling_symlink(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    assert store.exists(str(tmp_path / "dangling"))


def test_put_file_onto_itself_is_a_noop(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("same")
    store.put_file(str(tmp_path / "f"), str(tmp_path / "f"))
    assert (tmp_path / "f").read_text() == "same"


def test_copy_in_failure_leaves_nothing(store: LocalStorage, tmp_path: Path) -> None:
    class Broken(io.RawIOBase):
        def readinto(self, b: bytearray) -> int:  # type: ignore[override]
            raise OSError("stream broke")

    with pytest.raises(OSError, match="stream broke"):
        store.copy_in(Broken(), str(tmp_path / "dst"))  # type: ignore[arg-type]
    assert os.listdir(tmp_path) == []


def test_remove_many_skips_missing(store: LocalStorage, tmp_path: Path) -> None:
    (tmp_path / "a").write_text("x")
    store.remove_many([str(tmp_path / "a"), str(tmp_path / "b")])
    assert os.listdir(tmp_path) == []


def test_makedirs_finds_a_folder_makes_a_missing_one_and_refuses_a_file(store: LocalStorage, tmp_path: Path) -> None:
    deep = str(tmp_path / "a" / "b" / "c")
    store.makedirs(deep)  # parents missing
    store.makedirs(deep)  # already there
    assert os.path.isdir(deep)
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError):
        store.makedirs(str(tmp_path / "f"))


def test_read_many_reads_files_longer_than_one_read(store: LocalStorage, tmp_path: Path) -> None:
    sizes = {"empty": 0, "short": 10, "chunk": 65536, "long": 65536 * 2 + 7}
    for name, size in sizes.items():
        (tmp_path / name).write_text("é" * (size // 2) + "x" * (size % 2))
    texts = store.read_many([str(tmp_path / n) for n in sizes])
    assert {Path(p).name: len(t.encode()) for p, t in texts.items()} == sizes


def test_a_replaced_marker_is_kept_as_previous_not_freed(store: LocalStorage, tmp_path: Path) -> None:
    # Freeing an inode per step made every later file creation slower on ext4 without a
    # journal; the first version of a marker is kept under another name instead.
    folder = tmp_path / "out" / ".marinbuild"
    path = str(folder / "status")
    store.write_atomic(path, "RUNNING")
    first = os.stat(path).st_ino
    store.write_atomic(path, "SUCCESS")
    assert Path(path).read_text() == "SUCCESS"
    assert (folder / "status.previous").read_text() == "RUNNING"
    assert os.stat(folder / "status.previous").st_ino == first
    store.write_atomic(path, "SUCCESS again")  # a rerun: the name is taken, the old one goes
    assert Path(path).read_text() == "SUCCESS again"
    assert sorted(os.listdir(folder)) == ["status", "status.previous"]
