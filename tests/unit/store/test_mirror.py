"""Unit tests of marinbuild.store.mirror: inputs from another store copied once under the prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.steps import Step, find_mirrored, mirrored, versioned
from marinbuild.store.mirror import (
    DEFAULT_BUDGET_GB,
    MirrorError,
    budget_gb,
    ensure_mirrored,
    mirror_target,
)
from marinbuild.store.storage import Storage


@pytest.fixture
def source(tmp_path: Path) -> Path:
    folder = tmp_path / "src" / "data"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.txt").write_text("A")
    (folder / "sub" / "b.txt").write_text("BB")
    return folder


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def test_target_is_readable_and_unique_per_source() -> None:
    a = mirror_target("/p", "gs://bucket/x/vocab.json")
    assert a.startswith("/p/mirror/bucket_x_vocab.json-")
    assert a != mirror_target("/p", "gs://bucket/x_vocab.json")  # same readable part, different hash
    assert mirror_target("/p", "gs://") .startswith("/p/mirror/root-")


def test_find_mirrored_in_order_without_repeats_and_inside_versioned() -> None:
    m1, m2 = mirrored("gs://a/1"), mirrored("gs://a/2")
    other = Step("other", config={"m": mirrored("gs://elsewhere")})
    config = {"x": m1, "y": [m2, m1], "v": versioned({"z": mirrored("gs://a/3")}), "dep": other}
    assert [m.source for m in find_mirrored(config)] == ["gs://a/1", "gs://a/2", "gs://a/3"]


def test_budget_from_call_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MARIN_MIRROR_BUDGET_GB", raising=False)
    assert budget_gb(mirrored("x")) == DEFAULT_BUDGET_GB
    monkeypatch.setenv("MARIN_MIRROR_BUDGET_GB", "2.5")
    assert budget_gb(mirrored("x")) == 2.5
    assert budget_gb(mirrored("x", budget_gb=1)) == 1.0
    monkeypatch.setenv("MARIN_MIRROR_BUDGET_GB", "lots")
    with pytest.raises(MirrorError, match="must be a number of GB"):
        budget_gb(mirrored("x"))


def test_a_folder_is_copied_once_with_a_marker(source: Path, storage: Storage) -> None:
    m = mirrored(str(source))
    target = ensure_mirrored(m, storage)
    assert Path(target, "a.txt").read_text() == "A"
    assert Path(target, "sub", "b.txt").read_text() == "BB"
    marker = json.loads(Path(target + ".mirrored.json").read_text())
    assert (marker["bytes"], marker["files"], marker["source"]) == (3, 2, str(source))
    (source / "a.txt").write_text("changed")
    assert ensure_mirrored(m, storage) == target
    assert Path(target, "a.txt").read_text() == "A"  # a finished copy is used as is


def test_a_single_file_is_copied(source: Path, storage: Storage) -> None:
    target = ensure_mirrored(mirrored(str(source / "a.txt")), storage)
    assert Path(target).read_text() == "A"


def test_a_missing_source_is_one_clear_error(tmp_path: Path, storage: Storage) -> None:
    with pytest.raises(MirrorError, match="no such file or directory"):
        ensure_mirrored(mirrored(str(tmp_path / "nothing")), storage)


def test_over_budget_is_refused_and_nothing_copied(source: Path, storage: Storage) -> None:
    m = mirrored(str(source), budget_gb=1e-12)
    with pytest.raises(MirrorError, match="over the mirror budget"):
        ensure_mirrored(m, storage)
    assert not Path(mirror_target(storage.prefix, m.source)).exists()
