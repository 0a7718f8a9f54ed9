"""Unit tests of marinbuild.cli.plan: the plan as JSON, as a graph, and --check."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from marinbuild.cli.plan import DagFormat, _estimate_json

MARINFILE = """
from marinbuild import step, versioned
a = step("a", cmd="echo 1 > {output}/x", config={"v": versioned(1)})
b = step("b", cmd="cat {a}/x > {output}/y", config={"a": a})
"""


def _plan(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marinbuild", "plan", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120)


def _project(tmp_path: Path) -> Path:
    (tmp_path / "Marinfile.py").write_text(textwrap.dedent(MARINFILE))
    return tmp_path


def test_json_rows_follow_the_plan_order_with_their_dependencies(tmp_path):
    done = _plan(_project(tmp_path), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["name"] for r in rows] == ["a", "b"]
    assert rows[1]["dependencies"] == ["a"] and rows[1]["action"] == "run" and rows[1]["estimate"] is None


def test_dag_formats_draw_the_edge(tmp_path):
    folder = _project(tmp_path)
    assert {f.value for f in DagFormat} == {"dot", "mermaid"}
    dot = _plan(folder, "--dag", "dot")
    assert dot.returncode == 0 and '"a" -> "b";' in dot.stdout
    mermaid = _plan(folder, "--dag", "MERMAID")
    assert mermaid.returncode == 0 and "s0 --> s1" in mermaid.stdout


def test_check_exits_1_when_anything_would_run_and_prints_nothing(tmp_path):
    done = _plan(_project(tmp_path), "--check")
    assert done.returncode == 1 and done.stdout == ""


def test_estimate_json_is_null_without_history():
    assert _estimate_json({}, "a") is None
    assert _estimate_json({"a": None}, "a") is None
