"""Where outputs live: a thin layer over an fsspec filesystem.

Local paths are kept as plain absolute paths (no ``file://``) so that users see paths they
can ``cd`` into (:mod:`marinbuild.store.local`); any other URL (``gs://``, ``memory://``)
goes through its fsspec filesystem (:mod:`marinbuild.store.fsspec_store`). Reads of many
small files go through :meth:`Storage.read_many`, which asks a remote store with bounded
parallel requests instead of one round trip after another. Every operation is retried
after transient errors (:mod:`marinbuild.store.retry`); each one is safe to repeat because
a write always puts a whole file.

>>> s = Storage.for_prefix("memory://demo")
>>> s.write_atomic(s.join(s.prefix, "a.txt"), "hi")
>>> s.read_text(s.join(s.prefix, "a.txt"))
'hi'
"""

from __future__ import annotations

import errno
import itertools
import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable, Mapping
from typing import BinaryIO, Protocol, TypeVar, runtime_checkable

from marinbuild.store.errors import StorageError, UserError

__all__ = [
    "DEFAULT_PREFIX",
    "RETIRED_SUFFIX",
    "Storage",
    "check_local_prefix",
    "check_writable_prefix",
    "file_kind",
    "not_regular",
    "open_regular",
    "overlapped",
    "prefix_not_writable",
    "prefix_write_problem",
    "prepare_prefix",
    "resolve_prefix",
    "retire",
    "store_refusal",
    "unlink_quietly",
    "write_temporary",
]

A = TypeVar("A")
B = TypeVar("B")

DEFAULT_PREFIX = "marinbuild-out"
"""The prefix used when neither ``--prefix`` nor ``MARIN_PREFIX`` is set, relative to the
working directory."""


def resolve_prefix(prefix: str | None) -> str:
    """``--prefix``, else ``$MARIN_PREFIX``, else :data:`DEFAULT_PREFIX`; local ones made absolute."""
    raw = given = prefix or os.environ.get("MARIN_PREFIX") or DEFAULT_PREFIX
    if raw.startswith("file://"):
        raw = raw[len("file://") :]
    check_url_shape(raw)
    if "://" in raw:
        scheme, _, rest = raw.partition("://")
        if not rest.strip("/"):
            raise UserError(f"prefix {raw!r} names no bucket or folder (e.g. {scheme}://bucket/experiments)")
        if scheme in _BUCKET_SCHEMES and not rest.split("/", 1)[0]:
            raise UserError(f"prefix {raw!r} names no bucket (e.g. {scheme}://bucket{rest.rstrip('/')})")
        return raw.rstrip("/")
    path = os.path.abspath(os.path.expanduser(raw))
    if os.path.dirname(path) == path or os.path.realpath(path) == "/":
        raise UserError(f"prefix {given!r} is a filesystem root; give a folder for the outputs (e.g. /data/experiments)")
    check_local_prefix(path, given, writable=False)  # whoever writes checks that it can
    return path


_URL_SCHEMES = frozenset({"gs", "gcs", "s3", "s3a", "az", "abfs", "abfss", "adl", "hdfs", "http", "https", "memory",
                          "ftp", "sftp", "ssh", "oci", "r2"})
"""Schemes a prefix that is a URL starts with: ``gs:/b`` is a mistyped URL, never a local folder named ``gs:``."""

_BUCKET_SCHEMES = frozenset({"gs", "s3", "s3a", "az", "abfs", "abfss"})


def check_url_shape(raw: str) -> None:
    """Refuse, in one line naming the fix, a prefix that is a URL typed wrong.

    ``gs:/b/x`` or ``gs:b/x`` (slashes missing) would otherwise be a local folder named
    ``gs:``, filled without a word; ``gcs://`` is gcsfs's other name for ``gs://``, refused
    so that one bucket has one name in every marker, lease and summary entry.

    >>> check_url_shape("gs://bucket/x")
    >>> try:
    ...     check_url_shape("gs:/bucket/x")
    ... except UserError as e:
    ...     print(e)
    prefix 'gs:/bucket/x' is not a URL (one slash missing?): write gs://bucket/x
    """
    match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):(?!//)(.*)", raw, re.DOTALL)
    if match is not None and match.group(1).lower() in _URL_SCHEMES:
        scheme, rest = match.group(1).lower(), match.group(2).lstrip("/")
        slashes = "one slash" if match.group(2).startswith("/") else "two slashes"
        raise UserError(f"prefix {raw!r} is not a URL ({slashes} missing?): write {scheme}://{rest or 'bucket/experiments'}")
    if raw.lower().startswith("gcs://"):
        raise UserError(f"prefix {raw!r}: marinbuild names GCS prefixes gs://; write gs://{raw[len('gcs://'):]}")


def check_local_prefix(path: str, given: str | None = None, create: bool = False, writable: bool = True) -> None:
    """Refuse (UserError naming the prefix) a local prefix that is not a folder, or (``writable``)
    cannot be written.

    Without ``create`` nothing is written: the nearest existing folder on the way must let
    this user create folders. With ``create`` the prefix folder is made, as a run will.
    Commands that only read (``plan``, ``status``, ``show``, ``report``) pass
    ``writable=False``: another team's read-only outputs are for reading.
    """
    shown = repr(given if given is not None else path)
    existing = path
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "" if existing == path else f" ({existing} is a file)"
        raise UserError(f"prefix {shown} is not a folder{where}; give a folder for the outputs")
    if not (writable or create):
        return
    problem = prefix_not_writable(path)
    if problem is not None:
        raise UserError(f"prefix {shown} {problem}")
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise UserError(f"prefix {shown} cannot be created: {e.strerror or e}") from None


def prefix_not_writable(path: str) -> str | None:
    """Why this user cannot write under the local prefix ``path`` (``is not writable by this
    user (in FOLDER)``, or a read-only filesystem); None when it can."""
    existing = path
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
    except OSError:
        read_only = False
    return f"is on a read-only filesystem (in {existing})" if read_only else f"is not writable by this user (in {existing})"


def prefix_write_problem(storage: Storage) -> str | None:
    """Why a run could not write under ``storage``'s prefix (``prefix '…' is not writable by
    this user (in …)``); None when it can, or where only a write would tell (object stores)."""
    if not storage.is_local:
        return None
    problem = prefix_not_writable(storage.prefix)
    return None if problem is None else f"prefix {storage.prefix!r} {problem}"


def prepare_prefix(storage: Storage, given: str | None = None) -> None:
    """Make the prefix folder a run writes under, refusing one that is not a folder or not
    writable (one line naming it); an object store needs no folder and is checked by its first write."""
    if storage.is_local:
        check_local_prefix(storage.prefix, given, create=True)


def overlapped(storage: Storage, first: Callable[[], A], second: Callable[[], B]) -> tuple[A, B]:
    """``first()`` and ``second()``: in flight together where a request costs a round trip
    (a remote store), one after the other on local disk, where a thread would cost more."""
    if storage.is_local:
        return first(), second()
    from concurrent.futures import ThreadPoolExecutor  # remote stores only: logging and threads cost a no-op 5 ms

    with ThreadPoolExecutor(1, thread_name_prefix="marinbuild-overlap") as pool:
        later = pool.submit(second)
        return first(), later.result()


def check_writable_prefix(prefix: str | None) -> None:
    """Refuse, before anything is loaded, a local prefix this user cannot write (what ``run`` needs)."""
    resolved = resolve_prefix(prefix)
    if "://" not in resolved:
        check_local_prefix(resolved, prefix, writable=True)


_REFUSALS = {
    errno.ENOSPC: "the store is full",
    errno.EDQUOT: "the store's quota is used up",
    errno.EROFS: "the store is read-only",
}


def store_refusal(error: BaseException) -> str | None:
    """What a full, over-quota or read-only store says, for an error waiting cannot cure; else None.

    >>> store_refusal(OSError(errno.ENOSPC, "No space left on device"))
    'No space left on device (the store is full)'
    >>> store_refusal(OSError(errno.EAGAIN, "try again")) is None
    True
    """
    if not isinstance(error, OSError) or error.errno not in _REFUSALS:
        return None
    return f"{error.strerror or os.strerror(error.errno)} ({_REFUSALS[error.errno]})"


@runtime_checkable
class Storage(Protocol):
    """Operations on the store holding one prefix: what every marker, lease, log and record uses.

    Two implementations: :class:`~marinbuild.store.local.LocalStorage` (plain paths through
    ``os``) and :class:`~marinbuild.store.fsspec_store.FsspecStorage` (any fsspec URL);
    :meth:`for_prefix` picks one. Each operation is retried after transient errors by
    :mod:`marinbuild.store.retry` and is safe to repeat: a write always puts a whole file.
    """

    prefix: str

    @property
    def is_local(self) -> bool:
        """Whether paths are files on this machine (a step's log can then be written in place)."""
        ...

    @property
    def keeps_summary(self) -> bool:
        """Whether step statuses are also summarized in object names (:mod:`marinbuild.store.index`).

        True where a request costs a round trip; on local disk every marker is read directly.
        """
        ...

    @classmethod
    def for_prefix(cls, prefix: str) -> Storage:
        """The storage of an already resolved prefix (see :func:`resolve_prefix`)."""
        if "://" not in prefix:
            from marinbuild.store.local import LocalStorage

            return LocalStorage(prefix)
        from marinbuild.store.fsspec_store import FsspecStorage

        return FsspecStorage.open(prefix)

    @staticmethod
    def join(base: str, *parts: str) -> str:
        """``posixpath.join``; one relative name, the call made for every step, at a fifth of its cost."""
        if len(parts) == 1 and not parts[0].startswith("/"):
            return f"{base}{parts[0]}" if not base or base.endswith("/") else f"{base}/{parts[0]}"
        return posixpath.join(base, *parts)

    def read_text(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        ...

    def read_many(self, paths: Iterable[str]) -> dict[str, str]:
        """Texts of the files that exist among ``paths``; remote stores are asked in parallel."""
        ...

    def write_atomic(self, path: str, text: str | bytes) -> None:
        """Write a whole file so that readers never see a part of it: the one atomic write."""
        ...

    def write_many(self, files: Mapping[str, str | bytes], remove: Iterable[str] = ()) -> None:
        """:meth:`write_atomic` of several files and removal of others (missing is fine), overlapped
        where the store allows: callers use it only where any order of these is safe."""
        ...

    def makedirs(self, path: str) -> None:
        """Create a folder (stores without folders need none)."""
        ...

    def exists(self, path: str) -> bool:
        """Whether anything is at ``path``."""
        ...

    def list_names(self, folder: str) -> list[str]:
        """Names of the entries directly inside ``folder`` (empty when it does not exist)."""
        ...

    def list_holding(self, folder: str, inner: str) -> list[str]:
        """Names of the entries directly inside ``folder`` that hold the file ``inner`` (a path
        relative to each entry, e.g. ``.marinbuild/status``): one listing on GCS (``matchGlob``),
        1,000 names a request, so that a file deleted by hand is noticed without a read per entry."""
        ...

    def remove(self, path: str) -> None:
        """Delete a file or a whole directory tree; missing is fine."""
        ...

    def remove_many(self, paths: Iterable[str]) -> None:
        """Delete several files (not folders), overlapped where the store allows; missing is fine."""
        ...

    def move(self, source: str, target: str) -> None:
        """Move a file or a whole folder to ``target`` (its parent made as needed); missing is fine.

        A rename on local disk; an object store copies each object and deletes the original.
        """
        ...

    def put_file(self, local_path: str, path: str) -> None:
        """Copy a local file into the store (a no-op when it is already that file)."""
        ...

    def copy_in(self, source: BinaryIO, path: str) -> None:
        """Copy a stream into the store as one whole file: a reader sees all of it or nothing."""
        ...

    # What logs need: a file that grows. Local disk appends in place; an object store cannot,
    # so the file is staged on this machine and put in place whole.

    def staging_path(self, path: str) -> str:
        """The local file that stands for ``path`` while it is written by appending (a step's log).

        On local disk it is ``path`` itself, followed as it grows (``marinbuild logs -f``); for a
        remote store, a file in this machine's temporary folder, keyed by ``path``, that
        :meth:`publish_staged` puts in place once writing ends.
        """
        if self.is_local:
            return path
        import hashlib
        import tempfile

        digest = hashlib.sha256(path.encode()).hexdigest()[:16]
        return os.path.join(tempfile.gettempdir(), "marinbuild-staging", digest, posixpath.basename(path))

    def staged_in_place(self, path: str) -> bool:
        """Whether what is appended to :meth:`staging_path` is already at ``path`` (nothing to publish)."""
        return self.staging_path(path) == path

    def publish_staged(self, path: str) -> None:
        """Put the file staged for ``path`` in place, whole (nothing to do when it was written in place)."""
        staged = self.staging_path(path)
        if staged != path and os.path.exists(staged):
            self.put_file(staged, path)

    def local_file(self, path: str) -> str | None:
        """``path`` as a file on this machine when the store is its disk (to follow, stat or
        hand to a process on the same disk); None for a remote store."""
        return path if self.is_local else None

    def walkable(self, path: str) -> bool:
        """Whether ``path`` may be entered as a folder of outputs: on local disk a real folder,
        never a symbolic link to one (clean must not follow it out of the prefix); an object
        store has no links, so any name may be listed."""
        if not self.is_local:
            return True
        try:
            return stat.S_ISDIR(os.lstat(path).st_mode)
        except OSError:
            return False

    def user_path(self, text: str) -> str:
        """A path as a user typed it, in the form this store's paths take (absolute on local disk)."""
        return os.path.abspath(text) if self.is_local and "://" not in text else text.rstrip("/")


_temporaries = itertools.count()


def write_temporary(folder: str, data: bytes, prefix: str = ".tmp-") -> str:
    """Write ``data`` to a new, uniquely named file in a local ``folder``; return its path.

    The folder is created only when missing: checking first cost two system calls per
    marker written. Names are this process's id and a counter (``mkstemp``'s random names
    cost more to make than the file itself); ``O_EXCL`` still refuses any clash.
    """
    while True:
        tmp = os.path.join(folder, f"{prefix}{os.getpid()}-{next(_temporaries)}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            os.makedirs(folder, exist_ok=True)
            continue
        except FileExistsError:
            continue  # left by a process that had our pid before
        break
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    except BaseException:
        os.close(fd)
        unlink_quietly(tmp)
        raise
    os.close(fd)
    return tmp


_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISSOCK, "a socket"))


def file_kind(mode: int) -> str:
    """What a file that is not a regular one is, from its ``st_mode``: ``a FIFO``, ``a socket``, …"""
    return next((name for test, name in _KINDS if test(mode)), "not a file")


def not_regular(path: str, mode: int) -> StorageError:
    """The one-line error for ``path``, found to be a FIFO, a device or a socket (``mode``) where a file belongs."""
    return StorageError(f"{path} is not a regular file ({file_kind(mode)}); move it away")


def open_regular(path: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Open a local file marinbuild reads or appends to, never blocking on what is not a regular file.

    A FIFO where a marker, a lease or a log belongs would block ``open`` (and then ``read``)
    forever, and ``/dev/zero`` would be read until memory runs out: the file is opened with
    ``O_NONBLOCK`` (which a regular file ignores), checked with ``fstat``, and anything but a
    regular file is refused with :func:`not_regular` (a folder with :class:`IsADirectoryError`,
    as ``open`` says). Returns the descriptor; the caller closes it.
    """
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError as e:
        if e.errno == errno.ENXIO:  # a FIFO opened for writing with nobody reading it
            raise not_regular(path, stat.S_IFIFO) from None
        raise
    try:
        st_mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(st_mode):
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), path)
        if not stat.S_ISREG(st_mode):
            raise not_regular(path, st_mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def unlink_quietly(path: str) -> None:
    """Remove a local file; one already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


RETIRED_SUFFIX = ".previous"
"""What a replaced or released marker-folder file is kept as (see :func:`retire`)."""


def retire(path: str) -> None:
    """Take a local file away from ``path`` without freeing its inode the first time.

    The file stays as ``PATH.previous``; where that name is taken, it is unlinked as before.
    On ext4 without a journal (the machines this was measured on) every inode freed in the
    last 60 seconds is skipped, one by one, by each later inode allocation in its block
    group. A run that freed two inodes per step (the RUNNING marker its SUCCESS replaced,
    the released lease) made every file it created slower than the one before: at 10,000
    steps half of the runner's time went to that scan. A file kept under another name frees
    nothing; a rerun, which finds the name taken, frees one as it always did.
    """
    try:
        os.link(path, path + RETIRED_SUFFIX)
    except FileNotFoundError:
        return
    except OSError:
        pass  # the name is taken, or no hard links here (or no room for the name): unlink as before
    unlink_quietly(path)
