"""The markers' snapshot as users meet it: a no-op after it trusts what is unchanged, a marker
edited by hand after it still decides, and only ``run`` writes it.

See ``tests/unit/store/test_marker_snapshot.py`` for each way a marker can change under it.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from marinbuild.store.marker_snapshot import SETTLED_NS, SNAPSHOT_FILE

from .helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

TWO = """
from marinbuild import step
a = step("a", cmd="echo a > {output}/a.txt", config={"n": 1})
b = step("b", cmd="cat {inp}/a.txt > {output}/b.txt", config={"inp": a})
"""


def _markers(project: Path) -> dict[str, Path]:
    out = project / "marinbuild-out"
    return {p.name.rsplit("-", 1)[0]: p / ".marinbuild" / "status" for p in out.iterdir() if p.name != ".marinbuild"}


def _settle(markers: list[Path]) -> None:
    newest = max(m.stat().st_ctime_ns for m in markers)
    while time.time_ns() - SETTLED_NS <= newest:
        time.sleep(0.05)


def _ok(result) -> str:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_marker_edited_by_hand_after_the_snapshot_still_decides(project: Path) -> None:
    write_marinfile(project, TWO)
    _ok(marinbuild("run", cwd=project))
    markers = _markers(project)
    _settle(list(markers.values()))
    assert "nothing to do: 2 steps up to date" in _ok(marinbuild("run", cwd=project))
    snapshot = project / "marinbuild-out" / ".marinbuild" / SNAPSHOT_FILE
    assert snapshot.is_file()

    # Another identity, the same size, the mtime put back: only the change time tells.
    marker = markers["a"]
    record = json.loads(marker.read_text())
    before = marker.stat()
    other = "0" * 16 if record["identity"] != "0" * 16 else "1" * 16
    marker.write_text(marker.read_text().replace(record["identity"], other))
    os.utime(marker, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert marker.stat().st_size == before.st_size

    rows = plan_json(project)
    assert rows["a"]["action"] == "run", rows["a"]
    snapshot.unlink()
    assert plan_json(project) == rows  # what the markers alone decide
    text = _ok(marinbuild("run", cwd=project))
    assert "nothing to do" not in text
    assert json.loads(marker.read_text())["identity"] == record["identity"]


def test_only_run_writes_the_snapshot(project: Path) -> None:
    write_marinfile(project, TWO)
    _ok(marinbuild("run", cwd=project))
    markers = _markers(project)
    _settle(list(markers.values()))
    folder = project / "marinbuild-out" / ".marinbuild"
    (folder / SNAPSHOT_FILE).unlink(missing_ok=True)
    before = sorted(os.listdir(folder)) if folder.exists() else None
    for args in (("plan",), ("plan", "--json"), ("status",), ("why", "b"), ("run", "--dry")):
        _ok(marinbuild_in_process(*args, cwd=project))
        assert (sorted(os.listdir(folder)) if folder.exists() else None) == before, args
    _ok(marinbuild("run", cwd=project))
    assert (folder / SNAPSHOT_FILE).is_file()
