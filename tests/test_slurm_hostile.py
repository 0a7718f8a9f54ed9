"""``--backend slurm`` under fire, on a real two-node Slurm (tests/fixtures_slurm.py): runners killed
at awkward moments, two runners on one prefix, sbatch refusing what it is given or the controller
away, a job held or cancelled by hand, a process of a two-node step failing.

Whether a step ran twice at once is read from the timestamps the step itself records.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .fixtures_slurm import SlurmCluster, _wait
from .helpers import cli_env, marinbuild, plan_json
from .test_slurm_jobs import _env, _ledger, _marker, _project, _run, _start, _wait_state

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
    # The run's Slurm commands give up on the controller after MessageTimeout less a second:
    # its own slurm.conf says 2 s (the cluster's daemons keep 5).
    client = project / "slurm.conf"
    client.write_text(slurm_cluster.conf.read_text().replace("MessageTimeout=5", "MessageTimeout=2"))
    assert "MessageTimeout=2" in client.read_text()
    pid = int((slurm_cluster.folder / "slurmctld.pid").read_text())
    subprocess.run(["kill", str(pid)], check=True)
    _wait(lambda: not Path(f"/proc/{pid}").exists(), 30, "slurmctld gone")
    try:
        result = _run(project, slurm_cluster, SLURM_CONF=str(client))
    finally:
        subprocess.run(["slurmctld", "-i"], env=slurm_cluster.env, check=True, timeout=60)
        _wait(lambda: slurm_cluster.node_state("n1") in ("idle", "mixed"), 60, "the controller back")
    assert result.returncode == 1, result.stdout + result.stderr
    attempts = _ledger(plan_json(project)["s"]["output_path"])["attempts"]
    assert [a["class"] for a in attempts] == ["INFRA"] * 3, attempts  # the infra budget: 2 retries
    assert "Unable to contact slurm controller" in attempts[0]["message"]


def test_a_two_node_step_whose_second_process_fails_ends_whole_and_names_that_process(
        project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
from marinbuild import step, ResourceConfig
# Process 1 fails only once process 0 has written its file: srun ends the whole step at the first
# failure, and a process 0 not yet started would otherwise never write one.
step("pair", cmd='env | grep -E "^(MARINBUILD|MEGASCALE)_" > {output}/.env-$MARINBUILD_PROCESS_ID; '
                 'mv {output}/.env-$MARINBUILD_PROCESS_ID {output}/env-$MARINBUILD_PROCESS_ID.txt; '
                 'if [ "$MARINBUILD_PROCESS_ID" = 1 ]; then '
                 'for i in $(seq 600); do [ -e {output}/env-0.txt ] && break; sleep 0.1; done; exit 7; fi; '
                 'sleep 120',
     resources=ResourceConfig.with_cpu(1, ram=None, replicas=2))
""")
    result = _run(project, slurm_cluster, "--max-retries-failure", "0", MARINBUILD_PROCESS_ID="5", MEGASCALE_PORT="1")
    assert result.returncode == 1, result.stdout + result.stderr
    out = plan_json(project)["pair"]["output_path"]
    [attempt] = _ledger(out)["attempts"]
    assert attempt["class"] == "FAILED" and attempt["slurm_state"] == "FAILED" and attempt["exit_code"] == 7, attempt
    assert attempt["message"].startswith("process 1 on n") and attempt["message"].endswith(": exit status 7"), attempt
    for rank in (0, 1):
        env = dict(line.split("=", 1) for line in Path(out, f"env-{rank}.txt").read_text().splitlines())
        assert env["MARINBUILD_PROCESS_ID"] == str(rank) and env["MARINBUILD_NUM_PROCESSES"] == "2", env
        assert env["MARINBUILD_OUTPUT"] == out and not [k for k in env if k.startswith("MEGASCALE_")], env
    assert not [j for j in slurm_cluster.jobs().values() if j["state"] in ("RUNNING", "COMPLETING")]


def test_a_held_job_says_why_it_waits_and_runs_once_released(project: Path, slurm_cluster: SlurmCluster) -> None:
    blocker = slurm_cluster.run("sbatch", "--parsable", "--nodes=2", "--cpus-per-task=2", "--mem=100M",
                                "--wrap", "sleep 300").strip()
    try:
        _project(project, 'from marinbuild import step\nstep("s", cmd="echo ran")\n')
        out = plan_json(project)["s"]["output_path"]
        runner = _start(project, slurm_cluster)
        try:
            job = _wait_state(out, "PENDING")["job_id"]
            slurm_cluster.run("scontrol", "hold", str(job))
            slurm_cluster.run("scancel", blocker)
            _wait(lambda: (_marker(out) or {}).get("reason") == "JobHeldAdmin", 30, "the hold seen")
            shown = marinbuild("status", cwd=project, env=_env(slurm_cluster))
            assert f"waiting in Slurm: JobHeldAdmin (job {job})" in shown.stdout, shown.stdout
            slurm_cluster.run("scontrol", "release", str(job))
            text, _ = runner.communicate(timeout=60)
        finally:
            runner.kill()
    finally:
        slurm_cluster.run("scancel", blocker, check=False)
    assert runner.returncode == 0, text
    assert f"[s] marinbuild: Slurm job {job} pending: JobHeldAdmin" in text and "[s] ran" in text


def test_a_node_whose_slurmd_dies_under_a_running_step_stops_it_before_the_retry(
        project: Path, slurm_cluster: SlurmCluster) -> None:
    """Slurm ends the job NODE_FAIL, but the node itself lives on and so does the step there."""
    ticks = project / "ticks.txt"
    _project(project, STUBBORN.replace("{ticks}", str(ticks)).replace("with_cpu(1", "with_cpu(2"))
    out = plan_json(project)["tick"]["output_path"]
    runner = _start(project, slurm_cluster, "--lease-heartbeat", "1", "--lease-expiry", "4")
    node = None
    try:
        seen = _wait_state(out, "RUNNING")
        node = seen["nodes"]
        _wait(lambda: ticks.exists(), 30, "the first tick")
        slurm_cluster.kill_node(node)  # its slurmd only: the step's processes go on
        text, _ = runner.communicate(timeout=120)
    finally:
        runner.kill()
        if node is not None:
            slurm_cluster.start_node(node)
    assert runner.returncode == 0, text
    attempts = _ledger(out)["attempts"]
    assert [(a["class"], a["slurm_state"]) for a in attempts] == [("PREEMPTED", "NODE_FAIL"), ("SUCCESS", "COMPLETED")]
    spans = _spans(ticks)
    first, second = attempts[0]["slurm_job"], attempts[1]["slurm_job"]
    assert set(spans) == {first, second} and spans[first][1] < spans[second][0], spans  # never both at once
    [exit_file] = [f for f in Path(out).parent.joinpath(".marinbuild", "slurm").rglob("exit-0.json")
                   if f.parent.name.endswith("-1")]
    assert json.loads(exit_file.read_text())["error"].startswith("stopped by its runner: Slurm lost node")


def test_a_jobs_folder_tampered_with_leaves_the_poller_following_every_job(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
from marinbuild import step
step("s", cmd="sleep 3; echo finished")
""")
    out = plan_json(project)["s"]["output_path"]
    runner = _start(project, slurm_cluster)
    try:
        _wait_state(out, "RUNNING")
        jobs = Path(out).parent / ".marinbuild" / "slurm"
        _wait(lambda: any(jobs.rglob("node_00.log")), 30, "the node's log")
        log = next(jobs.rglob("node_00.log"))
        log.unlink()
        log.mkdir()  # unreadable as a file
        text, _ = runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert runner.returncode == 0 and "[s] finished" in text and "Traceback" not in text, text


def test_a_runner_taking_a_step_over_from_a_killed_one_first_stops_its_job(project: Path, slurm_cluster: SlurmCluster) -> None:
    ticks = project / "ticks.txt"
    _project(project, STUBBORN.replace("{ticks}", str(ticks)))
    out = plan_json(project)["tick"]["output_path"]
    first = _start(project, slurm_cluster)
    old = _wait_state(out, "RUNNING")["job_id"]
    _wait(lambda: ticks.exists(), 30, "the first tick")
    said = project / "second.txt"
    with said.open("w") as sink:  # waits on the lease, started while the first runner lived
        second = subprocess.Popen([sys.executable, "-m", "marinbuild", "run", "--backend", "slurm", "--cluster", "cluster.toml"],
                                  cwd=project, env=cli_env(_env(slurm_cluster)), stdout=sink, stderr=subprocess.STDOUT)
    try:
        _wait(lambda: "leased by" in said.read_text(), 60, "the second runner waiting on the lease")
        first.kill()
        first.wait(timeout=30)
        assert second.wait(timeout=120) == 0, said.read_text()
    finally:
        first.kill()
        second.kill()
    assert f"cancelled Slurm job {old} (mb:tick:1) its earlier runner left" in said.read_text()
    spans = _spans(ticks)
    new = _ledger(out)["attempts"][-1]["slurm_job"]
    assert set(spans) == {old, new} and spans[old][1] < spans[new][0], spans  # never both at once
