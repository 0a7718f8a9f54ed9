"""Unit tests of marinbuild.store.aside: an output's earlier contents set aside, then dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.store.aside import asides, set_aside, step_entries
from marinbuild.store.storage import Storage


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    if request.param == "local":
        return Storage.for_prefix(str(tmp_path))
    return Storage.for_prefix(f"memory://aside-{tmp_path.name}")


def _write(storage: Storage, out: str, *names: str) -> None:
    for name in names:
        storage.write_atomic(Storage.join(out, name), name)


def test_the_steps_own_entries_move_aside_and_marinbuilds_records_stay(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "train-0123456789abcdef")
    _write(storage, out, "ckpt/step_400", "metrics.json", "logs/step.log", "attempts.json", ".marinbuild/status")
    moved = set_aside(storage, out)
    assert moved is not None and moved.startswith(Storage.join(out, ".marinbuild", "aside-"))
    assert sorted(storage.list_names(out)) == [".marinbuild", "attempts.json", "logs"]
    assert storage.read_text(Storage.join(moved, "ckpt", "step_400")) == "ckpt/step_400"
    assert storage.read_text(Storage.join(moved, "metrics.json")) == "metrics.json"
    assert asides(storage, out) == [moved]
    storage.remove(moved)  # as a success does (execution.attempt_commit)
    assert asides(storage, out) == [] and storage.read_text(Storage.join(out, ".marinbuild", "status")) is not None


def test_nothing_to_set_aside_makes_no_folder(storage: Storage) -> None:
    out = Storage.join(storage.prefix, "eval-0123456789abcdef")
    _write(storage, out, "logs/step.log")
    assert set_aside(storage, out) is None
    assert asides(storage, out) == []


def test_step_entries_leave_out_marinbuilds_records() -> None:
    assert step_entries(["logs", ".marinbuild", "attempts.json", "b", "a"]) == ["a", "b"]
