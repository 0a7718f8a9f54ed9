"""Hangs caught from progress: a silent step is killed and retried on its hang budget, a busy one is left alone.

Real runs of the command line on the local backend, and a real SSH gang on loopback hosts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from tests.fixtures_ssh import FakeFleet, live_processes_matching, run_job

from .helpers import marinbuild, marinbuild_in_process, plan_json, start_marinbuild, status_of, write_marinfile

QUICK = {"MARINBUILD_RETRY_BASE_DELAY": "0.01"}


def ledger(output_path: str) -> dict:
    return json.loads((Path(output_path) / "attempts.json").read_text())


WEDGED_ONCE = """
from marinbuild import step

# Attempt 1 says nothing and touches nothing, forever; attempt 2 shows progress and finishes.
step("wedged", cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ]; then exec sleep 3071; fi; '
                   'touch "$MARINBUILD_PROGRESS"; echo done > {output}/out', progress_timeout=1)
"""


def test_a_silent_step_is_killed_as_a_hang_and_its_retry_succeeds(project: Path) -> None:
    write_marinfile(project, WEDGED_ONCE)
    result = marinbuild("run", cwd=project, env=QUICK)
    assert result.returncode == 0, result.stdout + result.stderr
    out = plan_json(project)["wedged"]["output_path"]
    assert (status_of(out) or {}).get("status") == "SUCCESS"
    record = ledger(out)
    assert [(a["attempt"], a["class"], a["cause"]) for a in record["attempts"]] == [
        (1, "HANG", "hang"), (2, "SUCCESS", "success")]
    assert record["attempts"][0]["message"].startswith("hang: no progress for 1 s")
    assert "last_progress_at" in record["attempts"][0]
    assert record["retries"]["hang"] == {"used": 1, "max": 2}
    assert record["retries"]["failure"] == {"used": 0, "max": 0}
    log = (Path(out) / "logs" / "step.log").read_text()
    assert "killing it as a hang" in log and "hang retry 1 of 2" in log
    assert live_processes_matching("sleep 3071") == []
    # The run's summary, status and show say what was used of each budget.
    assert "retries wedged: hangs 1/2\n" in result.stdout
    status = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]
    assert status["retries"]["hang"] == {"used": 1, "max": 2}
    assert set(status["retries"]) == {"failure", "preemption", "hang", "infra", "provisioning"}
    assert all(set(v) >= {"used", "max"} for v in status["retries"].values())
    assert "failures 0/0 · preemptions 0/100 · hangs 1/2" in marinbuild_in_process("status", cwd=project).stdout
    shown = json.loads(marinbuild_in_process("show", "--json", cwd=project).stdout)[0]
    assert shown["retries"]["hang"] == {"used": 1, "max": 2} and shown["attempts"] == 2
    assert "hangs 1/2" in marinbuild_in_process("show", cwd=project).stdout


BUSY = """
from marinbuild import step

# Each runs well past its progress timeout, showing progress all along: one by touching its
# progress file, one by printing.
step("touching", cmd='for i in $(seq 12); do touch "$MARINBUILD_PROGRESS"; sleep 0.3; done', progress_timeout=2)
step("talking", cmd='for i in $(seq 12); do echo "step $i"; sleep 0.3; done', progress_timeout=2)
"""


def test_a_step_that_shows_progress_is_never_killed(project: Path) -> None:
    write_marinfile(project, BUSY)
    result = marinbuild("run", cwd=project, env=QUICK)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("touching", "talking"):
        record = ledger(plan_json(project)[name]["output_path"])
        assert [a["class"] for a in record["attempts"]] == ["SUCCESS"], record
        assert record["retries"]["hang"]["used"] == 0


def test_status_says_when_a_running_step_last_moved(project: Path) -> None:
    write_marinfile(project, """
from marinbuild import step
step("ticking", cmd='touch {output}/started; while [ ! -e {output}/stop ]; do echo tick; sleep 0.2; done',
     progress_timeout=30)
""")
    runner = start_marinbuild("run", cwd=project, env=QUICK)
    out = Path(plan_json(project)["ticking"]["output_path"])
    try:
        seen = None
        for _ in range(600):
            if (out / "started").exists():
                row = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]
                if row["status"] == "RUNNING" and row["progress"]:
                    seen = row
                    break
            time.sleep(0.1)
        assert seen is not None, "status never showed the running step's progress"
        assert seen["progress"]["timeout_s"] == 30 and seen["progress"]["attempt"] == 1
        assert isinstance(seen["progress"]["last_moved"], float)
        assert "last moved" in marinbuild_in_process("status", cwd=project).stdout
    finally:
        (out / "stop").touch()
        assert runner.wait(60) == 0
    assert json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]["progress"] is None
    assert json.loads((out / ".marinbuild" / "progress.json").read_text()) == {"ended": True}


def test_a_step_hanging_every_time_fails_once_its_hang_budget_is_spent(project: Path) -> None:
    write_marinfile(project, """
from marinbuild import step
step("stuck", cmd="exec sleep 3072", progress_timeout="0.5", max_retries_hang=1)
""")
    result = marinbuild("run", "--retries", "5", cwd=project, env=QUICK)
    assert result.returncode == 1
    out = plan_json(project)["stuck"]["output_path"]
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["HANG", "HANG"]
    assert record["retries"]["hang"] == {"used": 1, "max": 1}
    assert record["retries"]["failure"] == {"used": 0, "max": 5}  # a hang never draws on the failure budget
    error = (status_of(out) or {}).get("error") or ""
    assert error.startswith("hang: no progress for 0.5 s") and "hang budget spent (1/1)" in error
    assert "hang" in result.stdout
    assert live_processes_matching("sleep 3072") == []


def test_a_silent_gang_is_torn_down_as_a_hang_on_every_host_and_retried(fleet: FakeFleet, tmp_path: Path) -> None:
    # Hosts 2 and 3: tests elsewhere kill what runs attempt 1 on hosts 0 and 1 to play a preemption.
    # Attempt 1 wedges silently on both hosts; attempt 2 touches each host's own progress file.
    command = ('if [ "$MARINBUILD_ATTEMPT" = 1 ]; then exec sleep 3073; fi; '
               'touch "$MARINBUILD_PROGRESS"; test -f "$MARINBUILD_PROGRESS"')
    result = run_job(fleet, tmp_path, [("pair", "v4-16", [2, 3])], command, progress_timeout=1.0)
    assert result.status == "SUCCESS", result.error
    assert [a.classification for a in result.attempts] == ["HANG", "SUCCESS"]
    hung = result.attempts[0]
    assert hung.last_progress_at is not None and "hang: no progress on any host" in hung.message
    assert all(h.torn_down for h in hung.hosts)
    assert live_processes_matching("sleep 3073") == []
    record = json.loads((tmp_path / "out" / "attempts.json").read_text())
    assert [(a["class"], a["cause"]) for a in record["attempts"]] == [("HANG", "hang"), ("SUCCESS", "success")]
    assert record["retries"]["hang"] == {"used": 1, "max": 2}
    assert record["retries"]["preemption"] == {"used": 0, "max": 100}
    assert json.loads((tmp_path / "out" / ".marinbuild" / "progress.json").read_text()) == {"ended": True}


def test_a_gang_whose_hosts_show_progress_only_through_their_files_is_not_killed(
    fleet: FakeFleet, tmp_path: Path
) -> None:
    command = 'for i in $(seq 12); do touch "$MARINBUILD_PROGRESS"; sleep 0.3; done'
    result = run_job(fleet, tmp_path, [("one", "v4-8", [3])], command, progress_timeout=2.0)
    assert result.status == "SUCCESS", result.error
    assert [a.classification for a in result.attempts] == ["SUCCESS"]


def test_the_cluster_files_progress_timeout_catches_a_silent_tpu_step_run_from_the_command_line(
    project: Path, fleet: FakeFleet
) -> None:
    write_marinfile(project, """
from marinbuild import step, ResourceConfig
step("wedged", cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ]; then exec sleep 3076; fi; echo fine',
     resources=ResourceConfig.with_tpu("v4-16"))
""")
    cluster = project / "cluster.toml"
    cluster.write_text('progress_timeout = "1s"\n' + fleet.cluster_toml([("a", "v4-16", [2, 3])]))
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=QUICK)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "retries wedged: hangs 1/2\n" in result.stdout
    out = plan_json(project, "--cluster", str(cluster))["wedged"]["output_path"]
    record = ledger(out)
    assert [(a["class"], a["backend"]) for a in record["attempts"]] == [("HANG", "tpu"), ("SUCCESS", "tpu")]
    assert all(h["torn_down"] for h in record["attempts"][0]["hosts"])
    status = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]
    assert status["retries"]["hang"] == {"used": 1, "max": 2}
    assert live_processes_matching("sleep 3076") == []


def test_the_library_summary_carries_each_steps_retries(tmp_path: Path, monkeypatch) -> None:
    import marinbuild

    monkeypatch.setenv("MARINBUILD_RETRY_BASE_DELAY", "0.01")
    stuck = marinbuild.step("stuck", cmd="exec sleep 3077", progress_timeout=0.5, max_retries_hang=1)
    fine = marinbuild.step("fine", cmd="true")
    summary = marinbuild.run(steps=[stuck, fine], prefix=str(tmp_path / "out"), quiet=True, keep_going=True)
    assert summary.steps["stuck"].outcome.value == "failed"
    assert summary.steps["stuck"].retries is not None and summary.steps["stuck"].retries["hang"] == {"used": 1, "max": 1}
    assert "hang budget spent (1/1)" in (summary.steps["stuck"].error or "")
    assert summary.steps["fine"].retries is None  # nothing retried, nothing failed
    assert live_processes_matching("sleep 3077") == []


def test_hang_settings_are_not_part_of_a_steps_identity(project: Path) -> None:
    body = 'from marinbuild import step, versioned\nstep("s", cmd="true", config={{"n": versioned(1)}}{extra})\n'
    write_marinfile(project, body.format(extra=""))
    plain = plan_json(project)["s"]
    write_marinfile(project, body.format(extra=', progress_timeout="15m", max_retries_hang=5'))
    watched = plan_json(project)["s"]
    assert watched["output_path"] == plain["output_path"]
