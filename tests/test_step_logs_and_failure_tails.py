"""`marinbuild logs`, attempt headers, the failure summary's log tail and `run -p`, on real runs."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

from .helpers import marinbuild, marinbuild_in_process, plan_json, start_marinbuild, write_marinfile

HEADER = re.compile(r"^=== marinbuild attempt (\d+) \S+ host (\S+) backend (\S+) ===$", re.M)

MARINFILE = """
from marinbuild import step, versioned

def gen(cfg):
    print("generating", cfg["n"])

data = step("data", gen, {"n": versioned(3)})
flaky = step("flaky", cmd="echo try $MARINBUILD_ATTEMPT; echo 'ValueError: bad shard' >&2; exit 3",
             config={"data": data})
"""

FAST_RETRY = {"MARINBUILD_RETRY_BASE_DELAY": "0.01"}


def test_each_attempt_opens_with_a_header_and_logs_picks_attempts(project):
    write_marinfile(project, MARINFILE)
    first = marinbuild("run", "--retries", "1", cwd=project, env=FAST_RETRY)
    assert first.returncode == 1
    # The failure summary ends with the failing step's own error text, not only its exit status.
    summary = first.stdout[first.stdout.index("FAILED flaky"):]
    assert "ValueError: bad shard" in summary and "exit status 3" in summary
    out = Path(plan_json(project)["flaky"]["output_path"])
    log = (out / "logs" / "step.log").read_text()
    assert [(n, b) for n, _, b in HEADER.findall(log)] == [("1", "local"), ("2", "local")]
    assert log.index("try 1") < log.index("=== marinbuild attempt 2") < log.index("try 2")

    # A new run does not append to the last run's text: that moves aside, with its headers.
    second = marinbuild("run", cwd=project, env=FAST_RETRY)
    assert second.returncode == 1
    now = (out / "logs" / "step.log").read_text()
    assert [n for n, _, _ in HEADER.findall(now)] == ["3"] and "try 1" not in now
    earlier = [p for p in (out / "logs").iterdir() if p.name != "step.log"]
    assert len(earlier) == 1 and re.fullmatch(r"step\.\S+\.log", earlier[0].name)
    assert "try 1" in earlier[0].read_text()

    latest = marinbuild_in_process("logs", "flaky", cwd=project)
    assert latest.returncode == 0, latest.stderr
    assert "try 3" in latest.stdout and "try 2" not in latest.stdout
    assert HEADER.search(latest.stdout).group(1) == "3"
    second_attempt = marinbuild_in_process("logs", "flaky", "--attempt", "2", cwd=project)
    assert "try 2" in second_attempt.stdout and "try 1" not in second_attempt.stdout and "try 3" not in second_attempt.stdout
    first_attempt = marinbuild_in_process("logs", "flaky", "--attempt", "1", cwd=project)
    assert "try 1" in first_attempt.stdout and "try 2" not in first_attempt.stdout
    function_step = marinbuild_in_process("logs", "data", cwd=project)
    assert "generating 3" in function_step.stdout

    missing = marinbuild_in_process("logs", "flaky", "--attempt", "7", cwd=project)
    assert missing.returncode == 2
    assert missing.stderr.strip() == "marinbuild: error: no attempt 7 in the logs of flaky; attempts logged: 1, 2, 3"
    no_host = marinbuild_in_process("logs", "flaky", "--host", "x", cwd=project)
    assert no_host.returncode == 2 and "only TPU and Slurm steps" in no_host.stderr


def test_logs_of_a_step_that_never_ran_is_one_line(project):
    write_marinfile(project, MARINFILE)
    result = marinbuild_in_process("logs", "data", cwd=project)
    assert result.returncode == 2
    assert result.stderr.startswith("marinbuild: error: no log of step data: it never ran")
    assert len(result.stderr.strip().splitlines()) == 1


def test_run_p_prints_each_shell_steps_resolved_command_as_it_starts(project):
    write_marinfile(project, """
    from marinbuild import step
    a = step("a", cmd="echo {word} > {output}/w.txt", config={"word": "it's"})
    b = step("b", cmd="cat {src}/w.txt", config={"src": a})
    """)
    result = marinbuild("run", "-p", "-j", "1", cwd=project)
    assert result.returncode == 0, result.stderr
    rows = plan_json(project)
    lines = result.stdout.splitlines()
    shown_a = f"[a] $ echo 'it'\"'\"'s' > {rows['a']['output_path']}/w.txt"
    shown_b = f"[b] $ cat {rows['a']['output_path']}/w.txt"
    assert shown_a in lines and shown_b in lines
    assert lines.index(shown_a) < lines.index(shown_b) < lines.index("[b] it's")
    quiet = marinbuild("run", "--force", "a", cwd=project)
    assert "$ echo" not in quiet.stdout  # only with -p


def test_logs_f_follows_a_running_step_until_it_ends(project):
    write_marinfile(project, """
    from marinbuild import step
    step("slow", cmd="for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done; touch {output}/done")
    """)
    runner = start_marinbuild("run", "-q", cwd=project)
    try:
        out = Path(plan_json(project)["slow"]["output_path"])
        deadline = time.time() + 60
        while time.time() < deadline and "tick 1" not in _read(out / "logs" / "step.log"):
            time.sleep(0.05)
        follower = marinbuild("logs", "slow", "-f", cwd=project)
        assert follower.returncode == 0, follower.stderr
        # It printed what came after it started, and returned only once the step had ended.
        assert [f"tick {i}" for i in range(1, 7)] == [x for x in follower.stdout.splitlines() if x.startswith("tick")]
        assert (out / "done").exists()
    finally:
        runner.wait(60)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


TPU_MARINFILE = """
from marinbuild import step, ResourceConfig
step("tpu/sh", cmd="echo hello from worker $MARINBUILD_WORKER_ID; test $MARINBUILD_ATTEMPT -ge 2 || exit 5",
     resources=ResourceConfig.with_tpu("v4-16"), max_retries_failure=1)
"""


def test_tpu_logs_per_host_by_attempt(project, fleet):
    write_marinfile(project, TPU_MARINFILE)
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1])], python=sys.executable)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST_RETRY)
    assert result.returncode == 0, result.stdout + result.stderr
    hosts = [fleet.hosts[0].entry, fleet.hosts[1].entry]
    every = marinbuild_in_process("logs", "tpu/sh", cwd=project)
    assert every.returncode == 0, every.stderr
    # Without --host: each host's part of the latest attempt, each under its name.
    assert "hello from worker 0" in every.stdout and "hello from worker 1" in every.stdout
    assert [n for n, _, _ in HEADER.findall(every.stdout)] == ["2", "2"]
    assert {h for _, h, b in HEADER.findall(every.stdout)} == set(hosts)
    assert {b for _, _, b in HEADER.findall(every.stdout)} == {"tpu"}
    one = marinbuild_in_process("logs", "tpu/sh", "--host", hosts[1], "--attempt", "1", cwd=project)
    assert one.returncode == 0, one.stderr
    assert "hello from worker 1" in one.stdout and "hello from worker 0" not in one.stdout
    assert [(n, h) for n, h, _ in HEADER.findall(one.stdout)] == [("1", hosts[1])]
    by_slot = marinbuild_in_process("logs", "tpu/sh", "--host", "slice_00_worker_00", cwd=project)
    assert "hello from worker 0" in by_slot.stdout and "worker 1" not in by_slot.stdout
    unknown = marinbuild_in_process("logs", "tpu/sh", "--host", "10.9.9.9", cwd=project)
    assert unknown.returncode == 2 and "no log for host '10.9.9.9'" in unknown.stderr


def test_logs_refuses_a_symlink_planted_in_an_outputs_logs(project, tmp_path):
    write_marinfile(project, 'from marinbuild import step\nstep("s", cmd="echo hello")\n')
    assert marinbuild("run", cwd=project).returncode == 0
    secret = tmp_path / "secret.txt"
    secret.write_text("TOP-SECRET\n")
    logs = Path(plan_json(project)["s"]["output_path"]) / "logs"
    (logs / "step.log").unlink()
    (logs / "step.log").symlink_to(secret)
    for args in (["logs", "s"], ["logs", "s", "-f"], ["logs", "s", "--attempt", "1"]):
        result = marinbuild(*args, cwd=project)
        assert result.returncode == 2, result.stdout + result.stderr
        assert "TOP-SECRET" not in result.stdout + result.stderr
        assert result.stderr.strip() == f"marinbuild: error: {logs / 'step.log'} is a symbolic link; logs are never read through one"
    # The logs folder itself replaced by a link to a folder holding a step.log.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "step.log").write_text("TOP-SECRET\n")
    (logs / "step.log").unlink()
    logs.rmdir()
    logs.symlink_to(elsewhere, target_is_directory=True)
    result = marinbuild_in_process("logs", "s", cwd=project)
    assert result.returncode == 2 and "TOP-SECRET" not in result.stdout + result.stderr
    assert result.stderr.strip() == f"marinbuild: error: {logs} is a symbolic link; logs are never read through one"
