"""The storage of a local prefix: plain absolute paths reached through ``os``.

fsspec is not imported for a local prefix: its import alone costs more than a no-op run's
work. Every operation is retried after transient errors (``EIO``, ``ESTALE`` from a network
file system) by :mod:`marinbuild.store.retry`.
"""

from __future__ import annotations

import functools
import os
import shutil
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, BinaryIO

from marinbuild.store.markers import STATUS_IN_OUTPUT
from marinbuild.store.retry import call_with_retries, retrying
from marinbuild.store.storage import Storage, open_regular, retire, unlink_quietly, write_temporary

_STATUS = "/" + STATUS_IN_OUTPUT

if TYPE_CHECKING:
    from marinbuild.store.conditional import ConditionalStore

__all__ = ["LocalStorage"]


class LocalStorage(Storage):
    """A prefix on this machine's file system."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __repr__(self) -> str:
        return f"LocalStorage({self.prefix!r})"

    @property
    def is_local(self) -> bool:
        return True

    @property
    def keeps_summary(self) -> bool:
        return False

    def conditional(self) -> ConditionalStore:
        """Create-if-absent with ``link(2)``, swaps under ``lockf`` (see :mod:`marinbuild.store.conditional`)."""
        from marinbuild.store.conditional import LocalConditionalStore

        return LocalConditionalStore()

    @retrying("read")
    def read_text(self, path: str) -> str | None:
        try:
            fd = open_regular(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        with open(fd, encoding="utf-8") as f:
            return f.read()

    def read_many(self, paths: Iterable[str]) -> dict[str, str]:
        paths = list(paths)
        return call_with_retries(lambda: _read_files(paths), f"read {len(paths)} files under {self.prefix}")

    @retrying("write")
    def write_atomic(self, path: str, text: str | bytes) -> None:
        """Write to a temporary file and rename it into place.

        An existing file is moved away first: renaming over an existing file makes ext4
        flush the data synchronously (``auto_da_alloc``), five times the cost of the rename
        itself, and that cost is paid per marker. In between, a reader sees no file, which
        every caller treats as "not done yet". A step's status marker is kept as
        ``status.previous`` (:func:`~marinbuild.store.storage.retire`): the RUNNING status its
        SUCCESS replaces would otherwise be an inode freed per step. Other files are unlinked.
        """
        data = text.encode("utf-8") if isinstance(text, str) else text
        folder = os.path.dirname(path)
        tmp = write_temporary(folder, data)
        try:
            if path.endswith(_STATUS):
                retire(path)
            else:
                unlink_quietly(path)
            os.rename(tmp, path)
        except BaseException:
            unlink_quietly(tmp)
            raise

    def write_many(self, files: Mapping[str, str | bytes], remove: Iterable[str] = ()) -> None:
        for path, text in files.items():
            self.write_atomic(path, text)
        self.remove_many(remove)

    @retrying("create folder")
    def makedirs(self, path: str) -> None:
        # Most calls find the folder there (a step's lease made it): one mkdir says so, where
        # os.makedirs asks three times.
        try:
            os.mkdir(path)
        except FileExistsError:
            if not os.path.isdir(path):
                raise
        except FileNotFoundError:
            os.makedirs(path, exist_ok=True)

    @retrying("check")
    def exists(self, path: str) -> bool:
        return os.path.lexists(path)

    @retrying("list")
    def list_names(self, folder: str) -> list[str]:
        try:
            return os.listdir(folder)
        except (FileNotFoundError, NotADirectoryError):
            return []

    def list_holding(self, folder: str, inner: str) -> list[str]:
        return [n for n in self.list_names(folder) if os.path.isfile(os.path.join(folder, n, inner))]

    @retrying("remove")
    def remove(self, path: str) -> None:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path, ignore_errors=False)
        elif os.path.lexists(path):
            os.unlink(path)

    def remove_many(self, paths: Iterable[str]) -> None:
        for path in paths:
            call_with_retries(functools.partial(unlink_quietly, path), f"remove {path}")

    @retrying("move")
    def move(self, source: str, target: str) -> None:
        if not os.path.lexists(source):
            return
        os.makedirs(os.path.dirname(target), exist_ok=True)
        os.rename(source, target)

    @retrying("upload")
    def put_file(self, local_path: str, path: str) -> None:
        if os.path.abspath(local_path) != os.path.abspath(path):
            with open(local_path, "rb") as src:
                self._copy_in(src, path)

    def copy_in(self, source: BinaryIO, path: str) -> None:
        # Not retried here: the stream cannot be rewound by this layer; callers retry the copy.
        self._copy_in(source, path)

    @staticmethod
    def _copy_in(source: BinaryIO, path: str) -> None:
        folder = os.path.dirname(path)
        tmp = write_temporary(folder, b"", prefix=".copy-")
        try:
            with open(tmp, "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            os.replace(tmp, path)
        except BaseException:
            unlink_quietly(tmp)
            raise


_CHUNK = 65536


def _read_files(paths: list[str]) -> dict[str, str]:
    # One retry scope for the whole batch: a no-op run reads every status file, and a
    # retry wrapper per file costs as much as the read itself.
    # Raw descriptors: markers are small, and a text-mode file object costs more than the read.
    out: dict[str, str] = {}
    for p in paths:
        try:
            fd = open_regular(p)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            # A read shorter than asked ends a regular file: one call for a marker, not two.
            chunks = [os.read(fd, _CHUNK)]
            while len(chunks[-1]) == _CHUNK:
                chunks.append(os.read(fd, _CHUNK))
        finally:
            os.close(fd)
        out[p] = b"".join(chunks).decode("utf-8")
    return out
