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


RUN_ONLY = ("marinbuild.backends.base", "marinbuild.backends.slurm.settings", "marinbuild.execution.reporting",
            "marinbuild.execution.run_parameters", "marinbuild.execution.run_results", "marinbuild.execution.scheduler")
"""Modules of a run that a plan has no use for: each costs start-up time of every plan."""


def test_a_plan_loads_none_of_a_runs_machinery(tmp_path: Path) -> None:
    folder = _project(tmp_path)
    probe = ("import sys\nfrom marinbuild.cli.app import command_line\n"
             "try:\n    command_line(['plan'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
             f"print(sorted(m for m in {RUN_ONLY!r} if m in sys.modules))\n")
    done = subprocess.run([sys.executable, "-c", probe], cwd=folder, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert lines[0].startswith("step ") and lines[1].startswith("a ") and lines[-1] == "[]", done.stdout
