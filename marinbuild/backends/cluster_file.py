"""The cluster file: one TOML document, each kind of backend reading its own tables.

``--cluster FILE`` names it, else the Marinfile's ``DEFAULT_CLUSTER`` (relative to the
Marinfile). TPU slices read ``[[slices]]``, ``[ssh]``, ``[gcp]`` and a few keys; Slurm reads
``[slurm]``. A top-level key no kind reads is refused in one line naming the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from marinbuild.errors import ClusterConfigError

__all__ = ["cluster_path", "read_cluster_file", "read_toml"]


def cluster_path(workdir: str, default: object, path: str | None) -> str | None:
    """The cluster file a run uses: ``path``, else the Marinfile's ``DEFAULT_CLUSTER`` relative to ``workdir``."""
    if path:
        return path
    if not default:
        return None
    return os.path.join(workdir, str(default))


def read_cluster_file(path: str, known: Iterable[str]) -> dict[str, Any]:
    """The decoded cluster file at ``path``, refusing a top-level key outside ``known``."""
    data = read_toml(path)
    check_keys(data, str(Path(path).expanduser()), known)
    return data


def read_toml(path: str | Path) -> dict[str, Any]:
    """The TOML document at ``path``; every way it cannot be read is one ClusterConfigError line."""
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise ClusterConfigError(f"cannot read cluster file {str(p)!r}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClusterConfigError(f"{p}: not valid TOML: not UTF-8 (byte {e.start})") from None
    import tomllib  # only where a cluster file exists: its regexes cost a few ms of every command's start

    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ClusterConfigError(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise ClusterConfigError(f"{p}: not valid TOML: nested too deeply") from None


def check_keys(data: Mapping[str, Any], source: str, known: Iterable[str]) -> None:
    """Refuse a top-level key no kind of backend reads."""
    allowed = set(known)
    unknown = set(data) - allowed
    if unknown:
        raise ClusterConfigError(
            f"{source}: unknown top-level key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(allowed))})"
        )
