"""Ray hang clocks, retry counts in Ray markers, TPU deletes the API refuses, and the TPU step
log's closing line, end to end: real `marinbuild` processes, a real Ray cluster, the TPU API
emulator on loopback with real sshd hosts, real signals."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.fixtures_created_slices import FAST, assert_closing_line_matches, ledger, train_out, train_step
from tests.fixtures_ssh import FakeFleet, processes_gone, wait_for
from tests.tpu_api_emulator import TpuApiEmulator, _ApiError

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

# ---------------------------------------------------------------------------------------
# Ray: the hang clock starts when the task starts.


def _ray_run(ray_cluster: RayCluster, project: Path, *args: str, env: dict[str, str] | None = None,
             timeout: float = 180) -> Any:
    return marinbuild("run", *args, "--backend", "ray", "--ray-address", ray_cluster.address, cwd=project,
                      env={**ray_cluster.env, **FAST, **(env or {})}, timeout=timeout)


def test_ray_step_queued_behind_another_and_interrupted_is_cancelled_not_hung(
        ray_cluster: RayCluster, project: Path) -> None:
    # "holder" takes the cluster's one "special" and keeps showing progress; "queued" waits
    # for it in Ray's queue well past its own progress timeout, then the runner gets Ctrl-C.
    write_marinfile(project, """
        from marinbuild import step
        from marinbuild.resources import Custom
        step("holder", cmd='touch {output}/started; '
                           'for i in $(seq 1 300); do touch "$MARINBUILD_PROGRESS"; sleep 0.2; done',
             resources=Custom("special", 1), progress_timeout=3)
        step("queued", cmd='touch {output}/started; exec sleep 3081', resources=Custom("special", 1),
             progress_timeout=0.5)
    """)
    plan = plan_json(project, "--resources", "special=1")
    holder, queued = Path(plan["holder"]["output_path"]), Path(plan["queued"]["output_path"])
    runner = start_marinbuild("run", "-j", "2", "--backend", "ray", "--ray-address", ray_cluster.address,
                              cwd=project, env={**ray_cluster.env, **FAST})
    try:
        wait_for(lambda: (holder / "started").exists() and (queued / "logs" / "step.log").exists(), timeout=90)
        submitted = time.time()
        # Four progress timeouts of "queued", each one more look of its watch, with nothing moving.
        wait_for(lambda: time.time() - submitted > 2.0, timeout=10)
        assert not (queued / "started").exists()  # still queued: the holder has the resource
        runner.send_signal(signal.SIGINT)
        stdout, stderr = runner.communicate(timeout=90)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode != 0, stdout + stderr
    log = (queued / "logs" / "step.log").read_text()
    assert "as a hang" not in log, log
    assert [a["class"] for a in ledger(queued)["attempts"]] == ["CANCELLED"], ledger(queued)
    assert [a["class"] for a in ledger(holder)["attempts"]] == ["CANCELLED"], ledger(holder)
    assert ledger(queued)["retries"]["hang"]["used"] == 0
    for out in (holder, queued):
        record = status_of(str(out))
        assert record is None or record["status"] != "RUNNING", record
    assert processes_gone("sleep 3081") == []


def test_ray_step_whose_progress_file_cannot_be_touched_is_still_called_a_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # Attempt 1 turns the progress path into a folder and fails; attempt 2 says nothing at all.
    write_marinfile(project, """
        from marinbuild import Cores, WTime, step
        step("blocked", cmd='if [ "$MARINBUILD_ATTEMPT" = 1 ]; then rm -f "$MARINBUILD_PROGRESS"; '
                            'mkdir -p "$MARINBUILD_PROGRESS"; exit 3; fi; exec sleep 3082',
             progress_timeout=0.5, max_retries_failure=1, max_retries_hang=0, resources=Cores(1) & WTime(T=60))
    """)
    result = _ray_run(ray_cluster, project)
    assert result.returncode != 0
    out = Path(plan_json(project)["blocked"]["output_path"])
    try:
        assert [a["class"] for a in ledger(out)["attempts"]] == ["FAILED", "HANG"], ledger(out)
    finally:
        assert processes_gone("sleep 3082") == []


def test_ray_step_that_deletes_its_progress_file_at_once_and_goes_silent_is_a_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # Its start is seen in its RUNNING marker, whatever it does to the progress file.
    write_marinfile(project, """
        from marinbuild import Cores, WTime, step
        for i in range(3):
            step(f"gone{i}", cmd='rm -f "$MARINBUILD_PROGRESS"; exec sleep 3084',
                 progress_timeout=1, max_retries_hang=0, resources=Cores(1) & WTime(T=30))
    """)
    result = _ray_run(ray_cluster, project, "-j", "3", "-k")
    assert result.returncode != 0
    plan = plan_json(project)
    try:
        for i in range(3):
            attempts = ledger(Path(plan[f"gone{i}"]["output_path"]))["attempts"]
            assert [a["class"] for a in attempts] == ["HANG"], attempts
    finally:
        assert processes_gone("sleep 3084") == []


def test_ray_step_that_deletes_its_progress_file_later_and_goes_silent_is_a_hang(
        ray_cluster: RayCluster, project: Path) -> None:
    # The step shows progress for a while, removes its progress file, then wedges: the removal
    # is one more change, and the silence after it a hang; its retry succeeds.
    write_marinfile(project, """
        from marinbuild import step
        step("wedge", cmd='for i in 1 2 3 4; do touch "$MARINBUILD_PROGRESS"; sleep 0.2; done; '
                          'rm -f "$MARINBUILD_PROGRESS"; '
                          'if [ "$MARINBUILD_ATTEMPT" = 1 ]; then exec sleep 3083; fi; echo ok > {output}/out',
             progress_timeout=2)
    """)
    result = _ray_run(ray_cluster, project)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project)["wedge"]["output_path"])
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["HANG", "SUCCESS"], record
    assert record["retries"]["hang"] == {"used": 1, "max": 2}
    assert processes_gone("sleep 3083") == []


# ---------------------------------------------------------------------------------------
# Ray: the task's final status marker carries the retry loop's counts.


def test_ray_status_shows_the_retry_counts_of_a_late_success_and_of_a_failure_for_good(
        ray_cluster: RayCluster, project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import step
        step("third_time", cmd='echo $MARINBUILD_ATTEMPT >> {output}/tries; '
                               'test "$MARINBUILD_ATTEMPT" -ge 3 || exit 7; echo ok > {output}/out',
             max_retries_failure=2)
        step("never", cmd='echo $MARINBUILD_ATTEMPT >> {output}/tries; exit 9', max_retries_failure=1)
    """)
    result = _ray_run(ray_cluster, project, "-j", "2", "-k")
    assert result.returncode != 0, result.stdout + result.stderr
    plan = plan_json(project)
    third, never = Path(plan["third_time"]["output_path"]), Path(plan["never"]["output_path"])
    assert (third / "tries").read_text().split() == ["1", "2", "3"]
    assert (never / "tries").read_text().split() == ["1", "2"]
    assert [a["class"] for a in ledger(third)["attempts"]] == ["FAILED", "FAILED", "SUCCESS"]
    assert [a["class"] for a in ledger(never)["attempts"]] == ["FAILED", "FAILED"]
    shown_third, shown_never = status_row(project, "third_time"), status_row(project, "never")
    assert shown_third["status"] == "SUCCESS" and shown_never["status"] == "FAILED"
    assert shown_third["retries"]["failure"] == {"used": 2, "max": 2}
    assert shown_never["retries"]["failure"] == {"used": 1, "max": 1}
    # What status reads from the task's own marker agrees with the ledger's head.
    for out, shown in ((third, shown_third), (never, shown_never)):
        head = ledger(out)["retries"]
        assert {k: v["used"] for k, v in shown["retries"].items()} == {k: v["used"] for k, v in head.items()}
    table = marinbuild_in_process("status", cwd=project).stdout
    assert "unknown" not in table, table


def test_ray_status_agrees_with_the_ledger_when_the_wall_time_refuses_a_retry(
        ray_cluster: RayCluster, project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import Cores, WTime, step
        step("short_lived", cmd='echo $MARINBUILD_ATTEMPT >> {output}/tries; exit 5', max_retries_failure=2,
             resources=Cores(1) & WTime(T=20))
    """)
    result = _ray_run(ray_cluster, project, env={"MARINBUILD_RETRY_BASE_DELAY": "60"})
    assert result.returncode != 0
    out = Path(plan_json(project)["short_lived"]["output_path"])
    assert (out / "tries").read_text().split() == ["1"]
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["FAILED"]
    shown = status_row(project, "short_lived")
    assert shown["status"] == "FAILED"
    assert shown["retries"]["failure"]["used"] == record["retries"]["failure"]["used"] == 0, (shown, record["retries"])


# ---------------------------------------------------------------------------------------
# TPU: queued resources the API refuses to delete; the step log's closing line.


def _refuse_deletes(emulator: TpuApiEmulator, n: int | None) -> list[str]:
    """The next ``n`` deletes of a queued resource (every one: None) are refused (403); returns
    the answers given, in order ("refused" or "deleted")."""
    real = emulator._delete_qr
    answers: list[str] = []

    def refusing(name: str, query: dict[str, str]) -> dict[str, Any]:
        if n is None or answers.count("refused") < n:
            answers.append("refused")
            raise _ApiError(403, "PERMISSION_DENIED", "deletes are refused for this test")
        out = real(name, query)
        answers.append("deleted")
        return out

    emulator._delete_qr = refusing  # type: ignore[method-assign]
    return answers


def test_tpu_delete_refused_at_attempt_end_is_retried_when_the_step_ends(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    answers = _refuse_deletes(emulator, 1)
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out = train_out(project, cluster)
    assert status_of(str(out))["status"] == "SUCCESS"
    assert (out / "out").read_text() == "ok\n"
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["SUCCESS"]
    held = record["attempts"][0]["provisioned"]
    assert len(held) == 1 and "deletes are refused" in held[0]["delete_error"]
    assert answers == ["refused", "deleted"]  # at the attempt's end, then at the step's
    assert held[0]["queued_resource"] in emulator.deleted and emulator.queued_resource_names() == []
    assert "could not delete queued resource " + held[0]["queued_resource"] in (out / "logs" / "step.log").read_text()
    assert_closing_line_matches(out, record["attempts"])
    shown = status_row(project, "train")
    assert shown["status"] == "SUCCESS"
    rows = marinbuild_in_process("show", "--json", cwd=project)
    assert rows.returncode == 0, rows.stderr
    assert next(r for r in json.loads(rows.stdout) if r["step"] == "train")["status"] == "SUCCESS"


def test_tpu_hours_of_a_resource_whose_delete_was_refused_are_counted(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    _refuse_deletes(emulator, 1)
    cluster = train_step(project, emulator, hosts, "sleep 0.5; echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    row = next(r for r in json.loads(marinbuild_in_process("show", "--json", cwd=project).stdout) if r["step"] == "train")
    assert row["accelerator_hours"] > 0
    assert row.get("provisioned_chip_hours", 0) >= row["accelerator_hours"], row


def test_tpu_delete_refused_until_exit_is_done_by_the_exit_handler(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    answers = _refuse_deletes(emulator, 2)
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out = train_out(project, cluster)
    assert status_of(str(out))["status"] == "SUCCESS"
    record = ledger(out)
    name = record["attempts"][0]["provisioned"][0]["queued_resource"]
    # Refused at the attempt's end and at the step's end; deleted as the runner exited.
    assert answers == ["refused", "refused", "deleted"]
    assert emulator.deleted == [name] and emulator.queued_resource_names() == []
    assert record["attempts"][0]["provisioned"][0]["deleted_at"] is None
    log = (out / "logs" / "step.log").read_text()
    assert log.count("could not delete queued resource " + name) == 2, log
    assert_closing_line_matches(out, record["attempts"])


def test_tpu_delete_refused_for_good_leaves_a_leftover_the_next_run_deletes(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    answers = _refuse_deletes(emulator, None)
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out = train_out(project, cluster)
    assert status_of(str(out))["status"] == "SUCCESS"
    left = emulator.queued_resource_names()
    assert len(left) == 1 and answers == ["refused"] * 3
    listed = json.loads(marinbuild_in_process("tpu", "list", "--cluster", str(cluster), "--json", cwd=project).stdout)
    assert [r["name"] for r in listed] == left
    del emulator._delete_qr  # the API deletes again
    again = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert again.returncode == 0, again.stdout + again.stderr
    assert left[0] in emulator.deleted and emulator.queued_resource_names() == []
    assert [a["class"] for a in ledger(out)["attempts"]] == ["SUCCESS"]  # up to date: not run again


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_tpu_signal_while_deletes_are_refused_leaves_nothing_after_exit(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, sig: signal.Signals) -> None:
    cluster = train_step(project, emulator, hosts, "touch {output}/started; sleep 60")
    out = train_out(project, cluster)
    answers = _refuse_deletes(emulator, 2)
    result = run_until_signalled("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST,
                                 ready=lambda: (out / "started").exists(), sig=sig)
    assert result.returncode != 0, result.stdout + result.stderr
    assert answers == ["refused", "refused", "deleted"]
    assert emulator.queued_resource_names() == []
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["CANCELLED"], record
    assert status_of(str(out))["status"] != "RUNNING"
    assert_closing_line_matches(out, record["attempts"])


def test_tpu_closing_line_counts_capacity_failures_and_a_cancel_while_waiting(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.fail_next(2)
    real = emulator._create_qr
    created: list[str] = []

    def create(parent: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        created.append(query.get("queuedResourceId", ""))
        if len(created) == 3:
            emulator.waiting_s = 300  # the third waits for capacity until the runner is interrupted
        return real(parent, query, body)

    emulator._create_qr = create  # type: ignore[method-assign]
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    out = train_out(project, cluster)
    result = run_until_signalled(
        "run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST,
        ready=lambda: len(created) == 3 and emulator.states().get(created[2], [""])[-1] == "WAITING_FOR_RESOURCES")
    assert result.returncode != 0, result.stdout + result.stderr
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["PROVISIONING", "PROVISIONING", "CANCELLED"], record
    assert sorted(created) == sorted(emulator.deleted)
    assert_closing_line_matches(out, record["attempts"])
    assert emulator.queued_resource_names() == []


def test_tpu_closing_line_counts_a_refused_create(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    real = emulator._create_qr
    refused: list[str] = []

    def refuse_once(parent: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        if not refused:
            refused.append(query.get("queuedResourceId", ""))
            raise _ApiError(400, "INVALID_ARGUMENT", "refused once for this test")
        return real(parent, query, body)

    emulator._create_qr = refuse_once  # type: ignore[method-assign]
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    out = train_out(project, cluster)
    record = ledger(out)
    assert len(refused) == 1
    # A 400 is the API refusing the request itself: final, in one line without the request's URL.
    assert result.returncode == 1, result.stdout + result.stderr + json.dumps(record)
    assert [a["class"] for a in record["attempts"]] == ["INFRA"]
    assert "refused in project emulated: refused once for this test" in record["attempts"][0]["message"]
    assert "http" not in record["attempts"][0]["message"] and emulator.queued_resource_names() == []
    assert_closing_line_matches(out, record["attempts"])


def test_tpu_closing_line_agrees_with_the_ledger_when_wall_time_passes_while_waiting(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.waiting_s = 300
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out", walltime=2)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode != 0
    out = train_out(project, cluster)
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["TIMEOUT"], record
    assert emulator.queued_resource_names() == []
    assert_closing_line_matches(out, record["attempts"])
