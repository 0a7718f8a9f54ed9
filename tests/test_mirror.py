"""``mirrored(path)``: inputs copied under the prefix before a step runs, within a budget."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild import mirrored, step, versioned
from marinbuild.errors import UserError
from marinbuild.graph import build_graph
from marinbuild.identity import identity_payload
from marinbuild.resolve import resolve_config
from marinbuild.steps import find_mirrored
from marinbuild.store.mirror import ensure_mirrored, mirror_target
from marinbuild.store.storage import Storage

from .helpers import marinbuild, status_of, write_marinfile

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
