"""Unit tests of marinbuild.store.conditional: create-if-absent, swap and delete-if-unchanged."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from marinbuild.errors import StorageError
from marinbuild.store.conditional import (
    ConditionalStore,
    LocalConditionalStore,
    SerializedConditionalStore,
    Versioned,
    _settle,
    conditional_store,
    content_version,
)
from marinbuild.store.storage import Storage


@pytest.fixture(params=["local", "memory"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[ConditionalStore, str]:
    """A conditional store and a lease path on it."""
    prefix = str(tmp_path / "p") if request.param == "local" else f"memory://cond-{uuid.uuid4().hex[:8]}"
    storage = Storage.for_prefix(prefix)
    storage.makedirs(prefix)
    return conditional_store(storage, deadline=30.0), Storage.join(prefix, "lease")


def test_the_store_fits_the_prefix(tmp_path: Path) -> None:
    assert isinstance(conditional_store(Storage.for_prefix(str(tmp_path))), LocalConditionalStore)
    assert isinstance(conditional_store(Storage.for_prefix("memory://cond-kind")), SerializedConditionalStore)


def test_read_of_nothing_is_none(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    assert store.read(path) is None


def test_create_only_where_nothing_is(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    version = store.create(path, "mine")
    assert version is not None
    assert store.create(path, "theirs") is None
    seen = store.read(path)
    assert seen is not None and (seen.text, seen.version) == ("mine", version)


def test_swap_needs_the_version_seen(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    v1 = store.create(path, "one")
    assert v1 is not None
    v2 = store.swap(path, v1, "two")
    assert v2 is not None and v2 != v1
    assert store.swap(path, v1, "three") is None  # v1 is gone
    seen = store.read(path)
    assert seen is not None and seen.text == "two"
    assert store.swap(Storage.join(path + "-absent"), v1, "x") is None


def test_delete_needs_the_version_seen(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    v1 = store.create(path, "one")
    assert v1 is not None
    assert not store.delete(path, "not-the-version")
    assert store.read(path) is not None
    assert store.delete(path, v1)
    assert store.read(path) is None
    assert not store.delete(path, v1)


def test_of_many_threads_creating_one_wins(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    results: list[str | None] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        results.append(store.create(path, f"writer {i}"))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(v is not None for v in results) == 1


def test_of_many_threads_swapping_one_version_one_wins(where: tuple[ConditionalStore, str]) -> None:
    store, path = where
    v1 = store.create(path, "base")
    assert v1 is not None
    results: list[str | None] = []
    barrier = threading.Barrier(8)

    def contend(i: int) -> None:
        barrier.wait()
        results.append(store.swap(path, v1, f"writer {i}"))

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(v is not None for v in results) == 1


def test_local_create_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = LocalConditionalStore()
    path = str(tmp_path / "lease")
    store.create(path, "a")
    store.create(path, "b")
    v = store.read(path)
    assert v is not None
    store.swap(path, v.version, "c")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lease", "lease.lock"]


def test_a_steps_lease_status_and_info_share_one_lock_file(tmp_path: Path) -> None:
    markers = tmp_path / ".marinbuild"
    markers.mkdir()
    records = LocalConditionalStore(records=True)
    for name in ("status", "info.json"):
        version = records.put(str(markers / name), "claimed")
        assert records.swap(str(markers / name), version, "committed") is not None
    leases = LocalConditionalStore()
    version = leases.create(str(markers / "lease"), "mine")
    assert version is not None and leases.swap(str(markers / "lease"), version, "renewed") is not None
    assert sorted(p.name for p in markers.iterdir()) == ["info.json", "lease", "lease.lock", "status", "status.previous"]


_HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o644)
fcntl.lockf(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""


def _swap_waits_while_another_process_holds(markers: Path, lock_name: str) -> None:
    """A status swap in ``markers`` waits while another process holds ``lock_name`` there, then goes through."""
    store = LocalConditionalStore(records=True)
    status = str(markers / "status")
    version = store.put(status, "RUNNING")
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(markers / lock_name)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        result: list[str | None] = []
        swapper = threading.Thread(target=lambda: result.append(store.swap(status, version, "SUCCESS")))
        swapper.start()
        swapper.join(0.5)
        # Not proof of waiting on its own: the file shows that nothing was written meanwhile.
        assert swapper.is_alive() and Path(status).read_text() == "RUNNING"
    finally:
        assert holder.stdin is not None
        holder.stdin.close()  # the holder exits, and the kernel drops its lock
        holder.wait(30)
    swapper.join(30)
    assert result and result[0] is not None and Path(status).read_text() == "SUCCESS"


def test_a_swap_of_a_status_waits_for_another_process_holding_the_folders_lock(tmp_path: Path) -> None:
    markers = tmp_path / ".marinbuild"
    markers.mkdir()
    _swap_waits_while_another_process_holds(markers, "lease.lock")


def test_a_status_lock_an_earlier_version_made_is_taken_too(tmp_path: Path) -> None:
    # A runner of an earlier version locks status.lock, not the folder's lease.lock, around its
    # writes of the status: where that file exists, this version's swap waits for it as well.
    markers = tmp_path / ".marinbuild"
    markers.mkdir()
    _swap_waits_while_another_process_holds(markers, "status.lock")
    assert not (markers / "info.json.lock").exists()  # this version makes none of its own


_FORK_WHILE_HELD = """
import os, signal, sys, threading
from marinbuild.store.conditional import LocalConditionalStore, _path_locked
folder = sys.argv[1]
inside, leave = threading.Event(), threading.Event()
def hold():
    with _path_locked(os.path.join(folder, "lease")):
        inside.set()
        leave.wait()
threading.Thread(target=hold, daemon=True).start()
inside.wait()
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a child stuck on the mutex it inherited ends here, not never
    LocalConditionalStore(records=True).put(os.path.join(folder, "info.json"), "from the child")
    os._exit(0)
leave.set()
print(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
"""


def test_a_child_forked_while_a_thread_holds_a_folders_lock_can_write_there(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _FORK_WHILE_HELD, str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.strip() == "0", done.stdout + done.stderr
    assert (tmp_path / "info.json").read_text() == "from the child"

def test_local_read_of_bytes_that_are_not_utf8_is_a_version_not_a_crash(tmp_path: Path) -> None:
    path = tmp_path / "lease"
    path.write_bytes(b"\xff\xfe junk")
    seen = LocalConditionalStore().read(str(path))
    assert seen is not None and "\ufffd" in seen.text


def test_content_version_is_a_hash_of_the_text() -> None:
    assert content_version("a") == content_version("a")
    assert content_version("a") != content_version("b")


def test_a_write_that_landed_but_whose_answer_was_lost_counts() -> None:
    stored: dict[str, str] = {}
    calls = 0

    def write() -> str | None:
        nonlocal calls
        calls += 1
        if "x" in stored:
            return None  # a create-if-absent refused: something is there (our first try)
        stored["x"] = "mine"
        raise ConnectionResetError("answer lost")

    def read():  # type: ignore[no-untyped-def]
        from marinbuild.store.conditional import Versioned

        return Versioned(stored["x"], content_version(stored["x"])) if "x" in stored else None

    assert _settle(write, read, "mine", "create x") == content_version("mine")
    assert calls == 1  # the retry read the file back and found its own text


def test_a_write_refused_after_a_retry_is_refused_when_another_text_is_there() -> None:
    tries = 0

    def write() -> str | None:
        nonlocal tries
        tries += 1
        if tries == 1:
            raise TimeoutError("slow")
        return None

    from marinbuild.store.conditional import Versioned

    assert _settle(write, lambda: Versioned("theirs", "v"), "mine", "create x") is None


def test_a_bounded_store_gives_up_in_time(tmp_path: Path) -> None:
    store = conditional_store(Storage.for_prefix(str(tmp_path)), deadline=0.0)
    with pytest.raises(StorageError, match="did not finish in time"):
        store.read(str(tmp_path / "lease"))


def test_local_read_of_a_folder_names_it(tmp_path: Path) -> None:
    folder = tmp_path / "lease"
    folder.mkdir()
    with pytest.raises(IsADirectoryError) as raised:
        LocalConditionalStore().read(str(folder))
    assert raised.value.filename == str(folder)


def test_a_local_delete_keeps_the_released_lease_under_another_name(tmp_path: Path) -> None:
    # An inode freed per step slowed every later file creation (ext4 without a journal).
    store = LocalConditionalStore()
    path = str(tmp_path / "lease")
    first = store.create(path, "first holder")
    assert first is not None and store.delete(path, first)
    assert store.read(path) is None
    assert (tmp_path / "lease.previous").read_text() == "first holder"
    second = store.create(path, "second holder")  # free again: created as if never held
    assert second is not None and store.delete(path, second)
    assert store.read(path) is None and (tmp_path / "lease.previous").read_text() == "first holder"


def test_a_local_put_makes_the_marker_folder_where_it_is_missing(tmp_path: Path) -> None:
    store = LocalConditionalStore()
    path = tmp_path / "out-0123456789abcdef" / ".marinbuild" / "status"
    version = store.put(str(path), "RUNNING")
    assert path.read_text() == "RUNNING" and store.read(str(path)) == Versioned("RUNNING", version)
    assert store.put(str(path), "SUCCESS") != version and path.read_text() == "SUCCESS"
