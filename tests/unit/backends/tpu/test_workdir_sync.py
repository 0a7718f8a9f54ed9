"""Unit tests of marinbuild.backends.tpu.workdir_sync: the project packed by content, and unpacked on a host."""

from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from marinbuild.backends.tpu.cluster import SshSettings
from marinbuild.backends.tpu.ssh import SshConnection, resolve_target
from marinbuild.backends.tpu.workdir_sync import (
    COMPLETE_MARKER,
    list_project_files,
    pack_workdir,
    presence_check,
    upload_and_unpack,
)
from tests.fixtures_ssh import FakeFleet


@pytest.fixture
def project(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    for rel in ("Marinfile.py", "pkg/mod.py", "pkg/__pycache__/mod.pyc", ".venv/bin/python", "marinbuild-out/s-1/x",
                "data/step-0123/.marinbuild/status", "data/step-0123/out.bin", "data/keep.txt", "prefix/a"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(rel)
    return root


def test_a_plain_folder_less_outputs_caches_and_the_prefix(project: Path) -> None:
    assert list_project_files(project, exclude=[project / "prefix"]) == ["Marinfile.py", "data/keep.txt", "pkg/mod.py"]


def test_a_git_work_tree_honours_gitignore(project: Path) -> None:
    subprocess.run(["git", "init", "-q", str(project)], check=True)
    (project / ".gitignore").write_text("data/keep.txt\n.venv/\n__pycache__/\n")
    assert list_project_files(project) == [".gitignore", "Marinfile.py", "pkg/mod.py", "prefix/a"]


def test_the_digest_follows_content_not_times(project: Path, tmp_path: Path) -> None:
    first = pack_workdir(project, tmp_path / "packs")
    os.utime(project / "Marinfile.py", (1, 1))
    again = pack_workdir(project, tmp_path / "packs")
    assert again.digest == first.digest and again.file_count == 4 and again.path.name == f"{first.digest}.tar.gz"
    (project / "Marinfile.py").write_text("changed")
    assert pack_workdir(project, tmp_path / "packs").digest != first.digest
    with tarfile.open(first.path) as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == ["Marinfile.py", "data/keep.txt", "pkg/mod.py", "prefix/a"]
    assert {(m.mtime, m.uid, m.uname) for m in members} == {(0, 0, "")}


def test_presence_check_is_a_shell_test(tmp_path: Path) -> None:
    def ask() -> str:
        return subprocess.run(["/bin/sh", "-c", presence_check(str(tmp_path / "r oot"), "abc")],
                              capture_output=True, text=True, check=True).stdout

    assert ask() == ""
    (tmp_path / "r oot" / "abc").mkdir(parents=True)
    (tmp_path / "r oot" / "abc" / COMPLETE_MARKER).write_text("")
    assert ask() == "HAVE\n"


def test_upload_and_unpack_on_a_real_host(fleet: FakeFleet, project: Path, tmp_path: Path) -> None:
    host = fleet.hosts[0]
    packed = pack_workdir(project, tmp_path / "packs")
    settings = SshSettings(user="root", identity_file=str(fleet.client_key), known_hosts=str(fleet.known_hosts),
                           ssh_config=None)
    remote_root = f"{host.home}/work-{tmp_path.name}"
    with SshConnection.connect(resolve_target(host.entry, settings)) as conn:
        conn.run(f"mkdir -p {remote_root}")
        final = upload_and_unpack(conn, packed, remote_root)
        assert final == f"{remote_root}/{packed.digest}"
        assert conn.run(presence_check(remote_root, packed.digest)).stdout == "HAVE\n"
        assert conn.run(f"cat {final}/pkg/mod.py").stdout == "pkg/mod.py"
        assert upload_and_unpack(conn, packed, remote_root) == final  # a second copy is dropped, not mixed in
        assert conn.run(f"ls -A {remote_root}").stdout.split() == [packed.digest]
