"""Mirrored inputs: a path on another store, copied under the prefix before a step runs.

``mirrored(path)`` in a step's config stands for a local copy of ``path`` (any fsspec URL,
for example a bucket in another region): before the step starts it is copied to
``PREFIX/mirror/NAME`` (``NAME`` made from the path, plus a short hash of it), and the step
receives that path. A copy that finished before (its ``NAME.mirrored.json`` marker exists)
is used as is. A copy larger than the budget is refused and the step fails with one line
saying so: ``budget_gb=`` on the call, else ``MARIN_MIRROR_BUDGET_GB``, else 10. Sizes are
counted in GiB, as everywhere in marinbuild.

Only ``mirrored(versioned(path))`` puts the path into the step's identity (encoded as
``{"__mirrored__": path}``); like any plain value, ``mirrored(path)`` does not.

>>> from marinbuild import mirrored
>>> m = mirrored("gs://other-region/tokenizer/vocab.json", budget_gb=1)
>>> mirror_target("gs://mine/prefix", m.source)
'gs://mine/prefix/mirror/other-region_tokenizer_vocab.json-8d85d455'
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import threading
import time
from typing import Any, Protocol

import xxhash

from marinbuild.store.errors import UserError
from marinbuild.store.fsspec_store import open_filesystem
from marinbuild.store.retry import call_with_retries
from marinbuild.store.storage import Storage

__all__ = ["DEFAULT_BUDGET_GB", "MirrorError", "MirrorRequest", "budget_gb", "ensure_mirrored", "mirror_target"]

DEFAULT_BUDGET_GB = 10.0
GIB = 1 << 30


class MirrorError(UserError):
    """An input that cannot be mirrored: missing, or over its budget."""


class MirrorRequest(Protocol):
    """What a :class:`~marinbuild.steps.Mirrored` config value asks for: a source and a size budget."""

    @property
    def source(self) -> str: ...

    @property
    def budget_gb(self) -> float | None: ...


def mirror_target(prefix: str, source: str) -> str:
    """Where ``source`` is copied under ``prefix``."""
    bare = source.split("://", 1)[-1].strip("/")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", bare)[-80:].strip("_.") or "root"
    digest = xxhash.xxh32_hexdigest(source.encode("utf-8"))
    return Storage.join(prefix, "mirror", f"{readable}-{digest}")


def budget_gb(m: MirrorRequest) -> float:
    if m.budget_gb is not None:
        return float(m.budget_gb)
    raw = os.environ.get("MARIN_MIRROR_BUDGET_GB")
    if not raw:
        return DEFAULT_BUDGET_GB
    try:
        return float(raw)
    except ValueError:
        raise MirrorError(f"MARIN_MIRROR_BUDGET_GB must be a number of GB, not {raw!r}") from None


_copying: dict[str, threading.Lock] = {}
_copying_guard = threading.Lock()


def ensure_mirrored(m: MirrorRequest, storage: Storage) -> str:
    """Copy ``m.source`` under ``storage``'s prefix unless a complete copy is there; its path."""
    target = mirror_target(storage.prefix, m.source)
    with _copying_guard:
        lock = _copying.setdefault(target, threading.Lock())
    with lock:  # steps are prepared on several threads at once: one copy per process
        return _mirror(m, storage, target)


def _mirror(m: MirrorRequest, storage: Storage, target: str) -> str:
    marker = target + ".mirrored.json"
    if storage.read_text(marker) is not None:
        return target
    # The source's own filesystem, with each request made once: the retries below are the only ones.
    src_fs, src = open_filesystem(m.source, f"mirrored({m.source!r})")
    files = call_with_retries(lambda: _listing(src_fs, src), f"list {m.source}")
    if files is None:
        raise MirrorError(f"mirrored({m.source!r}): no such file or directory")
    total = sum(files.values())
    budget = budget_gb(m)
    if total > budget * GIB:
        raise MirrorError(
            f"mirrored({m.source!r}): {total / GIB:.2f} GB is over the mirror budget of {budget:g} GB "
            "(raise budget_gb= or MARIN_MIRROR_BUDGET_GB)"
        )
    for rel in files:
        dest = Storage.join(target, rel) if rel else target
        source_file = posixpath.join(src, rel) if rel else src
        call_with_retries(functools.partial(_copy, src_fs, source_file, storage, dest), f"copy {m.source}")
    record = {"source": m.source, "bytes": total, "files": len(files), "time": time.time()}
    storage.write_atomic(marker, json.dumps(record, sort_keys=True))
    return target


def _listing(fs: Any, path: str) -> dict[str, int] | None:
    """Sizes of the files to copy by path relative to ``path`` ("" for a single file)."""
    if not fs.exists(path):
        return None
    if not fs.isdir(path):
        return {"": int(fs.size(path) or 0)}
    found = fs.find(path, detail=True)
    root = path.rstrip("/") + "/"
    return {name[len(root):]: int(info.get("size") or 0) for name, info in found.items() if name.startswith(root)}


def _copy(src_fs: Any, src: str, storage: Storage, dest: str) -> None:
    # One whole file appears at once (another runner may mirror the same input meanwhile).
    with src_fs.open(src, "rb") as reader:
        storage.copy_in(reader, dest)
