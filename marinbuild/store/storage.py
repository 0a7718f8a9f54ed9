"""Where outputs live: a thin layer over an fsspec filesystem.

Local paths are kept as plain absolute paths (no ``file://``) so that users see paths they
can ``cd`` into; any other URL (``gs://``, ``memory://``) goes through its fsspec
filesystem. Reads of many small files go through :meth:`Storage.read_many`, which asks a
remote store with bounded parallel requests instead of one round trip after another. Every
operation is retried after transient errors (:mod:`marinbuild.store.retry`); each one is safe to
repeat because a write always puts a whole file.

>>> s = Storage.for_prefix("memory://demo")
>>> s.write_atomic(s.join(s.prefix, "a.txt"), "hi")
>>> s.read_text(s.join(s.prefix, "a.txt"))
'hi'
"""

from __future__ import annotations

import itertools
import os
import posixpath
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from marinbuild.errors import UserError
from marinbuild.store.retry import call_with_retries, is_transient, retrying

__all__ = ["DEFAULT_PREFIX", "Storage", "check_local_prefix", "resolve_prefix", "unlink_quietly", "write_temporary"]

DEFAULT_PREFIX = "marinbuild-out"
"""The prefix used when neither ``--prefix`` nor ``MARIN_PREFIX`` is set, relative to the
working directory."""


def resolve_prefix(prefix: str | None) -> str:
    """``--prefix``, else ``$MARIN_PREFIX``, else :data:`DEFAULT_PREFIX`; local ones made absolute."""
    raw = given = prefix or os.environ.get("MARIN_PREFIX") or DEFAULT_PREFIX
    if raw.startswith("file://"):
        raw = raw[len("file://") :]
    if "://" in raw:
        scheme, _, rest = raw.partition("://")
        if not rest.strip("/"):
            raise UserError(f"prefix {raw!r} names no bucket or folder (e.g. {scheme}://bucket/experiments)")
        return raw.rstrip("/")
    path = os.path.abspath(os.path.expanduser(raw))
    if os.path.dirname(path) == path or os.path.realpath(path) == "/":
        raise UserError(f"prefix {given!r} is a filesystem root; give a folder for the outputs (e.g. /data/experiments)")
    check_local_prefix(path, given)
    return path


def check_local_prefix(path: str, given: str | None = None, create: bool = False) -> None:
    """Refuse (UserError naming the prefix) a local prefix that is not a folder or cannot be written.

    Without ``create`` nothing is written: the nearest existing folder on the way must let
    this user create folders. With ``create`` the prefix folder is made, as a run will.
    """
    shown = repr(given if given is not None else path)
    existing = path
    while not os.path.lexists(existing) and os.path.dirname(existing) != existing:
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        where = "" if existing == path else f" ({existing} is a file)"
        raise UserError(f"prefix {shown} is not a folder{where}; give a folder for the outputs")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"prefix {shown} is not writable by this user (in {existing})")
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise UserError(f"prefix {shown} cannot be created: {e.strerror or e}") from None


@dataclass
class Storage:
    """Operations on the store holding one prefix."""

    prefix: str
    fs: Any
    """The fsspec filesystem of a remote prefix; None for local disk, which is reached
    through ``os`` directly (fsspec's import alone costs more than a no-op run's work)."""

    @classmethod
    def for_prefix(cls, prefix: str) -> Storage:
        """The storage of an already resolved prefix (see :func:`resolve_prefix`)."""
        if "://" not in prefix:
            return cls(prefix=prefix, fs=None)
        import fsspec

        try:
            fs, _ = fsspec.core.url_to_fs(prefix)
        except ImportError as e:
            raise UserError(f"prefix {prefix!r} needs a package that is not installed: {e}") from None
        except ValueError as e:  # "Protocol not known"
            raise UserError(f"prefix {prefix!r}: {e}") from None
        return cls(prefix=prefix, fs=fs)

    @property
    def is_local(self) -> bool:
        return self.fs is None

    @staticmethod
    def join(base: str, *parts: str) -> str:
        """``posixpath.join``; one relative name, the call made for every step, at a fifth of its cost."""
        if len(parts) == 1 and not parts[0].startswith("/"):
            return f"{base}{parts[0]}" if not base or base.endswith("/") else f"{base}/{parts[0]}"
        return posixpath.join(base, *parts)

    def _p(self, path: str) -> str:
        return path if self.is_local else self.fs._strip_protocol(path)

    @retrying("read")
    def read_text(self, path: str) -> str | None:
        """The file's text, or None when it does not exist."""
        if self.is_local:
            try:
                with open(path, encoding="utf-8") as f:
                    return f.read()
            except (FileNotFoundError, NotADirectoryError):
                return None
        try:
            return self.fs.cat_file(self._p(path)).decode("utf-8")
        except FileNotFoundError:
            return None

    def read_many(self, paths: Iterable[str]) -> dict[str, str]:
        """Texts of the files that exist among ``paths``; remote stores are asked in parallel."""
        paths = list(paths)
        if self.is_local:
            return call_with_retries(lambda: _read_local_files(paths), f"read {len(paths)} files under {self.prefix}")
        if not paths:
            return {}
        stripped = {self._p(p): p for p in paths}
        texts: dict[str, str] = {}
        todo = list(stripped)

        def attempt() -> None:
            # Only the files whose read failed for a transient reason are asked again.
            nonlocal todo
            got = self.fs.cat(todo, on_error="return")
            again = []
            for key, value in got.items():
                if isinstance(value, bytes):
                    texts[stripped[key]] = value.decode("utf-8")
                elif is_transient(value):
                    again.append(key)
                elif not isinstance(value, (FileNotFoundError, KeyError)):
                    raise value
            todo = again
            if again:
                raise ConnectionError(f"{len(again)} of the reads failed for a transient reason")

        call_with_retries(attempt, f"read {len(paths)} files under {self.prefix}")
        return texts

    @retrying("write")
    def write_atomic(self, path: str, text: str) -> None:
        """Write a whole file so that readers never see a part of it.

        Locally the new content is written to a temporary file and renamed into place.
        An existing file is unlinked first: renaming over an existing file makes ext4
        flush the data synchronously (``auto_da_alloc``), five times the cost of the
        rename itself, and that cost is paid per marker. In between, a reader sees no
        file, which every caller treats as "not done yet".
        """
        data = text.encode("utf-8")
        if self.is_local:
            tmp = write_temporary(os.path.dirname(path), data)
            try:
                unlink_quietly(path)
                os.rename(tmp, path)
            except BaseException:
                unlink_quietly(tmp)
                raise
            return
        # One PUT of the whole object: object stores never expose a partial object.
        self.fs.pipe_file(self._p(path), data)

    @retrying("create folder")
    def makedirs(self, path: str) -> None:
        if self.is_local:
            os.makedirs(path, exist_ok=True)

    @retrying("check")
    def exists(self, path: str) -> bool:
        if self.is_local:
            return os.path.lexists(path)
        return bool(self.fs.exists(self._p(path)))

    @retrying("list")
    def list_names(self, folder: str) -> list[str]:
        """Names of the entries directly inside ``folder`` (empty when it does not exist)."""
        if self.is_local:
            try:
                return os.listdir(folder)
            except (FileNotFoundError, NotADirectoryError):
                return []
        try:
            # A listing cached by the filesystem would hide what other runners wrote since.
            self.fs.invalidate_cache(self._p(folder))
            entries = self.fs.ls(self._p(folder), detail=False)
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(e).rstrip("/")) for e in entries]

    @retrying("remove")
    def remove(self, path: str) -> None:
        """Delete a file or a whole directory tree; missing is fine."""
        if self.is_local:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path, ignore_errors=False)
            elif os.path.lexists(path):
                os.unlink(path)
            return
        try:
            self.fs.rm(self._p(path), recursive=True)
        except FileNotFoundError:
            pass

    @retrying("upload")
    def put_file(self, local_path: str, path: str) -> None:
        """Copy a local file into the store (a no-op when it is already that file)."""
        if self.is_local:
            if os.path.abspath(local_path) != os.path.abspath(path):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(local_path, "rb") as src, open(path, "wb") as dst:
                    dst.write(src.read())
            return
        self.fs.put_file(local_path, self._p(path))


def _read_local_files(paths: list[str]) -> dict[str, str]:
    # One retry scope for the whole batch: a no-op run reads every status file, and a
    # retry wrapper per file costs as much as the read itself.
    # Raw descriptors: markers are small, and a text-mode file object costs more than the read.
    out: dict[str, str] = {}
    for p in paths:
        try:
            fd = os.open(p, os.O_RDONLY)
        except (FileNotFoundError, NotADirectoryError):
            continue
        try:
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
        finally:
            os.close(fd)
        out[p] = b"".join(chunks).decode("utf-8")
    return out


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


def unlink_quietly(path: str) -> None:
    """Remove a local file; one already gone is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
