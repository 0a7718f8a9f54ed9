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

>>> m = mirrored("gs://other-region/tokenizer/vocab.json", budget_gb=1)
>>> mirror_target("gs://mine/prefix", m.source)
'gs://mine/prefix/mirror/other-region_tokenizer_vocab.json-8d85d455'
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import pathlib
import posixpath
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import xxhash

from marinbuild.errors import UserError
from marinbuild.steps import OutputPathOf, Step, VersionedValue, is_dataclass_instance
from marinbuild.store.retry import call_with_retries
from marinbuild.store.storage import Storage, unlink_quietly

__all__ = ["DEFAULT_BUDGET_GB", "MirrorError", "Mirrored", "ensure_mirrored", "find_mirrored", "mirror_target",
           "mirrored"]

DEFAULT_BUDGET_GB = 10.0
GIB = 1 << 30


class MirrorError(UserError):
    """An input that cannot be mirrored: missing, or over its budget."""


@dataclass(frozen=True)
class Mirrored:
    """A config value standing for a local copy of ``source``. Build it with :func:`mirrored`."""

    source: str
    versioned: bool = False
    budget_gb: float | None = None
    # Config walks treat it as one value, not as a dataclass to descend into.
    __marinbuild_placeholder__: ClassVar[bool] = True


def mirrored(path: str | os.PathLike[str] | VersionedValue, budget_gb: float | None = None) -> Mirrored:
    """Copy ``path`` under the prefix before the step runs, and pass the copy's path instead.

    >>> mirrored("s3://data/corpus", budget_gb=50).budget_gb
    50
    """
    is_versioned = isinstance(path, VersionedValue)
    raw = path.value if isinstance(path, VersionedValue) else path
    if isinstance(raw, pathlib.PurePath):
        raw = str(raw)
    if not isinstance(raw, str) or not raw:
        raise UserError(f"mirrored() needs a path or URL string, got {type(raw).__name__}")
    if budget_gb is not None and budget_gb < 0:
        raise UserError(f"mirrored({raw!r}): budget_gb must not be negative")
    return Mirrored(raw, is_versioned, budget_gb)


def mirror_target(prefix: str, source: str) -> str:
    """Where ``source`` is copied under ``prefix``."""
    bare = source.split("://", 1)[-1].strip("/")
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", bare)[-80:].strip("_.") or "root"
    digest = xxhash.xxh32_hexdigest(source.encode("utf-8"))
    return Storage.join(prefix, "mirror", f"{readable}-{digest}")


def find_mirrored(config: Any) -> list[Mirrored]:
    """Every :class:`Mirrored` inside a config, in order, without repeats."""
    found: dict[Mirrored, None] = {}
    stack = [config]
    while stack:
        value = stack.pop()
        if isinstance(value, Mirrored):
            found[value] = None
        elif isinstance(value, (Step, OutputPathOf)):
            continue  # another step's config is that step's business: walking it would revisit every ancestor
        elif isinstance(value, VersionedValue):
            stack.append(value.value)
        elif isinstance(value, dict):
            stack.extend(reversed(list(value.values())))
        elif isinstance(value, (list, tuple)):
            stack.extend(reversed(value))
        elif is_dataclass_instance(value):
            stack.extend(reversed([getattr(value, f.name) for f in dataclasses.fields(value)]))
    return list(found)


def budget_gb(m: Mirrored) -> float:
    if m.budget_gb is not None:
        return float(m.budget_gb)
    raw = os.environ.get("MARIN_MIRROR_BUDGET_GB")
    if not raw:
        return DEFAULT_BUDGET_GB
    try:
        return float(raw)
    except ValueError:
        raise MirrorError(f"MARIN_MIRROR_BUDGET_GB must be a number of GB, not {raw!r}") from None


def ensure_mirrored(m: Mirrored, storage: Storage) -> str:
    """Copy ``m.source`` under ``storage``'s prefix unless a complete copy is there; its path."""
    target = mirror_target(storage.prefix, m.source)
    marker = target + ".mirrored.json"
    if storage.read_text(marker) is not None:
        return target
    import fsspec

    src_fs, src = fsspec.core.url_to_fs(m.source)
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
    with src_fs.open(src, "rb") as reader, _writer(storage, dest) as writer:
        shutil.copyfileobj(reader, writer, 1 << 22)


@contextlib.contextmanager
def _writer(storage: Storage, dest: str) -> Iterator[Any]:
    if not storage.is_local:
        with storage.fs.open(storage._p(dest), "wb") as f:  # one object appears when it closes
            yield f
        return
    # Another runner may mirror the same input at once: write aside, then rename into place.
    os.makedirs(os.path.dirname(dest), exist_ok=True)
    tmp = f"{dest}.tmp-{os.urandom(4).hex()}"
    try:
        with open(tmp, "wb") as f:
            yield f
        os.replace(tmp, dest)
    finally:
        unlink_quietly(tmp)
