"""What the environment cache holds, and removing what no step uses.

::

    for env in cached_envs():
        print(env.key, env.size, env.last_use)
    removed = prune(keep={"3f2a9c1d0b4e5f67"})
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from marinbuild.pyenv.builder import LAST_USE, MANIFEST, cache_root, is_ready

__all__ = ["CachedEnv", "cached_envs", "prune"]

STALE_BUILD_S = 3600.0
"""A temporary build folder older than this whose lock is free is a crashed build's leftover."""


@dataclass(frozen=True)
class CachedEnv:
    """One complete environment in the cache."""

    key: str
    path: Path
    size: int
    """Bytes on disk (files only; links are not followed)."""
    last_use: float
    requirements: tuple[str, ...]
    python: str


def _size(path: Path) -> int:
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(folder, name)).st_size
    return total


def cached_envs(root: Path | None = None) -> list[CachedEnv]:
    """Every complete environment under ``root`` (default: the cache), most recently used first."""
    root = root or cache_root()
    if not root.is_dir():
        return []
    out = []
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".") or not entry.is_dir() or not is_ready(entry):
            continue
        try:
            manifest = json.loads((entry / MANIFEST).read_text())
        except (OSError, ValueError):
            continue
        used = entry / LAST_USE
        last = used.stat().st_mtime if used.exists() else float(manifest.get("created", 0))
        out.append(
            CachedEnv(
                key=entry.name,
                path=entry,
                size=_size(entry),
                last_use=last,
                requirements=tuple(manifest.get("requirements", ())),
                python=str(manifest.get("python", "?")),
            )
        )
    return sorted(out, key=lambda e: -e.last_use)


def prune(keep: Collection[str], root: Path | None = None, dry: bool = False) -> list[Path]:
    """Remove every environment whose key is not in ``keep``, and crashed builds; what went.

    An environment is removed only while its lock is held here, so a runner building or
    about to reuse it (it takes the same lock first when the environment is missing) is
    never handed a folder being deleted.
    """
    root = root or cache_root()
    if not root.is_dir():
        return []
    removed: list[Path] = []
    now = time.time()
    for entry in sorted(root.iterdir()):
        if entry.name.startswith(".tmp-") and entry.is_dir():
            key = entry.name[len(".tmp-"):].split("-", 1)[0]
            if now - entry.stat().st_mtime > STALE_BUILD_S and _try_remove(root, key, entry, dry):
                removed.append(entry)
        elif (
            not entry.name.startswith(".") and entry.is_dir() and entry.name not in keep
            and _try_remove(root, entry.name, entry, dry)
        ):
            removed.append(entry)
    return removed


def _try_remove(root: Path, key: str, path: Path, dry: bool) -> bool:
    lock = root / f"{key}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # being built right now
        if not dry:
            # Renamed away first: a reader checking readiness sees it gone, never half-deleted.
            doomed = root / f".tmp-{key}-removing-{os.getpid()}"
            os.rename(path, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
            # The lock file stays: unlinked, a waiter's lock and a newcomer's could differ.
        return True
    finally:
        os.close(fd)
