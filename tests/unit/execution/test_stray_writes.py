"""Unit tests of marinbuild.execution.stray_writes on a real local prefix."""

from __future__ import annotations

import os
from pathlib import Path

from marinbuild.execution import stray_writes
from marinbuild.execution.stray_writes import describe, found_since, layout_of, take_snapshot
from marinbuild.store.storage import Storage


def _prefix(tmp_path: Path) -> tuple[Storage, str, str, str]:
    prefix = tmp_path / "out"
    dep, mine = prefix / "data-1f0e2a9c5d7b3e41", prefix / "train" / "a-9c0e2a9c5d7b3e41"
    (dep / ".marinbuild").mkdir(parents=True)
    (dep / "rows.txt").write_text("1\n")
    mine.mkdir(parents=True)
    return Storage.for_prefix(str(prefix)), str(prefix), str(dep), str(mine)


def _found(storage, prefix, dep, mine, before, outputs=()):
    after = take_snapshot(storage, prefix, mine, [dep])
    return found_since(before, after, layout_of({dep: "data", mine: "train/a", **dict.fromkeys(outputs, "x")}, prefix))


def test_nothing_is_found_when_the_step_kept_to_its_output(tmp_path: Path) -> None:
    storage, prefix, dep, mine = _prefix(tmp_path)
    before = take_snapshot(storage, prefix, mine, [dep])
    Path(mine, "model.bin").write_text("x")
    Path(dep, ".marinbuild", "lease").write_text("markers are marinbuild's")
    other = os.path.join(prefix, "eval-0000000000000000")
    os.mkdir(other)  # another step's output, made meanwhile
    assert _found(storage, prefix, dep, mine, before, [other]) == []


def test_a_file_added_or_changed_in_a_dependency_or_beside_the_outputs_is_found(tmp_path: Path) -> None:
    storage, prefix, dep, mine = _prefix(tmp_path)
    before = take_snapshot(storage, prefix, mine, [dep])
    Path(dep, "cache.bin").write_text("x")
    Path(dep, "rows.txt").write_text("1\n2\n")
    Path(prefix, "stray.txt").write_text("x")
    Path(prefix, "train", "notes.md").write_text("x")
    found = _found(storage, prefix, dep, mine, before)
    assert found == ["the output of its dependency data: cache.bin, rows.txt", "the prefix: stray.txt",
                     f"{prefix}/train: notes.md"]
    assert describe("a", found[:1]) == "a wrote outside its output: into the output of its dependency data: cache.bin, rows.txt"


def test_a_folder_with_too_many_entries_is_not_listed(tmp_path: Path, monkeypatch) -> None:
    storage, prefix, dep, mine = _prefix(tmp_path)
    monkeypatch.setattr(stray_writes, "LISTED_AT_MOST", 1)
    before = take_snapshot(storage, prefix, mine, [dep])
    assert before is not None and before.beside[prefix][1] is None
    Path(prefix, "stray.txt").write_text("x")
    assert _found(storage, prefix, dep, mine, before) == []


def test_a_remote_prefix_is_not_watched() -> None:
    storage = Storage.for_prefix("memory://stray-writes-test")
    assert take_snapshot(storage, "memory://stray-writes-test", "memory://stray-writes-test/a-1", []) is None


def test_a_folder_the_runner_makes_is_learned_without_listing_but_a_stray_before_it_still_shows(
    tmp_path: Path, monkeypatch
) -> None:
    storage, prefix, dep, mine = _prefix(tmp_path)
    seen: dict = {}
    before = take_snapshot(storage, prefix, mine, [dep], seen)
    listed: list[str] = []
    real_names = stray_writes._names
    monkeypatch.setattr(stray_writes, "_names", lambda folder: listed.append(folder) or real_names(folder))
    nxt = os.path.join(prefix, "eval-0000000000000000")
    assert stray_writes.made_here(seen, nxt, lambda: os.mkdir(nxt) or "made") == "made"
    again = take_snapshot(storage, prefix, mine, [dep], seen)
    assert listed == [] and again is not None and os.path.basename(nxt) in (again.beside[prefix][1] or ())
    # A stray made after the last look and before the runner's folder: the parent is listed again.
    Path(prefix, "stray.txt").write_text("x")
    later = os.path.join(prefix, "test-0000000000000000")
    stray_writes.made_here(seen, later, lambda: os.mkdir(later))
    assert _found(storage, prefix, dep, mine, before, [nxt, later]) == ["the prefix: stray.txt"]
    listed.clear()
    after = take_snapshot(storage, prefix, mine, [dep], seen)
    assert listed == [prefix] and after is not None and "stray.txt" in (after.beside[prefix][1] or ())


def test_a_folder_grown_past_the_listing_limit_by_the_runner_is_no_longer_watched(tmp_path: Path, monkeypatch) -> None:
    storage, prefix, dep, mine = _prefix(tmp_path)
    seen: dict = {}
    take_snapshot(storage, prefix, mine, [dep], seen)
    monkeypatch.setattr(stray_writes, "LISTED_AT_MOST", len(os.listdir(prefix)) + 1)
    for n in range(2):
        made = os.path.join(prefix, f"s{n}-0000000000000000")
        stray_writes.made_here(seen, made, lambda made=made: os.mkdir(made))
    assert seen[prefix][1] is None  # as a listing of that many names would say
