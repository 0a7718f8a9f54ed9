"""A hung step on a real Ray cluster: the driver sees its log and progress file stand still, cancels the task, retries."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

from .fixtures_ssh import live_processes_matching
from .helpers import marinbuild, plan_json, write_marinfile

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
    deadline = time.monotonic() + 60
    while live_processes_matching("sleep 3075") and time.monotonic() < deadline:
        time.sleep(0.1)  # Ray reaps a cancelled worker's group on its own time
    assert live_processes_matching("sleep 3075") == []
