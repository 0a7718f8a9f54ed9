"""Unit tests of marinbuild.store.storage: resolving a prefix and what every store must do alike."""

from __future__ import annotations

import io
import os
import uuid
from pathlib import Path

import pytest

from marinbuild.errors import UserError
from marinbuild.store.storage import (
    DEFAULT_PREFIX,
    Storage,
    check_local_prefix,
    resolve_prefix,
    unlink_quietly,
    write_temporary,
)


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    prefix = str(tmp_path / "p") if request.param == "local" else f"memory://st-{uuid.uuid4().hex[:8]}"
    s = Storage.for_prefix(prefix)
    s.makedirs(prefix)
    return s


def test_resolve_prefix_flag_env_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MARIN_PREFIX", raising=False)
    assert resolve_prefix(None) == str(tmp_path / DEFAULT_PREFIX)
    monkeypatch.setenv("MARIN_PREFIX", "gs://bucket/exp/")
    assert resolve_prefix(None) == "gs://bucket/exp"
    assert resolve_prefix("file://" + str(tmp_path / "x")) == str(tmp_path / "x")
    assert resolve_prefix("rel") == str(tmp_path / "rel")


@pytest.mark.parametrize(("prefix", "problem"), [("gs://", "names no bucket"), ("/", "filesystem root")])
def test_resolve_prefix_refuses_roots(prefix: str, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        resolve_prefix(prefix)


def test_check_local_prefix(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        check_local_prefix(str(tmp_path / "file" / "below"))
    check_local_prefix(str(tmp_path / "new" / "deep"))
    assert not (tmp_path / "new").exists()  # nothing written without create
    check_local_prefix(str(tmp_path / "new" / "deep"), create=True)
    assert (tmp_path / "new" / "deep").is_dir()


def test_join() -> None:
    assert Storage.join("/a", "b") == "/a/b"
    assert Storage.join("/a/", "b") == "/a/b"
    assert Storage.join("gs://b/p", "x", "y") == "gs://b/p/x/y"
    assert Storage.join("/a", "/abs") == "/abs"


def test_for_prefix_picks_the_store(tmp_path: Path) -> None:
    local = Storage.for_prefix(str(tmp_path))
    assert local.is_local and not local.keeps_summary
    remote = Storage.for_prefix("memory://pick")
    assert not remote.is_local and remote.keeps_summary


def test_unknown_protocol_is_one_clear_error() -> None:
    with pytest.raises(UserError, match="nosuchproto"):
        Storage.for_prefix("nosuchproto://bucket/x")


# -- the contract every store keeps ---------------------------------------------------------


def test_write_read_exists(storage: Storage) -> None:
    path = Storage.join(storage.prefix, "d", "a.txt")
    assert storage.read_text(path) is None and not storage.exists(path)
    storage.write_atomic(path, "one")
    storage.write_atomic(path, b"two")
    assert storage.read_text(path) == "two" and storage.exists(path)


def test_read_many_returns_what_exists(storage: Storage) -> None:
    a, b = Storage.join(storage.prefix, "a"), Storage.join(storage.prefix, "b")
    storage.write_atomic(a, "A")
    assert storage.read_many([a, b]) == {a: "A"}


def test_write_many_writes_and_removes(storage: Storage) -> None:
    a, b, c = (Storage.join(storage.prefix, n) for n in "abc")
    storage.write_atomic(c, "old")
    storage.write_many({a: "A", b: "B"}, remove=[c, Storage.join(storage.prefix, "missing")])
    assert storage.read_many([a, b, c]) == {a: "A", b: "B"}


def test_list_names_is_one_level(storage: Storage) -> None:
    storage.write_atomic(Storage.join(storage.prefix, "f"), "x")
    storage.write_atomic(Storage.join(storage.prefix, "sub", "g"), "y")
    assert sorted(storage.list_names(storage.prefix)) == ["f", "sub"]
    assert storage.list_names(Storage.join(storage.prefix, "nothing")) == []


def test_remove_a_tree_and_missing_is_fine(storage: Storage) -> None:
    storage.write_atomic(Storage.join(storage.prefix, "t", "a", "b"), "x")
    storage.remove(Storage.join(storage.prefix, "t"))
    storage.remove(Storage.join(storage.prefix, "t"))
    assert not storage.exists(Storage.join(storage.prefix, "t", "a", "b"))


def test_move_a_folder(storage: Storage) -> None:
    storage.write_atomic(Storage.join(storage.prefix, "src", "f"), "x")
    storage.move(Storage.join(storage.prefix, "src"), Storage.join(storage.prefix, "deep", "dst"))
    assert storage.read_text(Storage.join(storage.prefix, "deep", "dst", "f")) == "x"
    assert not storage.exists(Storage.join(storage.prefix, "src", "f"))
    storage.move(Storage.join(storage.prefix, "src"), Storage.join(storage.prefix, "again"))  # missing is fine


def test_put_file_and_copy_in(storage: Storage, tmp_path: Path) -> None:
    local = tmp_path / "local.bin"
    local.write_bytes(b"payload")
    storage.put_file(str(local), Storage.join(storage.prefix, "put"))
    storage.copy_in(io.BytesIO(b"streamed"), Storage.join(storage.prefix, "copied"))
    assert storage.read_text(Storage.join(storage.prefix, "put")) == "payload"
    assert storage.read_text(Storage.join(storage.prefix, "copied")) == "streamed"


# -- local helpers ------------------------------------------------------------------------------


def test_write_temporary_makes_its_folder_and_unique_names(tmp_path: Path) -> None:
    a = write_temporary(str(tmp_path / "new"), b"1")
    b = write_temporary(str(tmp_path / "new"), b"2")
    assert a != b and Path(a).read_bytes() == b"1" and Path(b).read_bytes() == b"2"
    assert os.path.basename(a).startswith(".tmp-")


def test_unlink_quietly(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    unlink_quietly(str(tmp_path / "f"))
    unlink_quietly(str(tmp_path / "f"))
    assert not (tmp_path / "f").exists()


def test_a_growing_file_is_staged_and_published_whole(storage: Storage) -> None:
    from marinbuild.store.storage import prepare_prefix

    prepare_prefix(storage)
    path = storage.join(storage.prefix, "out-1", "logs", "step.log")
    staged = storage.staging_path(path)
    assert storage.staged_in_place(path) == (staged == path)
    os.makedirs(os.path.dirname(staged), exist_ok=True)
    for part in ("one\n", "two\n"):
        with open(staged, "a") as f:  # a step's process appends
            f.write(part)
    storage.publish_staged(path)
    assert storage.read_text(path) == "one\ntwo\n"
    assert (storage.local_file(path) == path) == storage.staged_in_place(path)


def test_a_remote_store_stages_outside_its_prefix_and_local_disk_in_place(tmp_path: Path) -> None:
    local = Storage.for_prefix(str(tmp_path / "p"))
    remote = Storage.for_prefix("memory://staged")
    on_disk = str(tmp_path / "p" / "a" / "step.log")
    assert local.staging_path(on_disk) == on_disk and local.local_file(on_disk) == on_disk
    staged = remote.staging_path("memory://staged/a/step.log")
    assert staged != remote.staging_path("memory://staged/b/step.log") and staged.endswith("step.log")
    assert os.path.isabs(staged) and remote.local_file("memory://staged/a/step.log") is None


def test_user_paths_take_the_stores_form(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert Storage.for_prefix(str(tmp_path)).user_path("out/x") == str(tmp_path / "out" / "x")
    assert Storage.for_prefix("memory://u").user_path("memory://u/x/") == "memory://u/x"


def test_overlapped_returns_both_results_in_order(storage: Storage) -> None:
    from marinbuild.store.storage import overlapped

    assert overlapped(storage, lambda: 1, lambda: "two") == (1, "two")


def test_prepare_prefix_refuses_a_file_in_one_line(tmp_path: Path) -> None:
    from marinbuild.store.storage import prepare_prefix

    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="not a folder"):
        prepare_prefix(Storage.for_prefix(str(tmp_path / "file" / "p")))


def test_walkable_is_a_real_folder_on_disk_never_a_link(tmp_path: Path) -> None:
    local = Storage.for_prefix(str(tmp_path))
    (tmp_path / "real").mkdir()
    (tmp_path / "file").write_text("")
    os.symlink(tmp_path / "real", tmp_path / "link")
    assert local.walkable(str(tmp_path / "real"))
    assert not local.walkable(str(tmp_path / "link")) and not local.walkable(str(tmp_path / "file"))
    assert not local.walkable(str(tmp_path / "missing"))
    assert Storage.for_prefix("memory://walk").walkable("memory://walk/anything")  # no links on an object store


def test_retire_keeps_the_file_once_and_unlinks_it_when_the_name_is_taken(tmp_path: Path) -> None:
    from marinbuild.store.storage import retire

    first, second = tmp_path / "status", tmp_path / "status.previous"
    first.write_text("one")
    retire(str(first))
    assert not first.exists() and second.read_text() == "one"
    first.write_text("two")
    retire(str(first))  # status.previous taken: the file goes, the kept one stays
    assert not first.exists() and second.read_text() == "one"
    retire(str(first))  # nothing there: nothing happens
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.previous"]


def test_only_regular_files_are_opened_for_reading_and_none_blocks(tmp_path):
    import os

    import pytest

    from marinbuild.errors import StorageError
    from marinbuild.store.storage import open_regular

    regular = tmp_path / "status"
    regular.write_text("x")
    os.close(open_regular(str(regular)))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(StorageError, match=r"fifo is not a regular file \(a FIFO\)"):
        open_regular(str(fifo))  # a blocking open would never return here
    with pytest.raises(StorageError, match=r"a FIFO"):
        open_regular(str(fifo), os.O_WRONLY | os.O_APPEND)  # nobody reads it: ENXIO
    with pytest.raises(StorageError, match=r"a character device"):
        open_regular("/dev/zero")
    with pytest.raises(IsADirectoryError):
        open_regular(str(tmp_path))
