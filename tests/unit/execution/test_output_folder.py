"""Unit tests of marinbuild.execution.output_folder: a step's output folder made ready, on a local store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from marinbuild.errors import StorageError
from marinbuild.execution.output_folder import clear_output, link_refusal, ready_output_folder
from marinbuild.store.markers import RUNNING, read_status
from marinbuild.store.storage import Storage
from tests.unit.execution.two_steps import context, succeed, two_steps


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def test_a_status_folder_fails_with_one_line(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    (Path(node.output_path) / ".marinbuild" / "status").mkdir(parents=True)
    with pytest.raises(StorageError, match="is a folder, not a status file"):
        ready_output_folder(context(storage, graph, tmp_path), node)


def test_a_fresh_step_gets_an_empty_folder_and_no_note(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    assert ready_output_folder(context(storage, graph, tmp_path), node) == (None, [])
    assert Path(node.output_path).is_dir()


def test_a_step_starting_over_has_its_earlier_output_set_aside(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    succeed(storage, graph, "a")
    (Path(node.output_path) / "ckpt").write_text("old")
    ctx = context(storage, graph, tmp_path, start_over=frozenset({node.output_path}))
    note, earlier = ready_output_folder(ctx, node)
    assert len(earlier) == 1 and note is not None and earlier[0] in note
    assert not (Path(node.output_path) / "ckpt").exists()
    assert (Path(earlier[0]) / "ckpt").read_text() == "old", "set aside, never deleted before a success"
    status = read_status(storage, node.output_path)
    assert status is not None and status.status == RUNNING and status.starting_over is True


def test_a_step_resuming_over_partial_output_says_so(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    Path(node.output_path).mkdir(parents=True)
    (Path(node.output_path) / "part").write_text("half")
    ctx = context(storage, graph, tmp_path, resuming={node.output_path: "failed"})
    note, earlier = ready_output_folder(ctx, node)
    assert note is not None and "resumes from partial output of an earlier failed run" in note and earlier == []
    assert (Path(node.output_path) / "part").read_text() == "half"


def test_a_symlinked_output_folder_is_refused_before_anything_is_written(storage: Storage, tmp_path: Path) -> None:
    graph = two_steps(storage)
    node = graph.nodes["a"]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    Path(node.output_path).parent.mkdir(parents=True, exist_ok=True)
    os.symlink(elsewhere, node.output_path)
    refusal = link_refusal(context(storage, graph, tmp_path), node)
    assert refusal is not None and refusal.startswith(f"refusing to write under {node.output_path}")
    assert link_refusal(context(storage, graph, tmp_path), graph.nodes["b"]) is None


def test_clear_output_keeps_only_the_lease(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "s-1")
    for rel in ("data/x", "y", ".marinbuild/status", ".marinbuild/lease", ".marinbuild/info.json"):
        storage.write_atomic(Storage.join(out, rel), "z")
    clear_output(storage, out)
    left = sorted(str(p.relative_to(out)) for p in Path(out).rglob("*"))
    assert left == [".marinbuild", ".marinbuild/lease"]
