"""Conditional writes of one small file: create-if-absent, compare-and-swap, delete-if-unchanged.

Leases need a store to answer "write this only if nothing is there" and "replace this only
if it is still what I saw". Each store gets the strongest form it has:

* **local disk**: create is ``link(2)`` of a complete temporary file onto the lease path,
  which fails with ``EEXIST`` when the path exists (atomic, and a reader never sees a
  half-written lease). Swap and delete run under a ``lockf`` lock on the folder's
  ``lease.lock``, one for all the files there (and a mutex, because ``lockf`` locks belong to a
  process, not a thread): read, compare,
  write a temporary file, ``rename`` it over the path. Create needs no lock: only swap
  and delete touch an existing lease, and both hold the lock.
* **GCS**: the generation number. Create sends ``ifGenerationMatch=0``, swap and delete
  ``ifGenerationMatch=<generation seen>``; the server refuses with 412 otherwise. A server
  that ignores preconditions (an emulator) is noticed once, by a probe object written
  twice; there each write is checked first, then read back after :data:`SETTLE` seconds,
  and counts only if it is still there: of contenders writing within that time, the last
  one wins and the others see it (best effort, for tests and emulators).
* **memory** (tests): one process, so a mutex is enough.

A version is whatever changes on every write: the GCS generation, elsewhere a hash of the
content (every lease write has a fresh beat count or owner nonce, so contents never repeat).

Every write is retried after transient errors; since a write may have landed although its
answer was lost, a failed or retried write reads the file back and counts as done when it
finds exactly its own text there.

>>> from marinbuild.store.storage import Storage
>>> store = conditional_store(Storage.for_prefix("memory://cond-doc"))
>>> v = store.create("memory://cond-doc/lease", "mine")
>>> store.create("memory://cond-doc/lease", "theirs") is None
True
>>> store.swap("memory://cond-doc/lease", v, "mine, renewed") is not None
True
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import xxhash

from marinbuild.store.markers import STATUS_IN_OUTPUT
from marinbuild.store.retry import bounded, call_with_retries
from marinbuild.store.storage import Storage, open_regular, retire, unlink_quietly, write_temporary

if TYPE_CHECKING:
    from marinbuild.store.fsspec_store import FsspecStorage

__all__ = [
    "LOCK_NAME",
    "SETTLE",
    "ConditionalStore",
    "GcsConditionalStore",
    "LocalConditionalStore",
    "SerializedConditionalStore",
    "Versioned",
    "conditional_store",
]

SETTLE = 0.2
"""Seconds a write to a store without preconditions is left to settle before it is read back."""


@dataclass(frozen=True)
class Versioned:
    """A file's text and the version it was read at."""

    text: str
    version: str


class ConditionalStore(Protocol):
    def read(self, path: str) -> Versioned | None:
        """The file and its version, or None when absent."""

    def create(self, path: str, text: str) -> str | None:
        """Write ``text`` only if nothing is at ``path``; the new version, or None."""

    def swap(self, path: str, expected: str, text: str) -> str | None:
        """Replace the file only if its version is still ``expected``; the new version, or None."""

    def delete(self, path: str, expected: str) -> bool:
        """Delete the file only if its version is still ``expected``."""

    def put(self, path: str, text: str) -> str:
        """Write the file whatever is there (atomically with the other writes here); its new version."""


def conditional_store(storage: Storage, deadline: float | None = None) -> ConditionalStore:
    """The conditional writes of the store holding ``storage``'s prefix.

    With ``deadline`` every read and write, retries included, ends within that many
    seconds (:func:`~marinbuild.store.retry.bounded`): leases pass a time shorter than
    their fence time, so that a hanging request cannot outlive the holder's claim.
    """
    store: ConditionalStore = storage.conditional()  # type: ignore[attr-defined]
    return store if deadline is None else _Bounded(store, deadline)


class _Bounded:
    """A conditional store whose every operation ends within ``deadline`` seconds."""

    def __init__(self, inner: ConditionalStore, deadline: float) -> None:
        self.inner = inner
        self.deadline = deadline

    def read(self, path: str) -> Versioned | None:
        with bounded(self.deadline):
            return self.inner.read(path)

    def create(self, path: str, text: str) -> str | None:
        with bounded(self.deadline):
            return self.inner.create(path, text)

    def swap(self, path: str, expected: str, text: str) -> str | None:
        with bounded(self.deadline):
            return self.inner.swap(path, expected, text)

    def delete(self, path: str, expected: str) -> bool:
        with bounded(self.deadline):
            return self.inner.delete(path, expected)

    def put(self, path: str, text: str) -> str:
        with bounded(self.deadline):
            return self.inner.put(path, text)


def content_version(text: str) -> str:
    return xxhash.xxh3_64_hexdigest(text.encode("utf-8"))


def _settle(
    write: Callable[[], str | None],
    read: Callable[[], Versioned | None],
    text: str,
    what: str,
    client_retries: bool = False,
) -> str | None:
    """Run a conditional write; when it was retried and then refused, check whether it landed.

    ``client_retries``: the client library may have sent the write twice on its own, so a
    refusal is always checked (no store here needs it since gcsfs makes each request once).
    """
    tries = 0

    def attempt() -> str | None:
        nonlocal tries
        tries += 1
        if tries > 1:
            now = read()
            if now is not None and now.text == text:
                return now.version
        return write()

    version = call_with_retries(attempt, what)
    if version is None and (tries > 1 or client_retries):
        now = call_with_retries(read, what)
        if now is not None and now.text == text:
            return now.version
    return version


# -- local disk ---------------------------------------------------------------------------

LOCK_NAME = "lease.lock"
"""The one lock file of a folder: every compare-and-swap on a file in it (a step's lease, status
and info JSON) runs under a ``lockf`` lock on ``FOLDER/lease.lock``."""

_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _forget_thread_locks() -> None:
    # A forked child holds none of its parent's lockf locks, but would inherit a mutex another
    # thread held at the fork, locked for good.
    global _thread_locks, _thread_locks_guard
    _thread_locks = {}
    _thread_locks_guard = threading.Lock()


os.register_at_fork(after_in_child=_forget_thread_locks)


@contextlib.contextmanager
def _path_locked(path: str) -> Iterator[None]:
    # One lock file a folder, not one a record: a step's status and info JSON would each make an
    # inode of their own (30-60 us of ext4 each) to guard writes made a few times a step. The
    # lease's lock keeps the name it always had, so that a runner of an earlier version and this
    # one still exclude each other on the lease. The mutex is the lock file's: lockf locks belong
    # to the process, and closing any descriptor of the file drops them, so no two threads may
    # hold it at once.
    lock = os.path.join(os.path.dirname(path), LOCK_NAME)
    with _thread_locks_guard:
        mutex = _thread_locks.setdefault(lock, threading.Lock())
    with mutex:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        earlier = -1
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX)
            earlier = _earlier_versions_lock(path, lock)
            yield
        finally:
            if earlier >= 0:
                os.close(earlier)
            os.close(fd)  # closing drops the lock


def _earlier_versions_lock(path: str, lock: str) -> int:
    """The lock file of ``path`` alone (``status.lock``, ``info.json.lock``), locked too where a
    runner of an earlier version made it: such a runner locks that one, not the folder's, around
    its writes of ``path``. Taken after the folder's lock, and no runner of either version takes
    the folder's while holding it, so the two cannot deadlock. -1 where there is none."""
    own = path + ".lock"
    if own == lock:
        return -1
    try:
        fd = os.open(own, os.O_RDWR | os.O_NONBLOCK)
    except OSError:  # none there, as where no earlier version ran (or something no lock could be)
        return -1
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            return -1  # not a file a lock can be taken on
        raise
    return fd


class LocalConditionalStore:
    def __init__(self, records: bool = False) -> None:
        self.records = records
        """A step's records, not a lease: the file replaced is moved away first, as
        ``LocalStorage.write_atomic`` does (a status kept as ``status.previous``): renaming over
        it makes ext4 flush synchronously. Never for a lease, which a reader must always find."""

    def _make_room(self, path: str) -> None:
        if not self.records:
            return
        if path.endswith(f"/{STATUS_IN_OUTPUT}"):
            retire(path)
        else:
            unlink_quietly(path)

    def read(self, path: str) -> Versioned | None:
        return call_with_retries(lambda: self._read(path), f"read {path}")

    def _read(self, path: str) -> Versioned | None:
        try:
            fd = open_regular(path)  # a FIFO where the lease belongs must not block its readers
        except (FileNotFoundError, NotADirectoryError):
            return None
        try:
            # Raw reads: a lease is read two or three times a step, and a text file object's
            # set-up (fstat, ioctl, two seeks) costs more than the read.
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        except IsADirectoryError as e:  # a folder where the lease belongs: named, as open() would
            raise IsADirectoryError(e.errno, e.strerror, path) from None
        finally:
            os.close(fd)
        # Bytes that are not UTF-8 read as U+FFFD: an unreadable lease, watched and taken over like any other.
        text = b"".join(chunks).decode("utf-8", errors="replace")
        return Versioned(text, content_version(text))

    def create(self, path: str, text: str) -> str | None:
        return _settle(lambda: self._create(path, text), lambda: self._read(path), text, f"create {path}")

    def _create(self, path: str, text: str) -> str | None:
        tmp = self._temporary(path, text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return None
        finally:
            unlink_quietly(tmp)
        return content_version(text)

    def swap(self, path: str, expected: str, text: str) -> str | None:
        return _settle(lambda: self._swap(path, expected, text), lambda: self._read(path), text, f"replace {path}")

    def _swap(self, path: str, expected: str, text: str) -> str | None:
        with _path_locked(path):
            now = self._read(path)
            if now is None or now.version != expected:
                return None
            self._replace(path, text)
        return content_version(text)

    def put(self, path: str, text: str) -> str:
        return call_with_retries(lambda: self._put(path, text), f"write {path}")

    def _put(self, path: str, text: str) -> str:
        # Under the lock a swap holds: a put cannot land between a swap's comparison and its rename.
        try:
            with _path_locked(path):
                self._replace(path, text)
        except FileNotFoundError:
            # As a plain write makes the marker folder: only when missing, not two calls a put.
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with _path_locked(path):
                self._replace(path, text)
        return content_version(text)

    def _replace(self, path: str, text: str) -> None:
        """Put ``text`` at ``path`` by a rename (the caller holds the path's lock)."""
        tmp = self._temporary(path, text)
        try:
            self._make_room(path)
            os.rename(tmp, path)
        except BaseException:
            unlink_quietly(tmp)
            raise

    def delete(self, path: str, expected: str) -> bool:
        return call_with_retries(lambda: self._delete(path, expected), f"delete {path}")

    def _delete(self, path: str, expected: str) -> bool:
        if not os.path.exists(path):
            return False
        with _path_locked(path):
            now = self._read(path)
            if now is None or now.version != expected:
                return False
            retire(path)  # not unlinked: see retire
            return True

    @staticmethod
    def _temporary(path: str, text: str) -> str:
        return write_temporary(os.path.dirname(path), text.encode("utf-8"), prefix=".lease-")


# -- stores reached through fsspec in this process only -----------------------------------

_serial = threading.RLock()


class SerializedConditionalStore:
    """Read-compare-write under a process-wide mutex: exact for ``memory://``.

    For another remote store this is best effort (two processes may both pass the
    comparison); docs/leases.md says which stores have real conditional writes.
    """

    def __init__(self, storage: FsspecStorage) -> None:
        self.storage = storage
        self.fs = storage.fs

    def _read(self, path: str) -> Versioned | None:
        try:
            text = self.storage.call("cat_file", self.storage._p(path)).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return None
        return Versioned(text, content_version(text))

    def read(self, path: str) -> Versioned | None:
        return call_with_retries(lambda: self._read(path), f"read {path}")

    def create(self, path: str, text: str) -> str | None:
        return _settle(lambda: self._replace(path, None, text), lambda: self._read(path), text, f"create {path}")

    def swap(self, path: str, expected: str, text: str) -> str | None:
        return _settle(lambda: self._replace(path, expected, text), lambda: self._read(path), text, f"replace {path}")

    def _replace(self, path: str, expected: str | None, text: str) -> str | None:
        with _serial:
            now = self._read(path)
            if (now.version if now is not None else None) != expected:
                return None
            self.storage.call("pipe_file", self.storage._p(path), text.encode("utf-8"))
        return content_version(text)

    def put(self, path: str, text: str) -> str:
        def once() -> str:
            with _serial:
                self.storage.call("pipe_file", self.storage._p(path), text.encode("utf-8"))
            return content_version(text)

        return call_with_retries(once, f"write {path}")

    def delete(self, path: str, expected: str) -> bool:
        def once() -> bool:
            with _serial:
                now = self._read(path)
                if now is None or now.version != expected:
                    return False
                self.storage.call("rm_file", self.storage._p(path))
                return True

        return call_with_retries(once, f"delete {path}")


# -- Google Cloud Storage -----------------------------------------------------------------


def _endpoint(fs: Any) -> str:
    """The scheme and host gcsfs sends requests to (``fs.base`` is ``ENDPOINT/storage/v1/``)."""
    return str(fs.base).rstrip("/").removesuffix("/storage/v1")


_enforced: dict[tuple[str, str], bool] = {}
"""Whether each (endpoint, bucket) honours preconditions, as its probe found."""
_probing = threading.Lock()


class GcsConditionalStore:
    """Generation preconditions, sent through gcsfs's request helper.

    gcsfs exposes ``ifGenerationMatch=0`` (its ``mode="create"``) but not a match on a
    given generation, so the upload is made here as gcsfs makes it, with the parameter
    added. The lease text is also kept in the object's custom metadata, so that one
    metadata request returns the text and its generation together.
    """

    def __init__(self, storage: FsspecStorage, text_in_metadata: bool = True) -> None:
        self.storage = storage
        self.fs: Any = storage.fs
        self.text_in_metadata = text_in_metadata
        """Keep the text in the object's metadata too (leases); a step's records are too large for it."""

    @property
    def enforced(self) -> bool:
        """Whether the server honours generation preconditions (asked once per endpoint and bucket, with a probe object)."""
        where = (str(self.fs.base), self._split(self.storage.prefix + "/x")[0])
        with _probing:  # steps take their leases on several threads at once: one probe
            if where not in _enforced:
                _enforced[where] = self._probe()
            return _enforced[where]

    def _probe(self) -> bool:
        probe = Storage.join(self.storage.prefix, ".marinbuild", f"precondition-probe-{os.urandom(6).hex()}")
        first = self._post(probe, "0", "probe")
        enforced = first is not None and self._post(probe, "0", "probe again") is None
        bucket, key = self._split(probe)
        with contextlib.suppress(FileNotFoundError):
            self.storage.call("call", "DELETE", "b/{}/o/{}", bucket, key)
        return enforced

    def _split(self, path: str) -> tuple[str, str]:
        bucket, key, _ = self.fs.split_path(self.storage._p(path))
        return bucket, key

    def _read(self, path: str) -> Versioned | None:
        bucket, key = self._split(path)
        try:
            meta = self.storage.call("call", "GET", "b/{}/o/{}", bucket, key, json_out=True)
        except FileNotFoundError:
            return None
        generation = str(meta["generation"])
        text = (meta.get("metadata") or {}).get("lease")
        if text is None:  # written by something else: fetch that very generation's bytes
            try:
                _, body = self.storage.call("call", "GET", "b/{}/o/{}", bucket, key, alt="media", generation=generation)
            except FileNotFoundError:
                return None
            text = body.decode("utf-8", errors="replace")
        return Versioned(text, generation)

    def read(self, path: str) -> Versioned | None:
        return call_with_retries(lambda: self._read(path), f"read {path}")

    def _upload(self, path: str, expected: str, text: str) -> str | None:
        if self.enforced:
            return self._post(path, expected, text)
        now = self._read(path)
        if (now.version if now is not None else "0") != expected:
            return None
        if self._post(path, expected, text) is None:
            return None
        time.sleep(SETTLE)  # let every contender that saw the same version write too
        now = self._read(path)
        return now.version if now is not None and now.text == text else None

    def _post(self, path: str, expected: str | None, text: str) -> str | None:
        bucket, key = self._split(path)
        meta = json.dumps({"name": key, "metadata": {"lease": text}} if self.text_in_metadata else {"name": key})
        precondition = {} if expected is None else {"ifGenerationMatch": expected}
        body = (
            f"--==0==\nContent-Type: application/json; charset=UTF-8\n\n{meta}\n"
            f"--==0==\nContent-Type: application/json\n\n"
        ).encode() + text.encode("utf-8") + b"\n--==0==--"
        try:
            out = self.storage.call(
                "call",
                "POST",
                f"{_endpoint(self.fs)}/upload/storage/v1/b/{bucket}/o",
                uploadType="multipart",
                **precondition,
                headers={"Content-Type": 'multipart/related; boundary="==0=="'},
                data=body,
                json_out=True,
            )
        except FileExistsError:  # gcsfs's name for 412 Precondition Failed
            return None
        finally:
            self.fs.invalidate_cache(self.storage._p(path))
        return str(out["generation"])

    def create(self, path: str, text: str) -> str | None:
        return _settle(lambda: self._upload(path, "0", text), lambda: self._read(path), text, f"create {path}")

    def swap(self, path: str, expected: str, text: str) -> str | None:
        return _settle(lambda: self._upload(path, expected, text), lambda: self._read(path), text, f"replace {path}")

    def put(self, path: str, text: str) -> str:
        def once() -> str:
            version = self._post(path, None, text)
            assert version is not None  # only a precondition refuses an upload
            return version

        return call_with_retries(once, f"write {path}")

    def delete(self, path: str, expected: str) -> bool:
        bucket, key = self._split(path)

        def once() -> bool:
            if not self.enforced:
                now = self._read(path)
                if now is None or now.version != expected:
                    return False
            try:
                self.storage.call("call", "DELETE", "b/{}/o/{}", bucket, key, ifGenerationMatch=expected)
            except (FileNotFoundError, FileExistsError):
                return False
            finally:
                self.fs.invalidate_cache(self.storage._p(path))
            return True

        return call_with_retries(once, f"delete {path}")
