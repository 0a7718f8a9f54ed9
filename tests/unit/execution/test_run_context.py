"""Unit tests of marinbuild.execution.run_context: what every step's records in one run share."""

from __future__ import annotations

import getpass
import socket
import subprocess
from pathlib import Path

from marinbuild.execution.run_context import RunContext, runner_name
from marinbuild.store.lease import Owner
from marinbuild.store.storage import Storage


def _context(storage: Storage, workdir: Path) -> RunContext:
    return RunContext(storage=storage, workdir=str(workdir), marinfile=str(workdir / "Marinfile.py"),
                      outputs={"a": Storage.join(storage.prefix, "a-1")}, prefix=storage.prefix)


def test_the_provenance_names_the_commit_the_user_and_the_host(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git = ["git", "-c", "user.name=m", "-c", "user.email=m@example.com"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", "first"], cwd=repo, check=True)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()
    ctx = _context(Storage.for_prefix(str(tmp_path / "prefix")), repo)
    assert ctx.provenance == {"git_commit": head, "user": getpass.getuser(), "host": socket.gethostname(),
                              "marinfile": str(repo / "Marinfile.py")}
    assert ctx.provenance is ctx.provenance, "worked out once per run"


def test_outside_a_repository_there_is_no_commit(tmp_path: Path) -> None:
    ctx = _context(Storage.for_prefix(str(tmp_path / "prefix")), tmp_path)
    assert ctx.provenance["git_commit"] is None


def test_markers_name_this_runner_as_its_leases_do() -> None:
    assert runner_name() == str(Owner.current())


def test_the_layout_is_of_the_outputs_on_this_machine(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path / "prefix"))
    ctx = _context(storage, tmp_path)
    out = storage.local_file(Storage.join(storage.prefix, "a-1"))
    assert out is not None
    assert (ctx.layout.prefix, ctx.layout.outputs, dict(ctx.layout.names)) == (storage.local_file(storage.prefix),
                                                                              frozenset({out}), {out: "a"})
    assert ctx.layout is ctx.layout, "worked out once per run"
