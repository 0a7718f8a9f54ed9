"""``marinbuild run --backend slurm`` on a real two-node Slurm (tests/fixtures_slurm.py).

Shell and function steps as jobs, a two-node step whose processes meet through JAX, job states
read as causes with their budgets (a preemption from a higher-priority partition, a lost node,
a wall time spent), Ctrl-C cancelling the run's jobs, a SIGKILLed runner's job found and cancelled
by the next run and by ``slurm list`` / ``slurm down``, a pending job's reason in ``status``, and
an unknown ``[slurm]`` key refused.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from .fixtures_slurm import SlurmCluster, _wait
from .helpers import cli_env, marinbuild, plan_json, write_marinfile

pytest_plugins = ["tests.fixtures_slurm"]

CLUSTER_FILE = '[slurm]\npoll_interval = 0.3\npartition = "main"\n'


def _env(cluster: SlurmCluster, **more: str) -> dict[str, str]:
    return {"SLURM_CONF": str(cluster.conf), "MARINBUILD_RETRY_BASE_DELAY": "0.1", **more}


def _project(folder: Path, body: str, cluster_file: str = CLUSTER_FILE) -> Path:
    write_marinfile(folder, 'DEFAULT_BACKEND = "slurm"\nDEFAULT_CLUSTER = "cluster.toml"\n' + body.lstrip())
    (folder / "cluster.toml").write_text(cluster_file)
    return folder


def _run(project: Path, cluster: SlurmCluster, *args: str, timeout: float = 180, **env: str):  # type: ignore[no-untyped-def]
    return marinbuild("run", "--backend", "slurm", "--cluster", "cluster.toml", *args, cwd=project,
                      env=_env(cluster, **env), timeout=timeout)


def _start(project: Path, cluster: SlurmCluster, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "marinbuild", "run", "--backend", "slurm", "--cluster", "cluster.toml",
                             *args], cwd=project, env=cli_env(_env(cluster)), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _marker(output: str) -> dict | None:  # type: ignore[type-arg]
    path = Path(output, ".marinbuild", "slurm")
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _wait_state(output: str, state: str, timeout: float = 60) -> dict:  # type: ignore[type-arg]
    _wait(lambda: (_marker(output) or {}).get("state") == state, timeout, f"the job of {output} {state}")
    found = _marker(output)
    assert found is not None
    return found


def _ledger(output: str) -> dict:  # type: ignore[type-arg]
    return json.loads(Path(output, "attempts.json").read_text())


def test_shell_and_function_steps_run_as_tagged_jobs(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
import os
from marinbuild import step, ResourceConfig

def fn(cfg):
    print("fn sees", open(os.path.join(cfg["a"], "a.txt")).read().strip(), "on", os.environ["SLURMD_NODENAME"])
    with open(os.path.join(os.environ["MARINBUILD_OUTPUT"], "fn.txt"), "w") as f:
        f.write(os.environ["MARINBUILD_ATTEMPT"])

a = step("a", cmd="echo shell > {output}/a.txt; echo printed by a", resources=ResourceConfig.with_cpu(1, ram="200m"))
b = step("b", fn, config={"a": a})
""")
    result = _run(project, slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project)
    a_out, b_out = rows["a"]["output_path"], rows["b"]["output_path"]
    assert Path(b_out, "fn.txt").read_text() == "1"
    assert "[a] printed by a" in result.stdout and "[b] fn sees shell on n" in result.stdout
    for out in (a_out, b_out):
        entry = _ledger(out)["attempts"][0]
        assert entry["backend"] == "slurm" and entry["class"] == "SUCCESS" and entry["slurm_state"] == "COMPLETED"
        job = slurm_cluster.jobs()[entry["slurm_job"]]
        assert job["comment"].startswith("marinbuild ") and job["comment"].endswith(out)  # the run's tag and the step
    args = Path(a_out, "logs", "step.log").read_text()
    assert "--cpus-per-task=1" in args and "--mem=200M" in args and "--no-requeue" in args and "--partition=main" in args
    node = _ledger(a_out)["attempts"][0]["nodes"]
    shown = marinbuild("logs", "a", "--host", node, cwd=project, env=_env(slurm_cluster))
    assert shown.returncode == 0 and "printed by a" in shown.stdout, shown.stdout + shown.stderr


def test_a_two_node_step_starts_once_per_node_and_jax_meets_across_them(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
import os
from marinbuild import step, ResourceConfig

def meet(cfg):
    import jax
    jax.distributed.initialize(os.environ["MARINBUILD_COORDINATOR_ADDRESS"],
                               int(os.environ["MARINBUILD_NUM_PROCESSES"]), int(os.environ["MARINBUILD_PROCESS_ID"]))
    seen = {k: v for k, v in os.environ.items() if k.startswith(("MARINBUILD_", "MEGASCALE_"))}
    rank = jax.process_index()
    with open(os.path.join(os.environ["MARINBUILD_OUTPUT"], f"rank-{rank}.json"), "w") as f:
        import json
        json.dump({"count": jax.process_count(), "devices": jax.device_count(), "env": seen}, f)
    jax.distributed.shutdown()

step("pair", meet, resources=ResourceConfig.with_cpu(1, ram=None, replicas=2))
""")
    result = _run(project, slurm_cluster, MARINBUILD_PROCESS_ID="7", MEGASCALE_COORDINATOR_ADDRESS="stale:1")
    assert result.returncode == 0, result.stdout + result.stderr
    out = plan_json(project)["pair"]["output_path"]
    ranks = [json.loads(Path(out, f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert [r["count"] for r in ranks] == [2, 2] and all(r["devices"] >= 2 for r in ranks)
    for rank, r in enumerate(ranks):
        env = r["env"]
        assert env["MARINBUILD_PROCESS_ID"] == str(rank) and env["MARINBUILD_NUM_PROCESSES"] == "2"
        assert env["MARINBUILD_OUTPUT"] == out and env["MARINBUILD_ATTEMPT"] == "1"
        assert env["MARINBUILD_COORDINATOR_ADDRESS"] == ranks[0]["env"]["MARINBUILD_COORDINATOR_ADDRESS"]
        assert not [k for k in env if k.startswith("MEGASCALE_")]
    entry = _ledger(out)["attempts"][0]
    assert entry["nodes"] == "n[1-2]" and "--nodes=2" in Path(out, "logs", "step.log").read_text()
    assert entry["held"] == {"cores": 2}  # what one node holds, times its nodes: the hours are the job's
    assert sorted(p.name for p in Path(out, "logs").glob("node_*.log")) == ["node_00.log", "node_01.log"]


def test_a_failing_step_fails_its_job_and_is_retried_on_the_failure_budget(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
from marinbuild import step
step("bad", cmd="echo trying $MARINBUILD_ATTEMPT; exit 3")
""")
    result = _run(project, slurm_cluster, "--max-retries-failure", "1")
    assert result.returncode == 1, result.stdout + result.stderr
    attempts = _ledger(plan_json(project)["bad"]["output_path"])["attempts"]
    assert [(a["class"], a["slurm_state"], a["exit_code"], a["message"]) for a in attempts] == [
        ("FAILED", "FAILED", 3, "exit status 3")] * 2
    assert "[bad] trying 2" in result.stdout


LONG_FIRST = """
from marinbuild import step, ResourceConfig
step("long", cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ]; then sleep 120; fi; echo attempt $MARINBUILD_ATTEMPT > {output}/done.txt',
     resources=ResourceConfig.with_cpu(2, ram=None){extra})
"""


def test_a_preemption_by_a_higher_priority_partition_is_retried_on_the_preemption_budget(
        project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", ""))
    out = plan_json(project)["long"]["output_path"]
    runner = _start(project, slurm_cluster)
    try:
        _wait_state(out, "RUNNING")
        slurm_cluster.run("sbatch", "-p", "urgent", "--nodes=2", "--cpus-per-task=2", "--mem=100M", "--wrap", "sleep 2")
        text, _ = runner.communicate(timeout=120)
    finally:
        runner.kill()
    assert runner.returncode == 0, text
    attempts = _ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["PREEMPTED", "SUCCESS"] and attempts[0]["slurm_state"] == "PREEMPTED"
    assert _ledger(out)["retries"]["preemption"] == {"used": 1, "max": 100}
    assert Path(out, "done.txt").read_text() == "attempt 2\n"


def test_a_lost_node_is_a_preemption(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", ""))
    out = plan_json(project)["long"]["output_path"]
    # The node's processes are killed with it: no word from them; the run waits out their fence.
    runner = _start(project, slurm_cluster, "--lease-heartbeat", "1", "--lease-expiry", "4")
    node = None
    try:
        seen = _wait_state(out, "RUNNING")
        node = seen["nodes"]
        slurm_cluster.kill_node(node, seen["job_id"])
        text, _ = runner.communicate(timeout=120)  # attempt 2 runs on the node still up
    finally:
        runner.kill()
        if node is not None:
            slurm_cluster.start_node(node)
    assert runner.returncode == 0, text
    attempts = _ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["PREEMPTED", "SUCCESS"] and attempts[0]["slurm_state"] == "NODE_FAIL"
    assert attempts[0]["cause"] == "preemption"


def _ledger_or_empty(out: str) -> list:  # type: ignore[type-arg]
    try:
        return _ledger(out)["attempts"]
    except (OSError, ValueError):
        return []


def test_with_requeue_a_lost_node_is_one_attempt_going_on(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, """
from marinbuild import step, ResourceConfig
step("again", cmd='if [ "${{SLURM_RESTART_COUNT:-0}}" = 0 ]; then sleep 120; fi; echo "restarts $SLURM_RESTART_COUNT" > {output}/done.txt',
     resources=ResourceConfig.with_cpu(2, ram=None))
""", CLUSTER_FILE + "requeue = true\n")
    out = plan_json(project)["again"]["output_path"]
    runner = _start(project, slurm_cluster)
    seen = None
    try:
        seen = _wait_state(out, "RUNNING")
        slurm_cluster.kill_node(seen["nodes"], seen["job_id"])
        # Slurm marks the node DOWN and requeues on its own timers, slower on a loaded machine: a
        # generous guard, and what Slurm and the runner said if even that runs out.
        # It gives up as soon as the runner has ended, and within the test's own time limit, so that
        # what went wrong is said instead of pytest-timeout's bare stack.
        def requeued() -> bool:
            return "Slurm requeued job" in Path(out, "logs", "step.log").read_text()

        try:
            _wait(lambda: requeued() or runner.poll() is not None, 180, "the requeue noted")
            assert requeued(), f"the runner ended (status {runner.returncode}) with no requeue noted"
        except AssertionError as e:
            ctld = (slurm_cluster.folder / "slurmctld.log").read_text(errors="replace").splitlines()[-30:]
            raise AssertionError(f"{e}; jobs {slurm_cluster.jobs()}; step log:\n"
                                 f"{Path(out, 'logs', 'step.log').read_text()}\nslurmctld:\n" + "\n".join(ctld)) from None
        # Slurm holds a requeued job back for two minutes (reason BeginTime); an operator may let it go now.
        # It runs on the node still up (the lost one comes back only afterwards).
        slurm_cluster.run("scontrol", "update", f"JobId={seen['job_id']}", "StartTime=now")
        text, _ = runner.communicate(timeout=120)
    finally:
        runner.kill()
        if seen is not None:
            slurm_cluster.start_node(seen["nodes"])
    assert runner.returncode == 0, text
    attempts = _ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["SUCCESS"] and attempts[0]["slurm_requeues"] == 1  # one attempt, going on
    assert attempts[0]["slurm_job"] == seen["job_id"] and "--requeue" in Path(out, "logs", "step.log").read_text()
    assert Path(out, "done.txt").read_text() == "restarts 1\n"


def test_a_job_whose_runner_stops_renewing_stops_itself(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", ""))
    out = plan_json(project)["long"]["output_path"]
    runner = _start(project, slurm_cluster, "--lease-heartbeat", "0.5", "--lease-expiry", "4")
    try:
        job = _wait_state(out, "RUNNING")["job_id"]
        runner.send_signal(signal.SIGSTOP)  # alive, but renewing nothing: no Ctrl-C reaches Slurm
        began = time.monotonic()
        _wait(lambda: slurm_cluster.jobs()[job]["state"] in ("FAILED", "COMPLETED"), 60, "the job ended by its fence")
        assert time.monotonic() - began < 30
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.wait(timeout=30)
    exit_file = next(Path(out).parent.joinpath(".marinbuild", "slurm").rglob("exit-0.json"))
    assert "lease not renewed for 3.5 s" in json.loads(exit_file.read_text())["error"]


def test_ctrl_c_cancels_the_runs_jobs(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", ""))
    out = plan_json(project)["long"]["output_path"]
    runner = _start(project, slurm_cluster)
    try:
        job = _wait_state(out, "RUNNING")["job_id"]
        runner.send_signal(signal.SIGINT)
        text, _ = runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert runner.returncode == 130, text
    _wait(lambda: slurm_cluster.jobs()[job]["state"] == "CANCELLED", 30, "the job cancelled")


def test_a_job_cancelled_by_someone_else_is_cancelled_and_says_so(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", ""))
    out = plan_json(project)["long"]["output_path"]
    runner = _start(project, slurm_cluster, "--max-retries-failure", "3")
    try:
        job = _wait_state(out, "RUNNING")["job_id"]
        slurm_cluster.run("scancel", str(job))
        text, _ = runner.communicate(timeout=60)
    finally:
        runner.kill()
    assert runner.returncode == 1, text
    attempts = _ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["CANCELLED"]  # not retried, whatever the budgets
    assert "cancelled by someone else" in attempts[0]["message"] and "cancelled by someone else" in text


def test_a_sigkilled_runners_job_is_cancelled_by_the_next_run_and_by_slurm_down(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, LONG_FIRST.replace("{extra}", "") + 'step("hold", cmd="sleep 120", resources=ResourceConfig.with_cpu(1, ram=None))\n')
    out = plan_json(project)["long"]["output_path"]
    runner = _start(project, slurm_cluster, "long")
    job = _wait_state(out, "RUNNING")["job_id"]
    runner.kill()
    runner.wait(timeout=30)
    listed = marinbuild("slurm", "list", "--json", cwd=project, env=_env(slurm_cluster))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["job_id"], r["step"], r["held_by"]) for r in rows] == [(job, "long", None)]
    again = _run(project, slurm_cluster, "long", "--force", "long", timeout=240)  # its attempt 2: no sleep
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"cancelled Slurm job {job}" in again.stdout + again.stderr
    assert slurm_cluster.jobs()[job]["state"] == "CANCELLED"

    held = plan_json(project)["hold"]["output_path"]
    runner = _start(project, slurm_cluster, "hold")
    job = _wait_state(held, "RUNNING")["job_id"]
    runner.kill()
    runner.wait(timeout=30)
    down = marinbuild("slurm", "down", cwd=project, env=_env(slurm_cluster))
    assert down.returncode == 0 and f"cancelled Slurm job {job}" in down.stdout + down.stderr, down.stdout + down.stderr
    _wait(lambda: slurm_cluster.jobs()[job]["state"] == "CANCELLED", 30, "the job cancelled")


def test_a_pending_job_shows_its_id_and_reason_in_status(project: Path, slurm_cluster: SlurmCluster) -> None:
    blocker = slurm_cluster.run("sbatch", "--parsable", "-p", "main", "--nodes=2", "--cpus-per-task=2", "--mem=100M",
                                "--wrap", "sleep 300").strip()
    try:
        _project(project, LONG_FIRST.replace("{extra}", "").replace("sleep 120", "true"))
        out = plan_json(project)["long"]["output_path"]
        runner = _start(project, slurm_cluster)
        try:
            seen = _wait_state(out, "PENDING")
            _wait(lambda: (_marker(out) or {}).get("reason") == "Resources", 30, "the reason Resources")
            shown = marinbuild("status", cwd=project, env=_env(slurm_cluster))
            assert f"waiting in Slurm: Resources (job {seen['job_id']})" in shown.stdout, shown.stdout
            slurm_cluster.run("scancel", blocker)
            text, _ = runner.communicate(timeout=60)
        finally:
            runner.kill()
        assert runner.returncode == 0, text
    finally:
        slurm_cluster.run("scancel", blocker, check=False)


def test_unknown_slurm_keys_are_refused_in_one_line(project: Path, slurm_cluster: SlurmCluster) -> None:
    _project(project, 'from marinbuild import step\nstep("s", cmd="true")\n', "[slurm]\npartiton = \"main\"\n")
    result = _run(project, slurm_cluster)
    assert result.returncode == 2 and "unknown [slurm] key(s) 'partiton'" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    _project(project, 'from marinbuild import step\nstep("s", cmd="true", slurm={"qso": "x"})\n')
    result = _run(project, slurm_cluster)
    assert result.returncode == 2 and "step 's': slurm=: unknown [slurm] key(s) 'qso'" in result.stderr
    assert not slurm_cluster.jobs() or all("marinbuild" not in j["comment"] or "/s-" not in j["comment"]
                                           for j in slurm_cluster.jobs().values())


def test_a_wall_time_spent_in_slurm_is_a_timeout_never_retried(project: Path, slurm_cluster: SlurmCluster) -> None:
    """Slurm counts wall time in whole minutes: the shortest limit it enforces is one minute."""
    _project(project, """
from marinbuild import step, ResourceConfig, WTime, Cores
step("slow", cmd="sleep 600", resources=Cores(1) & WTime(T=30))
""")
    result = _run(project, slurm_cluster, "--max-retries-failure", "3", timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    out = plan_json(project)["slow"]["output_path"]
    attempts = _ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["TIMEOUT"] and attempts[0]["slurm_state"] == "TIMEOUT"
    assert "--time=0:00:30" in Path(out, "logs", "step.log").read_text()
