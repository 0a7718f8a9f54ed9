"""A Ray driver that stops renewing (suspended, cut off from its store) has its tasks killed
beside the work before another driver can take the step over."""

from __future__ import annotations

import signal
from pathlib import Path

from .helpers import alive, marinbuild, start_marinbuild, write_marinfile
from .test_never_twice import FAST
from .test_ray_cluster_runs import SLOW, events, ray_env, wait_for

pytest_plugins = ["tests.fixtures_ray"]


def test_a_stopped_ray_driver_has_its_task_killed_before_another_driver_takes_over(ray_cluster, project):
    write_marinfile(project, SLOW.format(root=str(project), version=7))
    env = ray_env(ray_cluster, **FAST)
    driver = start_marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project, env=env)
    try:
        worker = wait_for(lambda: events(project), what="the step to start")[0][1]
        driver.send_signal(signal.SIGSTOP)
        # Ray sees nothing wrong with a stopped driver; the task's lease watchdog does.
        wait_for(lambda: not alive(worker), timeout=60, what="the unrenewed task to be killed")
        assert Path(f"/proc/{driver.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T"
        (project / "release").touch()
        second = marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project,
                            env=env, timeout=180)
        assert second.returncode == 0, second.stdout + second.stderr
    finally:
        driver.send_signal(signal.SIGCONT)
        driver.kill()
        driver.communicate()
    seen = events(project)
    # The stopped driver's retries found its lease unrenewed and never started the step again.
    assert [kind for kind, _ in seen] == ["start", "start", "end"], seen
    assert seen[2][1] != worker
