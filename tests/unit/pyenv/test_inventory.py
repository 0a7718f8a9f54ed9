"""Unit tests of marinbuild.pyenv.inventory: what the environment cache holds, and pruning it."""

from __future__ import annotations

import fcntl
import json
import os
import time
from pathlib import Path

from marinbuild.pyenv.builder import LAST_USE, MANIFEST, RUNNER_PTH
from marinbuild.pyenv.inventory import STALE_BUILD_S, cached_envs, prune


def _env(root: Path, key: str, requirements: list[str], last_use: float | None = None) -> Path:
    """A complete environment as the builder leaves one (manifest, interpreter, runner .pth)."""
    env = root / key
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").write_text("#!/bin/sh\n")
    (env / "bin" / "python").chmod(0o755)
    site = env / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / RUNNER_PTH).write_text("/x\n")
    (env / MANIFEST).write_text(json.dumps({"requirements": requirements, "python": "cpython-3.11.7", "created": 1.0}))
    if last_use is not None:
        (env / LAST_USE).write_text("")
        os.utime(env / LAST_USE, (last_use, last_use))
    return env


def test_cached_envs_most_recently_used_first(tmp_path: Path) -> None:
    _env(tmp_path, "old", ["a==1"], last_use=1000.0)
    _env(tmp_path, "new", ["b==2"], last_use=2000.0)
    _env(tmp_path, "never", [])
    (tmp_path / "broken").mkdir()  # no manifest: not an environment
    (tmp_path / ".tmp-x-1").mkdir()
    found = cached_envs(tmp_path)
    assert [e.key for e in found] == ["new", "old", "never"]
    assert found[0].requirements == ("b==2",) and found[0].python == "cpython-3.11.7" and found[0].size > 0
    assert found[2].last_use == 1.0  # the manifest's creation time when never used
    assert cached_envs(tmp_path / "absent") == []


def test_prune_keeps_what_is_asked_and_removes_the_rest(tmp_path: Path) -> None:
    keep, drop = _env(tmp_path, "keep", []), _env(tmp_path, "drop", [])
    assert prune({"keep"}, tmp_path, dry=True) == [drop] and drop.exists()
    assert prune({"keep"}, tmp_path) == [drop]
    assert keep.exists() and not drop.exists()
    assert not any(p.name.startswith(".tmp-drop") for p in tmp_path.iterdir())


def test_an_environment_being_built_is_left_alone(tmp_path: Path) -> None:
    busy = _env(tmp_path, "busy", [])
    fd = os.open(tmp_path / "busy.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        assert prune(set(), tmp_path) == [] and busy.exists()
    finally:
        os.close(fd)
    assert prune(set(), tmp_path) == [busy]


def test_only_stale_crashed_builds_are_removed(tmp_path: Path) -> None:
    fresh, stale = tmp_path / ".tmp-aaa-1", tmp_path / ".tmp-bbb-2"
    fresh.mkdir()
    stale.mkdir()
    old = time.time() - STALE_BUILD_S - 60
    os.utime(stale, (old, old))
    assert prune(set(), tmp_path) == [stale]
    assert fresh.exists() and not stale.exists()
