"""The storage of a prefix that is a URL (``gs://``, ``s3://``, ``memory://``): fsspec underneath.

The only module, with :mod:`marinbuild.store.conditional`, that talks to fsspec. Three
rules keep a remote store fast and bounded:

* **One retry loop.** gcsfs retries every request up to six times with waits of up to
  32 s on its own; under marinbuild's six attempts that nested into about three minutes
  for one call, longer than a lease's fence time. A ``gs://`` prefix therefore gets the
  filesystem gcsfs picks, with an HTTP session whose requests are made once
  (:mod:`marinbuild.store.gcs_session`), and :mod:`marinbuild.store.retry` is the only
  place that retries, with one backoff.
* **Bounded when asked.** Inside :func:`marinbuild.store.retry.bounded` (every lease read
  and write) an asynchronous filesystem's call is cancelled at the deadline.
* **Overlapped.** Reads, writes and deletes of many files go out together
  (:meth:`FsspecStorage.read_many`, :meth:`~FsspecStorage.write_many`,
  :meth:`~FsspecStorage.remove_many`), never one round trip after another.
"""

from __future__ import annotations

import asyncio
import functools
import posixpath
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, BinaryIO

from marinbuild.store.errors import UserError, missing_extra
from marinbuild.store.gcs_session import is_single_attempt, single_attempt_session
from marinbuild.store.retry import call_with_retries, is_transient, per_request, remaining, retrying
from marinbuild.store.storage import Storage

if TYPE_CHECKING:
    from marinbuild.store.conditional import ConditionalStore

__all__ = ["FsspecStorage", "gcs_opened", "open_filesystem"]

class FsspecStorage(Storage):
    """A prefix reached through an fsspec filesystem."""

    def __init__(self, prefix: str, fs: Any) -> None:
        self.prefix = prefix
        self.fs = fs

    def __repr__(self) -> str:
        return f"FsspecStorage({self.prefix!r})"

    @classmethod
    def open(cls, prefix: str) -> FsspecStorage:
        """The storage of a URL prefix; a missing package or unknown protocol is a :class:`UserError`."""
        return cls(prefix, open_filesystem(prefix, f"prefix {prefix!r}")[0])

    @property
    def is_local(self) -> bool:
        return False

    @property
    def keeps_summary(self) -> bool:
        return True

    @property
    def protocols(self) -> tuple[str, ...]:
        protocol = self.fs.protocol
        return (protocol,) if isinstance(protocol, str) else tuple(protocol)

    def conditional(self) -> ConditionalStore:
        """Generation preconditions on GCS; a process-wide mutex elsewhere (see :mod:`marinbuild.store.conditional`)."""
        from marinbuild.store.conditional import GcsConditionalStore, SerializedConditionalStore

        if _is_gcs(self.fs):
            return GcsConditionalStore(self)
        return SerializedConditionalStore(self)

    def _p(self, path: str) -> str:
        return str(self.fs._strip_protocol(path))

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``fs.<method>(*args, **kwargs)``, cancelled at the deadline of an enclosing ``bounded`` block."""
        left = remaining()
        if left is not None and getattr(self.fs, "async_impl", False):
            kwargs["timeout"] = max(left, 0.001)  # consumed by fsspec's sync(), which cancels the call
        return getattr(self.fs, method)(*args, **kwargs)

    def gather(self, coroutines: list[Any]) -> list[Any]:
        """Run coroutines of an asynchronous filesystem together; results or exceptions, in order."""
        from fsspec.asyn import sync

        async def together() -> list[Any]:
            return await asyncio.gather(*coroutines, return_exceptions=True)

        left = remaining()
        return sync(self.fs.loop, together, timeout=left if left is None else max(left, 0.001))  # type: ignore[no-any-return]

    @retrying("read")
    def read_text(self, path: str) -> str | None:
        try:
            return bytes(self.call("cat_file", self._p(path))).decode("utf-8")
        except FileNotFoundError:
            return None

    def read_many(self, paths: Iterable[str]) -> dict[str, str]:
        paths = list(paths)
        if not paths:
            return {}
        stripped = {self._p(p): p for p in paths}
        each = per_request() if getattr(self.fs, "async_impl", False) else None
        texts: dict[str, str] = {}
        todo = list(stripped)

        def attempt() -> None:
            # Only the files whose read failed for a transient reason are asked again.
            nonlocal todo
            got = self._cat_each_within(todo, each) if each is not None else self.call("cat", todo, on_error="return")
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

    def _cat_each_within(self, paths: list[str], seconds: float) -> dict[str, Any]:
        """``cat(paths, on_error="return")`` with each request cancelled after ``seconds``."""
        limit = asyncio.Semaphore(100)  # as many connections at once as gcsfs's own batches use

        async def one(path: str) -> Any:
            async with limit:
                return await asyncio.wait_for(self.fs._cat_file(path), seconds)

        results = self.gather([one(p) for p in paths])
        return {p: (TimeoutError(f"no answer within {seconds:g} s") if isinstance(r, asyncio.TimeoutError) else r)
                for p, r in zip(paths, results, strict=True)}

    @retrying("write")
    def write_atomic(self, path: str, text: str | bytes) -> None:
        """One PUT of the whole object: object stores never expose a partial object."""
        data = text.encode("utf-8") if isinstance(text, str) else text
        self.call("pipe_file", self._p(path), data)

    def write_many(self, files: Mapping[str, str | bytes], remove: Iterable[str] = ()) -> None:
        data = {self._p(p): (t.encode("utf-8") if isinstance(t, str) else t) for p, t in files.items()}
        gone = [self._p(p) for p in remove]
        if not getattr(self.fs, "async_impl", False):
            for path, blob in data.items():
                call_with_retries(functools.partial(self.fs.pipe_file, path, blob), f"write {path}")
            for path in gone:
                call_with_retries(functools.partial(_rm_quietly, self.fs, path), f"remove {path}")
            return
        self._together({p: functools.partial(self.fs._pipe_file, p, b) for p, b in data.items()},
                       {p: functools.partial(self.fs._rm_file, p) for p in gone}, f"under {self.prefix}")

    def _together(self, writes: Mapping[str, Any], removes: Mapping[str, Any], where: str) -> None:
        """Run the coroutine makers of an asynchronous filesystem at once; retry only what failed transiently."""
        todo = {**{("w", p): f for p, f in writes.items()}, **{("r", p): f for p, f in removes.items()}}
        if not todo:
            return

        def attempt() -> None:
            nonlocal todo
            keys = list(todo)
            results = self.gather([todo[k]() for k in keys])
            again = {}
            for k, result in zip(keys, results, strict=True):
                if not isinstance(result, BaseException):
                    continue
                if k[0] == "r" and isinstance(result, FileNotFoundError):
                    continue
                if not is_transient(result):
                    raise result
                again[k] = todo[k]
            todo = again
            if again:
                raise ConnectionError(f"{len(again)} of the writes and removals failed for a transient reason")

        call_with_retries(attempt, f"write {len(writes)} and remove {len(removes)} files {where}")
        for folder in {posixpath.dirname(p) for p in [*writes, *removes]}:
            self.fs.invalidate_cache(folder)

    @retrying("create folder")
    def makedirs(self, path: str) -> None:
        """Object stores have no folders: nothing to create."""

    @retrying("check")
    def exists(self, path: str) -> bool:
        return bool(self.call("exists", self._p(path)))

    @retrying("list")
    def list_names(self, folder: str) -> list[str]:
        if _is_gcs(self.fs):
            return self._list_gcs(folder)
        try:
            # A listing cached by the filesystem would hide what other runners wrote since.
            self.fs.invalidate_cache(self._p(folder))
            entries = self.call("ls", self._p(folder), detail=False)
        except FileNotFoundError:
            return []
        return [posixpath.basename(str(e).rstrip("/")) for e in entries]

    def _list_gcs(self, folder: str) -> list[str]:
        # One request per 1,000 names and nothing else: gcsfs's ls() also asks whether an
        # empty folder is an object, and caches listings that other runners change.
        bucket, key, _ = self.fs.split_path(self._p(folder))
        under = f"{key.rstrip('/')}/" if key else ""
        names: list[str] = []
        token = None
        while True:
            page = self.call("call", "GET", "b/{}/o", bucket, delimiter="/", prefix=under, maxResults=1000,
                             pageToken=token, fields="items(name),prefixes,nextPageToken", json_out=True)
            names += [p[len(under):].rstrip("/") for p in page.get("prefixes", ())]
            names += [o["name"][len(under):] for o in page.get("items", ()) if o["name"] != under]
            token = page.get("nextPageToken")
            if not token:
                return names

    @retrying("list")
    def list_holding(self, folder: str, inner: str) -> list[str]:
        if not _is_gcs(self.fs):  # memory:// and the like: no request costs a round trip
            return [n for n in self.list_names(folder) if self.call("isfile", self._p(Storage.join(folder, n, inner)))]
        # Only the objects named FOLDER/*/INNER come back (matchGlob), not every file of every
        # output: a SUCCESS marker deleted by hand is noticed in the same one request per
        # 1,000 outputs that a listing of the folders costs.
        bucket, key, _ = self.fs.split_path(self._p(folder))
        under = f"{key.rstrip('/')}/" if key else ""
        pattern = f"{_glob_literal(under)}*/{_glob_literal(inner)}"
        names: list[str] = []
        token = None
        while True:
            page = self.call("call", "GET", "b/{}/o", bucket, prefix=under, matchGlob=pattern, maxResults=1000,
                             pageToken=token, fields="items(name),nextPageToken", json_out=True)
            names += [o["name"][len(under):].split("/", 1)[0] for o in page.get("items", ())]
            token = page.get("nextPageToken")
            if not token:
                return list(dict.fromkeys(names))

    @retrying("remove")
    def remove(self, path: str) -> None:
        try:
            self.call("rm", self._p(path), recursive=True)
        except FileNotFoundError:
            pass

    def remove_many(self, paths: Iterable[str]) -> None:
        self.write_many({}, remove=paths)

    @retrying("move")
    def move(self, source: str, target: str) -> None:
        # Copy, then delete: object stores have no rename of a folder (gcsfs's own move asks an
        # API that plain buckets refuse, and logs it). A retried move finds part of it done:
        # the copy is repeated whole, and what is left of the source is deleted.
        src, dst = self._p(source), self._p(target)
        try:
            self.call("copy", src, dst, recursive=True)
            self.call("rm", src, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache(posixpath.dirname(src))

    @retrying("upload")
    def put_file(self, local_path: str, path: str) -> None:
        self.call("put_file", local_path, self._p(path))

    def copy_in(self, source: BinaryIO, path: str) -> None:
        # Not retried here: the stream cannot be rewound by this layer; callers retry the copy.
        with self.fs.open(self._p(path), "wb") as out:  # one object appears when it closes
            while chunk := source.read(1 << 20):
                out.write(chunk)


_gcs_opened = False


def gcs_opened() -> bool:
    """Whether this process opened a ``gs://`` filesystem (gcsfs's default one speaks gRPC too)."""
    return _gcs_opened


def open_filesystem(url: str, what: str) -> tuple[Any, str]:
    """The fsspec filesystem of ``url`` (the class fsspec picks), made to try each request once, and the path in it.

    A missing package or an unknown protocol is a :class:`UserError` naming ``what``. For
    ``gs://`` the filesystem is gcsfs's own choice (``ExtendedGcsFileSystem`` by default),
    opened with its settings plus a single-attempt HTTP session.
    """
    import fsspec

    try:
        fs, path = fsspec.core.url_to_fs(url)
    except ImportError as e:
        cause = e.__cause__ if isinstance(e.__cause__, ImportError) else e  # fsspec rewords gcsfs's
        raise missing_extra(cause, what) or UserError(f"{what} needs a package that is not installed: {e}") from None
    except ValueError as e:  # "Protocol not known"
        raise UserError(f"{what}: {e}") from None
    if _is_gcs(fs):
        global _gcs_opened
        _gcs_opened = True
    if _is_gcs(fs) and not is_single_attempt(fs.storage_options.get("session_kwargs")):
        options = {**fs.storage_options, "session_kwargs": single_attempt_session(fs.storage_options.get("session_kwargs"))}
        fs = type(fs)(*fs.storage_args, **options)
    return fs, path


def _rm_quietly(fs: Any, path: str) -> None:
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        pass


def _glob_literal(text: str) -> str:
    """``text`` matched literally by a GCS ``matchGlob``: each special character in a class of its own.

    >>> _glob_literal("runs/a*b[1]{x}/")
    'runs/a[*]b[[]1][{]x}/'
    """
    return "".join(f"[{c}]" if c in "*?[{\\" else c for c in text)


def _is_gcs(fs: Any) -> bool:
    protocol = fs.protocol
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol)
    return "gs" in protocols or "gcs" in protocols
