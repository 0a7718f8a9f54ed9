"""Shipping the project directory to TPU hosts as one content-addressed tarball.

The project is packed deterministically (sorted names, zeroed times and owners), so the
same files always give the same digest; a host that already holds
``<remote_workdir>/<digest>`` is not sent it again::

    packed = pack_workdir("examples/tpu", "/tmp/marinbuild-pack", exclude=["examples/tpu/marinbuild-out"])
    packed.digest   # the same for the same files, whatever their times or owners

What is packed: in a git work tree, the files git tracks or would track (``.gitignore``
honoured); elsewhere every file. Never packed: the run's local prefix when it lies inside
the project (outputs, markers, leases and logs change on every run, which would change the
digest and ship every checkpoint to every host), any ``marinbuild-out`` folder and any step
output (a folder holding ``.marinbuild/``), ``.git``, caches and virtual environments.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import secrets
import shlex
import subprocess
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from marinbuild.backends.tpu.ssh import SshConnection
from marinbuild.errors import MarinbuildError

__all__ = [
    "COMPLETE_MARKER",
    "PackedWorkdir",
    "WorkdirSyncError",
    "list_project_files",
    "pack_workdir",
    "presence_check",
    "upload_and_unpack",
]

COMPLETE_MARKER = ".marinbuild-complete"
_SKIP_DIRS = {".git", "__pycache__", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"}
_OUTPUT_DIRS = {"marinbuild-out", ".marinbuild"}
"""Folders of marinbuild's own outputs and markers: never part of the project shipped."""
_DIGEST_LEN = 24


class WorkdirSyncError(MarinbuildError):
    """The project could not be put in place on a host."""


@dataclass(frozen=True)
class PackedWorkdir:
    """A packed project: the local tarball, its content digest, and what it holds."""

    path: Path
    digest: str
    file_count: int
    size: int


def list_project_files(root: str | Path, exclude: Iterable[str | Path] = ()) -> list[str]:
    """The project's files, relative and sorted: what git would track, else a plain walk.

    In a git work tree this is ``git ls-files -co --exclude-standard`` (tracked plus
    untracked-but-not-ignored), so ``.gitignore`` is honoured.  Elsewhere every file is
    taken except under ``.git``, ``__pycache__`` and virtual environments.  Either way,
    nothing under ``exclude`` (the run's prefix), a ``marinbuild-out`` folder or a step
    output (a folder holding ``.marinbuild/``) is taken.
    """
    root = Path(root)
    try:
        out = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard", "-z"],
            cwd=root, capture_output=True, check=True,
        ).stdout
        names = {n for n in out.decode().split("\0") if n}
    except (OSError, subprocess.CalledProcessError):
        names = set()
        for dirpath, dirnames, filenames in os.walk(root):
            if ".marinbuild" in dirnames and Path(dirpath) != root:
                dirnames[:] = []  # a step's output: none of it is project code
                continue
            dirnames[:] = [d for d in dirnames if d not in _SKIP_DIRS and d not in _OUTPUT_DIRS]
            rel = Path(dirpath).relative_to(root)
            names.update((rel / f).as_posix() for f in filenames if not f.endswith(".pyc"))
    # Tracked files deleted from the work tree and submodule directories are not files.
    files = [n for n in names if (root / n).is_symlink() or (root / n).is_file()]
    skipped = _skipped_folders(root, exclude, files)
    return sorted(n for n in files if not _under(n, skipped))


def _skipped_folders(root: Path, exclude: Iterable[str | Path], files: list[str]) -> set[str]:
    """Relative folders whose files are never packed: the excluded ones inside ``root``, and outputs."""
    real_root = os.path.realpath(root)
    skipped: set[str] = set()
    for path in exclude:
        rel = os.path.relpath(os.path.realpath(path), real_root)
        # The project folder itself as the prefix: its step outputs are skipped below.
        if rel != "." and not rel.startswith(".." + os.sep) and rel != "..":
            skipped.add(Path(rel).as_posix())
    for name in files:
        parts = name.split("/")
        for i, part in enumerate(parts[:-1]):
            if part in _OUTPUT_DIRS:
                # A step output is the folder holding .marinbuild/; marinbuild-out is itself one.
                skipped.add("/".join(parts[: i if part == ".marinbuild" else i + 1]) or ".")
                break
    return skipped


def _under(name: str, folders: set[str]) -> bool:
    if "." in folders:
        return True
    parts = name.split("/")
    return any("/".join(parts[:i]) in folders for i in range(1, len(parts)))


class _HashingWriter(io.RawIOBase):
    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.sha = hashlib.sha256()

    def writable(self) -> bool:
        return True

    def write(self, b: bytes) -> int:  # type: ignore[override]
        self.sha.update(b)
        return self.raw.write(b)


def _tar_member(root: Path, name: str) -> tuple[tarfile.TarInfo, IO[bytes] | None]:
    path = root / name
    info = tarfile.TarInfo(name)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if path.is_symlink():
        info.type = tarfile.SYMTYPE
        info.linkname = os.readlink(path)
        info.mode = 0o777
        return info, None
    st = path.stat()
    info.size = st.st_size
    info.mode = 0o755 if st.st_mode & 0o111 else 0o644
    return info, path.open("rb")


def pack_workdir(root: str | Path, dest_dir: str | Path, exclude: Iterable[str | Path] = ()) -> PackedWorkdir:
    """Pack ``root`` (less ``exclude``, see :func:`list_project_files`) into ``dest_dir/<digest>.tar.gz``."""
    root = Path(root).resolve()
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    names = list_project_files(root, exclude)
    tmp = dest / f".pack-{secrets.token_hex(6)}.tar.gz"
    with tmp.open("wb") as f:
        hashing = _HashingWriter(f)
        # mtime=0 and no file name keep the gzip header, hence the digest, reproducible.
        with (
            gzip.GzipFile(filename="", mode="wb", fileobj=hashing, mtime=0) as gz,  # type: ignore[arg-type]
            tarfile.open(fileobj=gz, mode="w", format=tarfile.GNU_FORMAT) as tar,
        ):
            for name in names:
                info, data = _tar_member(root, name)
                try:
                    tar.addfile(info, data)
                finally:
                    if data is not None:
                        data.close()
    digest = hashing.sha.hexdigest()[:_DIGEST_LEN]
    final = dest / f"{digest}.tar.gz"
    tmp.replace(final)
    return PackedWorkdir(final, digest, len(names), final.stat().st_size)


def presence_check(remote_root: str, digest: str) -> str:
    """A shell command printing ``HAVE`` when ``remote_root/digest`` is complete on the host."""
    marker = shlex.quote(f"{remote_root}/{digest}/{COMPLETE_MARKER}")
    return f"if [ -f {marker} ]; then echo HAVE; fi"


def upload_and_unpack(conn: SshConnection, packed: PackedWorkdir, remote_root: str) -> str:
    """Send the tarball to the absolute ``remote_root`` and unpack it there; return its dir.

    Unpacking goes to a scratch directory renamed into place, so hosts that share a file
    system (or two runs racing) never see a half-written tree.
    """
    final = f"{remote_root}/{packed.digest}"
    upload = f"{remote_root}/.upload-{packed.digest}-{secrets.token_hex(4)}.tar.gz"
    conn.put_file(packed.path, upload)
    q = shlex.quote
    script = (
        f"set -e; up={q(upload)}; final={q(final)}; "
        f'tmp=$(mktemp -d {q(remote_root + "/.unpack-XXXXXX")}); '
        'tar -xzmf "$up" -C "$tmp"; rm -f "$up"; '
        f'touch "$tmp"/{COMPLETE_MARKER}; chmod 755 "$tmp"; '
        # When another writer got there first its copy is identical: keep it, drop ours.
        'mv -T "$tmp" "$final" 2>/dev/null || rm -rf "$tmp"; '
        f'test -f "$final"/{COMPLETE_MARKER}'
    )
    result = conn.run(script, timeout=300)
    if result.exit_code != 0:
        raise WorkdirSyncError(f"unpacking the workdir failed: {result.stderr.strip()[-300:]}")
    return final
