"""``--backend slurm`` under fire, on a real two-node Slurm (tests/fixtures_slurm.py): runners killed
at awkward moments, two runners on one prefix, sbatch refusing what it is given or the controller
away, a job held or cancelled by hand, a process of a two-node step failing.

Whether a step ran twice at once is read from the timestamps the step itself records.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .fixtures_slurm import SlurmCluster, _wait
from .helpers import plan_json
from .test_slurm import _ledger, _project, _run, _start, _wait_state

pytest_plugins = ["tests.fixtures_slurm"]

STUBBORN = """
from marinbuild import step, ResourceConfig
# Ignores SIGTERM: it stops only at Slurm's SIGKILL, KillWait after a scancel.
step("tick", cmd='trap "" TERM; n=0; while [ $n -lt $(( MARINBUILD_ATTEMPT == 1 ? 300 : 3 )) ]; do '
                 'echo $(date +%s.%N) $SLURM_JOB_ID >> {ticks}; sleep 0.1; n=$((n+1)); done',
     resources=ResourceConfig.with_cpu(1, ram=None))
"""


def _spans(ticks: Path) -> dict[int, tuple[float, float]]:
    """Each job's first and last tick."""
    spans: dict[int, tuple[float, float]] = {}
    for line in ticks.read_text().splitlines():
        at, job = float(line.split()[0]), int(line.split()[1])
        first, last = spans.get(job, (at, at))
        spans[job] = (min(first, at), max(last, at))
    return spans


def test_the_next_run_starts_a_step_only_once_the_killed_runners_job_has_stopped(
        project: Path, slurm_cluster: SlurmCluster) -> None:
    ticks = project / "ticks.txt"
    _project(project, STUBBORN.replace("{ticks}", str(ticks)))
    out = plan_json(project)["tick"]["output_path"]
    runner = _start(project, slurm_cluster)
    old = _wait_state(out, "RUNNING")["job_id"]
    _wait(lambda: ticks.exists(), 30, "the first tick")
    runner.kill()
    runner.wait(timeout=30)
    again = _run(project, slurm_cluster)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"cancelled Slurm job {old}" in again.stdout + again.stderr
    spans = _spans(ticks)
    new = _ledger(out)["attempts"][-1]["slurm_job"]
    assert set(spans) == {old, new} and spans[old][1] < spans[new][0], spans  # never both at once


def test_sbatch_refusing_its_arguments_fails_the_step_at_once_in_one_line(project: Path, slurm_cluster: SlurmCluster) -> None:
    for name, table, said in (("a", 'extra = ["--frobnicate"]', "unrecognized option '--frobnicate'"),
                              ("b", 'partition = "nowhere"', "Invalid partition name specified")):
        _project(project, f'from marinbuild import step\nstep("{name}", cmd="true")\n',
                 f"[slurm]\npoll_interval = 0.3\n{table}\n")
        result = _run(project, slurm_cluster, "--max-retries-failure", "3")
        assert result.returncode == 1 and "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
        attempts = _ledger(plan_json(project)[name]["output_path"])["attempts"]
        assert [a["class"] for a in attempts] == ["FAILED"] and said in attempts[0]["message"], attempts
        assert "Try \"sbatch --help\"" not in result.stdout + result.stderr


def test_a_controller_away_is_infrastructure_trouble_retried_on_its_budget(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, 'from marinbuild import step\nstep("s", cmd="true")\n')
    pid = int((slurm_cluster.folder / "slurmctld.pid").read_text())
    subprocess.run(["kill", str(pid)], check=True)
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 30, "slurmctld gone")
    try:
        result = _run(project, slurm_cluster)
    finally:
        subprocess.run(["slurmctld", "-i"], env=slurm_cluster.env, check=True, timeout=60)
        _wait(lambda: slurm_cluster.node_state("n1") in ("idle", "mixed"), 60, "the controller back")
    assert result.returncode == 1, result.stdout + result.stderr
    attempts = _ledger(plan_json(project)["s"]["output_path"])["attempts"]
    assert [a["class"] for a in attempts] == ["INFRA"] * 3, attempts  # the infra budget: 2 retries
    assert "Unable to contact slurm controller" in attempts[0]["message"]
