"""Real small filesystems for tests: a tmpfs that fills up, and one remounted read-only.

Mounting needs root (or ``CAP_SYS_ADMIN``); where the kernel refuses, the test is skipped
with the reason. Root ignores permission bits but not a read-only mount (``EROFS``) or a
full one (``ENOSPC``), so both are real for every user.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from .helpers import missing_tool


def _mount(*args: str) -> None:
    done = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise OSError(errno.EPERM, done.stderr.strip() or "mount failed")


@dataclass(frozen=True)
class SmallFs:
    """A mounted tmpfs of a test: fill it up, or make it read-only."""

    path: Path

    def fill(self) -> None:
        """Write zeros until the filesystem has no block left."""
        for name, size in (("filler", 1 << 16), ("filler-tail", 1)):  # then whatever a partial block left
            fd = os.open(self.path / name, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError as e:
                assert e.errno == errno.ENOSPC, e
            finally:
                os.close(fd)
        assert os.statvfs(self.path).f_bavail == 0

    def remount_read_only(self) -> None:
        _mount("-o", "remount,ro", str(self.path))


@contextlib.contextmanager
def tmpfs_at(point: Path) -> Iterator[SmallFs]:
    """An empty 2 MiB tmpfs mounted on the new folder ``point``, unmounted at the end (the test
    skipped where this machine mounts none)."""
    point.mkdir()
    try:
        _mount("-t", "tmpfs", "-o", "size=2m", "tmpfs", str(point))
    except (OSError, FileNotFoundError) as e:
        missing_tool(f"cannot mount a tmpfs here: {e}")
    try:
        yield SmallFs(point)
    finally:
        subprocess.run(["umount", "-l", str(point)], capture_output=True, check=False)


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[SmallFs]:
    """An empty 2 MiB tmpfs, unmounted after the test."""
    with tmpfs_at(tmp_path / "small-fs") as fs:
        yield fs
