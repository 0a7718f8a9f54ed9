"""Unit tests of marinbuild.store.mirror: inputs from another store copied once under the prefix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild import mirrored, step, versioned
from marinbuild.errors import UserError
from marinbuild.graph import build_graph
from marinbuild.identity import identity_payload
from marinbuild.resolve import resolve_config
from marinbuild.steps import Step, find_mirrored
from marinbuild.store.mirror import (
    DEFAULT_BUDGET_GB,
    MirrorError,
    budget_gb,
    ensure_mirrored,
    mirror_target,
)
from marinbuild.store.storage import Storage
from tests.helpers import marinbuild, status_of, write_marinfile


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


# -- ``mirrored(path)``: inputs copied under the prefix before a step runs, within a budget.


MARINFILE = """
import os
from marinbuild import step, mirrored, this_output_path

def use(cfg):
    with open(os.path.join(cfg["data"], "part-0.txt")) as f:
        text = f.read()
    with open(os.path.join(cfg["out"], "seen.txt"), "w") as f:
        f.write(cfg["data"] + "\\n" + text)

step("use", use, {"data": mirrored(@SOURCE@@BUDGET@), "out": this_output_path()})
"""


def source_tree(root: Path) -> Path:
    src = root / "elsewhere" / "corpus"
    (src / "sub").mkdir(parents=True)
    (src / "part-0.txt").write_text("alpha\n")
    (src / "sub" / "part-1.txt").write_text("beta " * 1000)
    return src


def write(project: Path, source: str, budget: str = "") -> None:
    write_marinfile(project, MARINFILE.replace("@SOURCE@", repr(source)).replace("@BUDGET@", budget))


def test_a_mirrored_input_is_copied_under_the_prefix_once(project: Path) -> None:
    src = source_tree(project.parent)
    write(project, f"file://{src}")
    first = marinbuild("run", "-q", cwd=project)
    assert first.returncode == 0, first.stdout + first.stderr
    prefix = project / "marinbuild-out"
    copy = Path(mirror_target(str(prefix), f"file://{src}"))
    assert copy.parent == prefix / "mirror"
    assert (copy / "part-0.txt").read_text() == "alpha\n"
    assert (copy / "sub" / "part-1.txt").read_text() == "beta " * 1000
    marker = json.loads(Path(str(copy) + ".mirrored.json").read_text())
    assert marker["files"] == 2 and marker["bytes"] == 6 + 5000
    seen = next(prefix.glob("use-*")) / "seen.txt"
    assert seen.read_text() == f"{copy}\nalpha\n"

    # A complete copy is not copied again: a change at the source does not reach it.
    (src / "part-0.txt").write_text("changed\n")
    assert marinbuild("run", "-q", "--force", "use", cwd=project).returncode == 0
    assert seen.read_text() == f"{copy}\nalpha\n"


def test_over_budget_fails_the_step_with_one_line(project: Path) -> None:
    src = source_tree(project.parent)
    write(project, str(src), budget=", budget_gb=0.000001")
    result = marinbuild("run", cwd=project)
    assert result.returncode == 1
    assert "is over the mirror budget of 1e-06 GB" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr
    out = next((project / "marinbuild-out").glob("use-*"))
    record = status_of(str(out))
    assert record is not None and record["status"] == "FAILED" and "mirror budget" in record["error"]
    assert not (project / "marinbuild-out" / "mirror").exists()


def test_budget_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src = source_tree(tmp_path)
    storage = Storage.for_prefix(str(tmp_path / "out"))
    monkeypatch.setenv("MARIN_MIRROR_BUDGET_GB", "0.000001")
    with pytest.raises(UserError, match="over the mirror budget"):
        ensure_mirrored(mirrored(str(src)), storage)
    monkeypatch.setenv("MARIN_MIRROR_BUDGET_GB", "1")
    assert ensure_mirrored(mirrored(str(src)), storage) == mirror_target(storage.prefix, str(src))
    with pytest.raises(UserError, match="no such file"):
        ensure_mirrored(mirrored(str(tmp_path / "absent")), storage)


def test_identity_encodes_the_source_path_only_when_versioned() -> None:
    plain = identity_payload("s", {"data": mirrored("gs://a/b", budget_gb=1)}, {})
    assert plain["versioned"] == {}
    pinned = identity_payload("s", {"data": mirrored(versioned("gs://a/b"), budget_gb=1)}, {})
    assert pinned["versioned"] == {"data": {"__mirrored__": "gs://a/b"}}
    other_budget = identity_payload("s", {"data": mirrored(versioned("gs://a/b"), budget_gb=99)}, {})
    assert other_budget == pinned
    inside = identity_payload("s", {"data": versioned([mirrored("gs://a/b")])}, {})
    assert inside["versioned"] == {"data": [{"__mirrored__": "gs://a/b"}]}
    graph_a = build_graph([step("s", cmd="true", config={"d": mirrored(versioned("gs://a/b"))})], "/p")
    graph_b = build_graph([step("s", cmd="true", config={"d": mirrored(versioned("gs://a/c"))})], "/p")
    assert graph_a.nodes["s"].identity != graph_b.nodes["s"].identity


def test_placeholders_are_found_and_resolved() -> None:
    m = mirrored("gs://a/b")
    config = {"x": [m, {"y": versioned(m)}], "z": 3}
    assert find_mirrored(config) == [m]
    assert resolve_config(config, "/out", {}, {"gs://a/b": "/p/mirror/b"}) == {
        "x": ["/p/mirror/b", {"y": "/p/mirror/b"}], "z": 3,
    }
    with pytest.raises(UserError):
        mirrored(3)  # type: ignore[arg-type]


def test_finding_mirrored_inputs_does_not_walk_other_steps_configs():
    # Layered diamonds 40 deep: walking into referenced steps would visit 2**40 paths.
    layer = [step(f"d0_{i}", cmd="true") for i in range(2)]
    for depth in range(1, 40):
        layer = [step(f"d{depth}_{i}", cmd="true", config={"a": layer[0], "b": layer[1]}) for i in range(2)]
    top = {"deps": layer, "data": mirrored("memory://src/x")}
    assert [m.source for m in find_mirrored(top)] == ["memory://src/x"]
