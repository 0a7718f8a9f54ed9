"""The resource-aware scheduler, through real runs: overlap from recorded timestamps."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from .helpers import marinbuild, plan_json, snapshot, status_of, wait_dead, write_marinfile

RECORDING = """
import json, os, time
from marinbuild import step, versioned, Cores, Memory, WTime, ResourceConfig

def work(cfg):
    start = time.time()
    time.sleep(cfg["sleep"])
    with open(cfg["log"], "a") as f:
        f.write(json.dumps({{"name": cfg["name"], "start": start, "end": time.time(),
                            "affinity": sorted(os.sched_getaffinity(0)),
                            "cores_env": os.environ.get("MARINBUILD_CORES"),
                            "omp": os.environ.get("OMP_NUM_THREADS")}}) + "\\n")

{steps}
"""


def events(project: Path) -> list[dict]:
    return [json.loads(line) for line in (project / "events.jsonl").read_text().splitlines()]


def max_overlap(evs: list[dict]) -> int:
    points = sorted([(e["start"], 1) for e in evs] + [(e["end"], -1) for e in evs], key=lambda p: (p[0], p[1]))
    best = cur = 0
    for _, d in points:
        cur += d
        best = max(best, cur)
    return best


def steps_text(specs: list[tuple[str, str, float]]) -> str:
    return "\n".join(
        f'step("{name}", work, {{"name": "{name}", "sleep": {sleep}, "log": "events.jsonl", "v": versioned(1)}}, resources={res})'
        for name, res, sleep in specs
    )


def test_cores_budget_caps_overlap(project):
    specs = [(f"s{i}", "Cores(1)", 1.0) for i in range(3)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    result = marinbuild("run", "--cores", "2", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    evs = events(project)
    assert len(evs) == 3
    assert max_overlap(evs) == 2


def test_request_beyond_capacity_is_refused_at_plan_time(project):
    specs = [("small", "Cores(1)", 0.0), ("big", "ResourceConfig.with_cpu(cpu=3, ram=None)", 0.0)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    before = snapshot(project)
    for command in ("run", "plan"):
        result = marinbuild(command, "--cores", "2", cwd=project)
        assert result.returncode == 2
        line = result.stderr.strip()
        assert "'big'" in line and "cpu=3" in line and len(line.splitlines()) == 1
    assert snapshot(project) == before


def test_memory_budget_decides_overlap(project):
    specs = [("m1", 'Cores(1) & Memory("6g")', 1.0), ("m2", 'Cores(1) & Memory("6g")', 1.0)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    assert marinbuild("run", "--cores", "2", "--mem", "8g", cwd=project).returncode == 0
    assert max_overlap(events(project)) == 1
    (project / "events.jsonl").unlink()
    assert marinbuild("run", "-F", "--cores", "2", "--mem", "16g", cwd=project).returncode == 0
    assert max_overlap(events(project)) == 2


def test_pinned_step_affinity_equals_its_cores(project):
    specs = [("pinned", "Cores(1)", 0.0)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    assert marinbuild("run", cwd=project).returncode == 0
    (ev,) = events(project)
    assert ev["affinity"] == [int(c) for c in ev["cores_env"].split(",")]
    assert len(ev["affinity"]) == 1 and ev["omp"] == "1"


def test_step_declaring_no_resources_counts_one_core_but_is_not_pinned(project):
    specs = [(f"d{i}", "None", 1.0) for i in range(3)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    result = marinbuild("run", "--cores", "2", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    evs = events(project)
    assert max_overlap(evs) == 2  # still one core each in the budget
    for ev in evs:
        assert ev["affinity"] == sorted(os.sched_getaffinity(0))
        assert ev["cores_env"] is None and ev["omp"] == "1"


def test_hard_wall_time_kills_step_and_children(project):
    write_marinfile(
        project,
        """
        from marinbuild import step, WTime, Cores
        step("slow", cmd="sleep 30 & echo $! > child.pid; wait", resources=Cores(1) & WTime(T=1))
        """,
    )
    started = time.time()
    result = marinbuild("run", cwd=project)
    elapsed = time.time() - started
    assert result.returncode == 1
    assert elapsed < 15  # the step sleeps 30 s; the limit cut it short
    row = plan_json(project)["slow"]
    rec = status_of(row["output_path"])
    assert rec["status"] == "FAILED" and rec["error"].startswith("timeout")
    assert rec["duration"] < 3.0  # killed within 2 s of its 1 s limit
    child = int((project / "child.pid").read_text())
    assert wait_dead(child)


def test_walltime_budget_skips_steps_whose_soft_limit_does_not_fit(project):
    write_marinfile(
        project,
        """
        from marinbuild import step, WTime, Cores
        step("long", cmd="echo ran > {output}/x", resources=Cores(1) & WTime(T=7200, softT=3600))
        step("short", cmd="echo ran > {output}/x", resources=Cores(1) & WTime(T=20, softT=10))
        """,
    )
    result = marinbuild("run", "--walltime", "0:10:00", cwd=project)
    assert result.returncode == 1
    rows = plan_json(project)
    assert status_of(rows["short"]["output_path"])["status"] == "SUCCESS"
    assert status_of(rows["long"]["output_path"]) is None
    assert "soft wall time 3600 s exceeds" in result.stdout


def test_plan_shows_resources(project):
    specs = [("m1", 'Cores(2) & Memory("1g")', 0.0)]
    write_marinfile(project, RECORDING.format(steps=steps_text(specs)))
    rows = plan_json(project)
    assert "Cores(2)" in rows["m1"]["resources"] and "Memory" in rows["m1"]["resources"]
