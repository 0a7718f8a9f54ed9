"""Slices created on demand under adverse conditions, end to end: real `marinbuild` runners, the
TPU API emulator on loopback whose nodes are real sshd hosts, real signals."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from tests.fixtures_created_slices import FAST, deletes_answer, ledger, train_out, train_step
from tests.fixtures_ssh import FakeFleet, wait_for
from tests.tpu_api_emulator import TpuApiEmulator, cluster_toml

from .helpers import marinbuild, marinbuild_in_process, start_marinbuild, status_row, write_marinfile

pytest_plugins = ["tests.fixtures_created_slices"]

def _lease_owner(out: Path) -> int | None:
    lease = out / ".marinbuild" / "lease"
    try:
        return int(json.loads(lease.read_text())["owner"]["pid"])
    except (OSError, ValueError, KeyError):
        return None


# ---------------------------------------------------------------------------------------
# A step whose wall time ran out is not a runner stopping: its slices get the usual patience.


def test_wall_time_timeout_deletes_its_queued_resource_with_the_usual_patience(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # The API says "try again" four times at the end of the timed-out attempt, as Google's
    # API does now and then; the run goes on with another step meanwhile.
    write_marinfile(project, """
from marinbuild import step, ResourceConfig
train = step("train", cmd="touch {output}/started; exec sleep 3093",
             resources=ResourceConfig.with_tpu("v4-8", slice_count=1, walltime=3))
other = step("other", cmd="while [ ! -e {output}/../go ]; do sleep 0.1; done; touch {output}/done")
""")
    cluster = project / "cluster.toml"
    # Five tries over 0.05 + 0.1 + 0.2 + 0.4 s (8 s with the default api_retry_delay).
    cluster.write_text(cluster_toml(emulator, hosts, api_retry_delay=0.05))
    out = train_out(project, cluster)
    given = deletes_answer(emulator, [503, 503, 503, 503])
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", "-j", "2", cwd=project, env=FAST)
    try:
        wait_for(lambda: (out / "attempts.json").exists(), timeout=60)
        assert runner.poll() is None  # the run goes on: "other" waits
        classes = [a["class"] for a in ledger(out)["attempts"]]
        still = emulator.queued_resource_names()
        (out.parent / "go").touch()
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert classes == ["TIMEOUT"], classes
    # Four "try again" answers are within the five tries of a delete.
    assert still == [] and given[:5] == ["503"] * 4 + ["ok"], (still, given, stdout + stderr)


# ---------------------------------------------------------------------------------------
# Two runners race for one step; the one holding it is SIGKILLed and the other takes over.


def test_a_step_taken_over_from_a_sigkilled_runner_leaves_no_queued_resource(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts,
                         "echo $MARINBUILD_ATTEMPT >> {output}/started; test -e {output}/../go || sleep 60")
    out = train_out(project, cluster)
    env = {**FAST, "MARINBUILD_LEASE_POLL": "0.2"}
    first = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=env)
    second = None
    try:
        wait_for(lambda: (out / "started").exists(), timeout=60)
        (made,) = emulator.queued_resource_names()
        lists = len(_listings(emulator))
        second = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=env)
        # The second runner looked for leftovers (the first one's is held by it) and waits for the lease.
        wait_for(lambda: len(_listings(emulator)) > lists, timeout=60)
        first.kill()
        first.communicate()
        (out.parent / "go").touch()
        stdout, stderr = second.communicate(timeout=90)
    finally:
        for r in (first, second):
            if r is not None and r.poll() is None:
                r.kill()
                r.communicate()
    assert second is not None and second.returncode == 0, stdout + stderr
    assert [a["class"] for a in ledger(out)["attempts"]][-1] == "SUCCESS"
    left = emulator.queued_resource_names()
    assert left == [], (made, left, stdout + stderr)


def _listings(emulator: TpuApiEmulator) -> list[tuple[str, str, dict[str, Any]]]:
    """Requests listing the queued resources (a runner looking for leftovers, `tpu list`)."""
    return [r for r in emulator.requests("GET") if r[1].endswith("/queuedResources")]


# ---------------------------------------------------------------------------------------
# Ctrl-C while the API takes its time to answer a create.


def _slow_creates(emulator: TpuApiEmulator, until: threading.Event, at_most: float) -> threading.Event:
    """Creates are acted on only once ``until`` is set (or ``at_most`` seconds passed): the API is
    slow to answer them. The event returned is set as each one arrives."""
    real = emulator.handle
    arrived = threading.Event()

    def handle(method: str, path: str, query: dict[str, str], body: dict[str, Any]) -> dict[str, Any]:
        if method == "POST" and path.endswith("/queuedResources"):
            arrived.set()
            until.wait(at_most)
        return real(method, path, query, body)

    emulator.handle = handle  # type: ignore[method-assign]
    return arrived


def test_ctrl_c_while_a_create_is_unanswered_leaves_no_queued_resource_unreported(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # The API answers the create after the runner's stop (ten seconds) is over, or after 20 s.
    runner_gone = threading.Event()
    arrived = _slow_creates(emulator, runner_gone, at_most=20)
    cluster = train_step(project, emulator, hosts, "touch {output}/started; sleep 60")
    out = train_out(project, cluster)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        assert arrived.wait(60)
        runner.send_signal(signal.SIGINT)
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        runner_gone.set()
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 130, stdout + stderr
    # The create the runner asked for is acted on once the API gets to it.
    wait_for(lambda: len(emulator.requests("POST")) == 1, timeout=30)
    assert not (out / "started").exists()
    left = emulator.queued_resource_names()
    shown = stdout + stderr
    assert not left or any(name in shown for name in left), (left, shown)
    # The step was started (its marker says RUNNING): it is stopped and recorded as stopped.
    assert status_row(project, "train")["status"] != "RUNNING", shown


# ---------------------------------------------------------------------------------------
# Bad [gcp] values.


def test_an_infinite_provision_timeout_is_refused_or_kept_readable(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    cluster.write_text(cluster.read_text().replace("provision_timeout = 120", "provision_timeout = inf"))
    assert "provision_timeout = inf" in cluster.read_text()
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    if result.returncode == 2:  # refused, as an infinite progress_timeout is
        assert len(result.stderr.strip().splitlines()) == 1 and "provision_timeout" in result.stderr, result.stderr
        assert "Traceback" not in result.stdout + result.stderr
        assert emulator.requests("POST") == []
        return
    assert result.returncode == 0, result.stdout + result.stderr
    out = train_out(project, cluster)

    def strict(token: str) -> None:
        raise AssertionError(f"attempts.json holds {token}, which is not JSON")

    json.loads((out / "attempts.json").read_text(), parse_constant=strict)
    assert status_row(project, "train")["retries"] is not None


# ---------------------------------------------------------------------------------------
# What `status` and `show` say afterwards.


def test_status_does_not_say_a_dead_runners_step_waits_for_capacity(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.waiting_s = 300
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        wait_for(lambda: (status_row(project, "train").get("provisioning") or {}).get("phase") == "waiting for capacity",
                 timeout=60)
    finally:
        runner.kill()
        runner.communicate()
    down = marinbuild("tpu", "down", "--cluster", str(cluster), cwd=project)
    assert down.returncode == 0, down.stdout + down.stderr
    assert emulator.queued_resource_names() == []
    row = status_row(project, "train")
    assert row["lease"] is None  # no runner: nothing waits for capacity, and the queued resource is gone
    assert row["provisioning"] is None, row
    table = marinbuild_in_process("status", cwd=project).stdout
    assert "waiting for capacity" not in table, table


def test_show_counts_the_hours_of_a_queued_resource_deleted_only_as_the_runner_exits(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # Refused at the attempt's end and at the step's: the exit handler deletes it.
    given = deletes_answer(emulator, ["refuse", "refuse"])
    cluster = train_step(project, emulator, hosts, "sleep 1; echo ok > {output}/out")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert given == ["refuse", "refuse", "ok"] and emulator.queued_resource_names() == []
    out = train_out(project, cluster)
    (held,) = ledger(out)["attempts"][0]["provisioned"]
    assert held["deleted_at"] is None and "refused" in held["delete_error"]
    shown = marinbuild_in_process("show", "--json", cwd=project)
    assert shown.returncode == 0, shown.stderr
    row = next(r for r in json.loads(shown.stdout) if r["step"] == "train")
    # It was held at least as long as the step ran on it.
    assert row["accelerator_hours"] > 0
    assert row.get("provisioned_chip_hours", 0) >= row["accelerator_hours"], row


# ---------------------------------------------------------------------------------------
# Retries counted, attempts numbered.


def test_a_preemption_retry_cancelled_during_its_back_off_is_not_counted(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # Attempt 1 is preempted; the runner is stopped while it waits to retry: no retry was made.
    cluster = train_step(project, emulator, hosts, "touch {output}/a$MARINBUILD_ATTEMPT; sleep 60")
    out = train_out(project, cluster)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project,
                              env={"MARINBUILD_RETRY_BASE_DELAY": "60"})
    try:
        wait_for(lambda: (out / "a1").exists(), timeout=60)
        emulator.preempt(emulator.active_nodes()[-1])
        wait_for(lambda: "preemption retry 1" in (out / "logs" / "step.log").read_text(), timeout=60)
        runner.send_signal(signal.SIGTERM)
        stdout, stderr = runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()
    assert runner.returncode == 130, stdout + stderr
    assert not (out / "a2").exists()
    record = ledger(out)
    assert [a["class"] for a in record["attempts"]] == ["PREEMPTED"], record
    assert emulator.queued_resource_names() == []
    # As when the wall time rules the retry out: a retry that never ran is not counted.
    assert record["retries"]["preemption"]["used"] == 0, record["retries"]
    assert status_row(project, "train")["retries"]["preemption"]["used"] == 0
    assert "preemptions 1/100" not in stdout + stderr, stdout + stderr


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# ---------------------------------------------------------------------------------------
# A bad TPU value in the Marinfile: one line naming the Marinfile's line.


def test_an_unknown_tpu_type_is_reported_at_the_marinfiles_line(project: Path) -> None:
    write_marinfile(project, """
from marinbuild import step, ResourceConfig

train = step("train", cmd="true", resources=ResourceConfig.with_tpu("v4-7", slice_count=2))
""")
    result = marinbuild_in_process("plan", cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line, line
    assert "v4-7" in line and "<string>" not in line, line
    assert "Marinfile.py:4" in line, line
