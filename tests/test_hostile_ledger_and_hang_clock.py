"""When the hang clock starts, which retries are counted, and what the attempt ledger says once
a step's held queued resources are let go at its end: real `marinbuild` processes, a real Ray
cluster, the TPU API emulator on loopback with real sshd hosts, real signals."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fixtures_created_slices import (
    FAST,
    assert_closing_line_matches,
    deletes_answer,
    ledger,
    train_out,
    train_step,
)
from tests.fixtures_ssh import FakeFleet, processes_gone, wait_for
from tests.tpu_api_emulator import TpuApiEmulator

from .helpers import (
    marinbuild,
    marinbuild_in_process,
    plan_json,
    run_until_signalled,
    start_marinbuild,
    status_of,
    status_row,
    write_marinfile,
)

if TYPE_CHECKING:
    from .fixtures_ray import RayCluster

pytest_plugins = ["tests.fixtures_ray", "tests.fixtures_created_slices"]

def _classes(out: Path) -> list[str]:
    return [a["class"] for a in ledger(out)["attempts"]]


def _show_row(project: Path, name: str) -> dict[str, Any]:
    result = marinbuild_in_process("show", "--json", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return next(r for r in json.loads(result.stdout) if r["step"] == name)


_SHORT = {"f": "failure", "p": "preemption", "h": "hang", "i": "infra", "v": "provisioning"}


def _used(retries: dict[str, Any] | str) -> dict[str, int]:
    """Retries used of each budget, from the ledger's (or status's) mapping or a marker's short form."""
    if isinstance(retries, str):  # "f1.3_p0.100_h0.2_i0.2_v0.3600.0"
        return {_SHORT[part[0]]: int(part[1:].split(".")[0]) for part in retries.split("_")}
    return {k: v["used"] for k, v in retries.items()}


# ---------------------------------------------------------------------------------------
# Local steps: the hang clock starts at launch; a retry the wall time rules out is not counted.


def test_local_silent_step_is_a_hang_counted_from_its_launch(project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import step
        step("silent", cmd='exec sleep 3091', progress_timeout=0.5, max_retries_hang=1)
    """)
    result = marinbuild("run", cwd=project, env=FAST, timeout=60)
    assert result.returncode != 0
    out = Path(plan_json(project)["silent"]["output_path"])
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["HANG", "HANG"], record
    assert record["retries"]["hang"] == {"used": 1, "max": 1}
    assert (out / "logs" / "step.log").read_text().count("killing it as a hang") == 2
    assert processes_gone("sleep 3091") == []


def test_local_hang_retry_the_wall_time_rules_out_is_counted_nowhere(project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import Cores, WTime, step
        step("stuck", cmd='echo $MARINBUILD_ATTEMPT >> {output}/tries; exec sleep 3092', progress_timeout=0.5,
             max_retries_hang=2, resources=Cores(1) & WTime(T=20))
    """)
    result = marinbuild("run", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "60"}, timeout=60)
    assert result.returncode != 0
    out = Path(plan_json(project)["stuck"]["output_path"])
    assert (out / "tries").read_text().split() == ["1"]
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["HANG"], record
    assert record["retries"]["hang"]["used"] == 0, record["retries"]
    marker = status_of(str(out))
    assert marker is not None and marker["status"] == "FAILED"
    assert _used(marker["retries"])["hang"] == 0, marker
    shown = status_row(project, "stuck")
    assert _used(shown["retries"]) == _used(record["retries"]), (shown, record["retries"])
    assert "wall time would pass during the back-off" in result.stdout + result.stderr + json.dumps(marker)
    assert processes_gone("sleep 3092") == []


def test_local_failures_counted_are_exactly_the_retries_made(project: Path) -> None:
    # Retries go on while the wall time allows the back-off: however many that is, each one
    # made is counted and the one refused is not.
    write_marinfile(project, """
        from marinbuild import Cores, WTime, step
        step("flaky", cmd='echo $MARINBUILD_ATTEMPT >> {output}/tries; exit 4', max_retries_failure=6,
             resources=Cores(1) & WTime(T=3))
    """)
    result = marinbuild("run", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "0.4"}, timeout=60)
    assert result.returncode != 0
    out = Path(plan_json(project)["flaky"]["output_path"])
    tries = (out / "tries").read_text().split()
    record = ledger(out)
    assert len(record["attempts"]) == len(tries) >= 2, (tries, record)
    assert 1 < len(tries) < 7, tries  # stopped by the wall time, not by the budget
    assert record["retries"]["failure"]["used"] == len(tries) - 1, record["retries"]
    marker = status_of(str(out))
    assert marker is not None and _used(marker["retries"])["failure"] == len(tries) - 1, marker
    assert _used(status_row(project, "flaky")["retries"])["failure"] == len(tries) - 1


# ---------------------------------------------------------------------------------------
# Ray: the hang clock and a worker Ray lost and ran the task again for.


def _ray_args(ray_cluster: RayCluster) -> list[str]:
    return ["--backend", "ray", "--ray-address", ray_cluster.address]


def test_ray_step_rerun_by_ray_after_a_lost_worker_and_queued_again_is_not_a_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # Two steps share the cluster's one "special"; each shows progress for a while and succeeds.
    # The worker of the one that starts first is killed: Ray runs its task again, which waits
    # in Ray's queue while the other one holds "special". Waiting there is not a hang.
    body = ('echo $PPID >> {output}/pids; '
            'for i in $(seq 1 25); do touch "$MARINBUILD_PROGRESS"; sleep 0.2; done; echo ok > {output}/out')
    write_marinfile(project, f"""
        from marinbuild import step
        from marinbuild.resources import Custom
        for name in ("left", "right"):
            step(name, cmd={body!r}, resources=Custom("special", 1), progress_timeout=3, max_retries_hang=1)
    """)
    plan = plan_json(project, "--resources", "special=1")
    outs = {n: Path(plan[n]["output_path"]) for n in ("left", "right")}
    runner = start_marinbuild("run", "-j", "2", *_ray_args(ray_cluster), cwd=project,
                              env={**ray_cluster.env, **FAST})
    try:
        wait_for(lambda: any((o / "pids").exists() for o in outs.values()), timeout=90)
        first = next(n for n, o in outs.items() if (o / "pids").exists())
        victim = outs[first]
        wait_for(lambda: bool((victim / "pids").read_text().split()), timeout=10)
        pid = int((victim / "pids").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        stdout, stderr = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    other = outs["right" if first == "left" else "left"]
    assert runner.returncode == 0, stdout + stderr
    # The other step ran to its end before the killed one ran again: it waited in the queue.
    ran_again_after_other = (victim / "out").stat().st_mtime_ns > (other / "out").stat().st_mtime_ns
    record = ledger(victim)
    log = (victim / "logs" / "step.log").read_text()
    assert ran_again_after_other, "Ray ran the killed task again before the queued one: nothing waited"
    assert "as a hang" not in log, log
    assert [a["class"] for a in record["attempts"]] == ["SUCCESS"], record
    assert record["attempts"][0].get("ray_lost_workers") == 1, record
    assert record["retries"]["hang"]["used"] == 0


def test_ray_step_queued_while_others_read_and_wait_on_it_is_not_a_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # "queued" waits in Ray's queue behind "holder" for many of its progress timeouts while
    # `status` is run and a second runner of it waits on its lease and is interrupted.
    release = project / "release"
    write_marinfile(project, f"""
        from marinbuild import step
        from marinbuild.resources import Custom
        step("holder", cmd='touch {{output}}/started; '
                           'while [ ! -e {release} ]; do touch "$MARINBUILD_PROGRESS"; sleep 0.2; done',
             resources=Custom("special", 1), progress_timeout=3)
        step("queued", cmd='echo $MARINBUILD_ATTEMPT >> {{output}}/tries; echo ok > {{output}}/out',
             resources=Custom("special", 1), progress_timeout=0.5, max_retries_hang=1)
    """)
    plan = plan_json(project, "--resources", "special=1")
    holder, queued = Path(plan["holder"]["output_path"]), Path(plan["queued"]["output_path"])
    env = {**ray_cluster.env, **FAST}
    runner = start_marinbuild("run", "-j", "2", *_ray_args(ray_cluster), cwd=project, env=env)
    second = None
    try:
        wait_for(lambda: (holder / "started").exists() and (queued / "logs" / "step.log").exists(), timeout=90)
        assert not (queued / "out").exists()
        second = start_marinbuild("run", "queued", *_ray_args(ray_cluster), cwd=project, env=env)
        for args in (("status",), ("status", "--json"), ("status",), ("status", "--json")):
            shown = marinbuild(*args, cwd=project)
            assert shown.returncode == 0, shown.stdout + shown.stderr
        second.send_signal(signal.SIGINT)
        second.communicate(timeout=60)
        for args in (("status",), ("status", "--json")):
            assert marinbuild(*args, cwd=project).returncode == 0
        assert not (queued / "out").exists()  # still queued all this while
        release.touch()
        stdout, stderr = runner.communicate(timeout=120)
    finally:
        for proc in (runner, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert runner.returncode == 0, stdout + stderr
    log = (queued / "logs" / "step.log").read_text()
    assert "as a hang" not in log, log
    assert _classes(queued) == ["SUCCESS"], ledger(queued)
    assert (queued / "tries").read_text().split() == ["1"]
    assert status_of(str(queued))["status"] == "SUCCESS"


# ---------------------------------------------------------------------------------------
# TPU: queued resources whose deletes the API refuses, and the step log's closing line.


def _iso(text: str) -> float:
    from datetime import datetime
    return datetime.fromisoformat(text).timestamp()


def _first_attempt_preempted(project: Path, emulator: TpuApiEmulator, cluster: Path, out: Path,
                             env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run the TPU step, preempt a node once its first attempt has begun, and wait for the run's end."""
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=env)
    try:
        wait_for(lambda: (out / "a1").exists(), timeout=60)
        emulator.preempt(emulator.active_nodes()[-1])
        stdout, stderr = runner.communicate(timeout=90)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    return subprocess.CompletedProcess(runner.args, runner.returncode, stdout, stderr)


def test_tpu_a_kept_slices_refused_delete_is_amended_and_counted(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # Attempt 1 fails on a healthy slice, which attempt 2 reruns on; attempt 2 succeeds, its
    # delete is refused, and the step's end deletes the slice: attempt 1's entry says when.
    given = deletes_answer(emulator, ["refuse"])
    cluster = train_step(project, emulator, hosts,
                         'sleep 0.3; test "$MARINBUILD_ATTEMPT" -ge 2 || exit 3; echo ok > {output}/out',
                         extra=", max_retries_failure=1")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out = train_out(project, cluster)
    record = ledger(out)
    attempts = record["attempts"]
    assert [a["class"] for a in attempts] == ["FAILED", "SUCCESS"], record
    assert attempts[0]["queued_resource"] == attempts[1]["queued_resource"] == emulator.deleted[0]
    assert emulator.queued_resource_names() == [] and given == ["refuse", "ok"], given
    (p,) = attempts[0]["provisioned"]
    assert attempts[1]["provisioned"] == []
    assert p["deleted_at"] is not None and p["deleted_at"] >= _iso(attempts[1]["ended_at"]) - 1, p
    assert p["why_deleted"], p
    assert record["retries"]["failure"] == {"used": 1, "max": 1}
    assert_closing_line_matches(out, attempts)
    row = _show_row(project, "train")
    held_hours = (p["deleted_at"] - p["active_at"]) / 3600  # billed from ACTIVE
    assert row["provisioned_chip_hours"] == pytest.approx(held_hours * 4, rel=0.02, abs=1e-6), (row, held_hours)


def test_tpu_cancel_during_the_back_off_amends_the_ledger_once(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # Attempt 1 fails and its healthy slice is kept for the retry; the runner is interrupted while
    # waiting to retry: the step's end's delete is refused, the exit handler's gets through, and
    # the ledger says until when it was last seen held.
    given = deletes_answer(emulator, ["refuse"])
    cluster = train_step(project, emulator, hosts, 'echo $MARINBUILD_ATTEMPT >> {output}/tries; exit 3',
                         extra=", max_retries_failure=2")
    out = train_out(project, cluster)
    result = run_until_signalled(
        "run", "--cluster", str(cluster), "--no-sync", cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "60"},
        ready=lambda: (out / "attempts.json").exists() and "retry 1" in (out / "logs" / "step.log").read_text())
    assert result.returncode != 0, result.stdout + result.stderr
    assert (out / "tries").read_text().split() == ["1"]
    assert given == ["refuse", "ok"], given
    assert emulator.queued_resource_names() == []
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["FAILED"], record
    (p,) = record["attempts"][0]["provisioned"]
    assert p["deleted_at"] is None and p["still_held_at"] >= p["active_at"], p
    assert "deletes are refused" in p["delete_error"], p
    assert_closing_line_matches(out, record["attempts"])
    marker = status_of(str(out))
    assert marker is not None and marker["status"] != "RUNNING", marker
    assert _used(marker["retries"]) == _used(record["retries"]), (marker, record["retries"])


def test_tpu_interrupt_while_the_deletes_are_slow_still_records_the_attempt(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # The API asks for another try at every delete for a while: a cancelled attempt's delete
    # is tried twice and gives up, so is the step's end's (the stopping runner waits only so
    # long for it), and the exit handler, patient, gets through.
    given = deletes_answer(emulator, [503] * 2 + [503] * 2 + [503])
    cluster = train_step(project, emulator, hosts, "touch {output}/started; sleep 60")
    out = train_out(project, cluster)
    result = run_until_signalled("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST,
                                 ready=lambda: (out / "started").exists())
    assert result.returncode != 0, result.stdout + result.stderr
    assert given.count("ok") == 1 and emulator.queued_resource_names() == [], given
    marker = status_of(str(out))
    assert marker is not None and marker["status"] != "RUNNING", (marker, result.stdout + result.stderr)
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["CANCELLED"], record
    (p,) = record["attempts"][0]["provisioned"]
    assert p["deleted_at"] is None and "currently unavailable" in p["delete_error"], p
    assert_closing_line_matches(out, record["attempts"])


def test_tpu_wall_time_passing_while_the_gang_runs_is_a_timeout_in_ledger_and_log(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts, "touch {output}/started; exec sleep 3093", walltime=4)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode != 0
    out = train_out(project, cluster)
    assert (out / "started").exists()  # the gang ran: the wall time passed on the hosts
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["TIMEOUT"], record
    assert record["attempts"][0]["provisioned"][0]["active_at"] is not None
    assert_closing_line_matches(out, record["attempts"])
    assert emulator.queued_resource_names() == []
    assert processes_gone("sleep 3093") == []


def test_tpu_preemption_then_success_closing_line_and_ledger_agree(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts,
                         'touch {output}/a$MARINBUILD_ATTEMPT; test $MARINBUILD_ATTEMPT -ge 2 || sleep 60; '
                         'echo ok > {output}/out')
    out = train_out(project, cluster)
    done = _first_attempt_preempted(project, emulator, cluster, out, FAST)
    assert done.returncode == 0, done.stdout + done.stderr
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["PREEMPTED", "SUCCESS"], record
    assert record["retries"]["preemption"]["used"] == 1
    assert_closing_line_matches(out, record["attempts"])
    marker = status_of(str(out))
    assert marker is not None and marker["status"] == "SUCCESS" and _used(marker["retries"])["preemption"] == 1


def test_tpu_preemption_retry_the_wall_time_rules_out_is_not_counted(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts,
                         'touch {output}/a$MARINBUILD_ATTEMPT; sleep 60', walltime=30)
    out = train_out(project, cluster)
    done = _first_attempt_preempted(project, emulator, cluster, out, {"MARINBUILD_RETRY_BASE_DELAY": "120"})
    assert done.returncode != 0, done.stdout + done.stderr
    assert not (out / "a2").exists()
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["PREEMPTED"], record
    assert record["retries"]["preemption"]["used"] == 0, record["retries"]
    marker = status_of(str(out))
    assert marker is not None and marker["status"] == "FAILED"
    assert _used(marker["retries"])["preemption"] == 0, marker
    assert _used(status_row(project, "train")["retries"])["preemption"] == 0
    assert_closing_line_matches(out, record["attempts"])
