"""Unit tests of marinbuild.pyenv.builder: cache keys, readiness, and one real (empty) build."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from marinbuild.pyenv.builder import (
    CACHE_ENV,
    MANIFEST,
    cache_root,
    ensure,
    env_key,
    find_uv,
    interpreter_tag,
    is_ready,
    runner_site_dirs,
)


def test_cache_root_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "envs"))
    assert cache_root() == tmp_path / "envs"
    monkeypatch.delenv(CACHE_ENV)
    assert cache_root() == Path.home() / ".cache" / "marinbuild" / "envs"


def test_interpreter_tag_and_site_dirs() -> None:
    assert interpreter_tag() == f"{sys.implementation.name}-{sys.version_info[0]}.{sys.version_info[1]}.{sys.version_info[2]}"
    assert all(os.path.isdir(d) for d in runner_site_dirs())


def test_env_key_is_the_requirement_set_and_the_bytes_of_local_files(tmp_path: Path) -> None:
    assert env_key(["b>=1", "a==2"]) == env_key(["a==2", "b>=1", "a==2"])
    assert env_key(["a==2"]) != env_key(["a==3"])
    wheel = tmp_path / "tiny-1.0-py3-none-any.whl"
    wheel.write_bytes(b"one")
    ref = f"tiny @ file://{wheel}"
    before = env_key([ref])
    wheel.write_bytes(b"two")
    assert env_key([ref]) != before  # a rebuilt wheel of the same version is another environment
    assert len(before) == 16


def test_find_uv() -> None:
    assert os.access(find_uv(install=False), os.X_OK)


def test_a_folder_is_ready_only_when_complete(tmp_path: Path) -> None:
    env = tmp_path / "k"
    assert not is_ready(env)
    (env / "bin").mkdir(parents=True)
    (env / MANIFEST).write_text("{}")
    assert not is_ready(env)  # no interpreter
    (env / "bin" / "python").write_text("")
    (env / "bin" / "python").chmod(0o755)
    assert not is_ready(env)  # no .pth reaching the runner's packages


def test_an_empty_environment_is_built_once_and_reused(tmp_path: Path) -> None:
    built = ensure([], root=tmp_path)
    assert is_ready(built) and built.parent == tmp_path
    manifest = json.loads((built / MANIFEST).read_text())
    assert manifest["requirements"] == []
    mtime = (built / MANIFEST).stat().st_mtime_ns
    assert ensure([], root=tmp_path) == built
    assert (built / MANIFEST).stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [built.name]
