"""A hung step on a real Ray cluster: the driver sees its log and progress file stand still, cancels the task, retries."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .fixtures_ssh import live_processes_matching
from .helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

if TYPE_CHECKING:
    from .fixtures_ray import RayCluster

pytest_plugins = ["tests.fixtures_ray"]


def test_a_silent_ray_task_is_cancelled_as_a_hang_and_its_retry_succeeds(ray_cluster: RayCluster, project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import step
        step("wedged", cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ]; then exec sleep 3075; fi; '
                           'touch "$MARINBUILD_PROGRESS"; echo done > {output}/out', progress_timeout=2)
    """)
    result = marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project,
                        env={**ray_cluster.env, "MARINBUILD_RETRY_BASE_DELAY": "0.01"}, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project)["wedged"]["output_path"])
    record = json.loads((out / "attempts.json").read_text())
    assert [(a["class"], a["backend"]) for a in record["attempts"]] == [("HANG", "ray"), ("SUCCESS", "ray")]
    assert record["retries"]["hang"] == {"used": 1, "max": 2}
    assert (out / "out").read_text() == "done\n"
    status = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]  # the task's own marker
    assert status["status"] == "SUCCESS" and status["retries"]["hang"] == {"used": 1, "max": 2}
    deadline = time.monotonic() + 60
    while live_processes_matching("sleep 3075") and time.monotonic() < deadline:
        time.sleep(0.1)  # Ray reaps a cancelled worker's group on its own time
    assert live_processes_matching("sleep 3075") == []


def test_a_task_queued_for_a_node_longer_than_its_progress_timeout_is_no_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # One unit of "special" in the cluster: the second step waits in Ray's queue while the
    # first runs, well past its progress timeout, before it can start at all.
    write_marinfile(project, """
        import time
        from marinbuild import step
        from marinbuild.resources import Custom
        for name in ("a", "b"):
            step(name, cmd='echo start $(date +%s.%N) > {output}/t; '
                           'for i in 1 2 3 4 5 6 7 8 9 10 11 12; do touch "$MARINBUILD_PROGRESS"; sleep 0.3; done; '
                           'echo end $(date +%s.%N) >> {output}/t',
                 resources=Custom("special", 1), progress_timeout=1.5)
    """)
    result = marinbuild("run", "-j", "2", "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project,
                        env={**ray_cluster.env, "MARINBUILD_RETRY_BASE_DELAY": "0.01"}, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    plan = plan_json(project)
    spans = []
    for name in ("a", "b"):
        out = Path(plan[name]["output_path"])
        record = json.loads((out / "attempts.json").read_text())
        assert [a["class"] for a in record["attempts"]] == ["SUCCESS"], (name, record)
        times = dict(line.split() for line in (out / "t").read_text().splitlines())
        spans.append((float(times["start"]), float(times["end"])))
    first, second = sorted(spans)
    assert second[0] >= first[1] - 0.05  # it really waited: one "special" at a time
