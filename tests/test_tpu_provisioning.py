"""TPU slices created on demand, end to end: `marinbuild run` against the TPU API emulator.

Real parts throughout: the google-cloud-tpu client (REST) talks to tests/tpu_api_emulator.py on
loopback, whose nodes are real sshd hosts on 127.0.0.N; runners are real `marinbuild` processes
receiving real signals; bucket locations come from the GCS emulator.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests.fixtures_ssh import FakeFleet, wait_for
from tests.tpu_api_emulator import TpuApiEmulator, cluster_toml

from .helpers import marinbuild, marinbuild_in_process, plan_json, start_marinbuild, status_of, write_marinfile

pytest_plugins = ["tests.fixtures_gcs", "tests.fixtures_created_slices"]

FAST = {"MARINBUILD_RETRY_BASE_DELAY": "0.05"}

# Each host writes what it was told, under a name saying which attempt and process it is
# (renamed into place whole: a test waiting for the file may preempt the host at once).
RECORD = (
    'env | grep -E "^(MARINBUILD|MEGASCALE)_" | grep -v GANG_TOKEN | sort '
    "> {output}/.a$MARINBUILD_ATTEMPT-p$MARINBUILD_PROCESS_ID.part; "
    'echo "$FAKE_HOST_ID" >> {output}/.a$MARINBUILD_ATTEMPT-p$MARINBUILD_PROCESS_ID.part; '
    "mv {output}/.a$MARINBUILD_ATTEMPT-p$MARINBUILD_PROCESS_ID.part {output}/a$MARINBUILD_ATTEMPT-p$MARINBUILD_PROCESS_ID.env"
)


def setup(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, cmd: str, *, slices: int = 2,
          tpu_type: str = "v4-8", extra: str = "", **gcp: object) -> Path:
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
train = step("train", cmd={cmd!r}, resources=ResourceConfig.with_tpu({tpu_type!r}, slice_count={slices}))
{extra}
""")
    cluster = project / "cluster.toml"
    cluster.write_text(cluster_toml(emulator, hosts, **gcp))
    return cluster


def attempts_of(project: Path, cluster: Path) -> tuple[Path, list[dict]]:
    out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
    return out, json.loads((out / "attempts.json").read_text())["attempts"]


def read_env(path: Path) -> dict[str, str]:
    lines = path.read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines[:-1])
    env["FAKE_HOST_ID"] = lines[-1]
    return env


def test_provisioned_multislice_step_runs_on_every_host_and_leaves_nothing(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = setup(project, emulator, hosts, RECORD, slices=2, tpu_type="v4-16")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    out, attempts = attempts_of(project, cluster)
    seen = [read_env(out / f"a1-p{p}.env") for p in range(4)]
    created = emulator.requests("POST", "/queuedResources")
    assert len(created) == 1 and created[0][2]["tpu"]["nodeSpec"][0]["multisliceParams"]["nodeCount"] == 2
    qr = attempts[0]["provisioned"][0]["queued_resource"]
    nodes = [f"{qr}-0", f"{qr}-1"]
    # Every MEGASCALE_* value comes from this attempt's nodes, worker order within each.
    coordinator = f"{hosts.hosts[0].ip}:8081"
    assert [s["MEGASCALE_SLICE_ID"] for s in seen] == ["0", "0", "1", "1"]
    assert {s["MEGASCALE_COORDINATOR_ADDRESS"] for s in seen} == {coordinator}
    assert {s["MEGASCALE_NUM_SLICES"] for s in seen} == {"2"} and {s["MEGASCALE_PORT"] for s in seen} == {"8081"}
    assert [s["FAKE_HOST_ID"] for s in seen] == ["0", "1", "2", "3"]
    assert [s["MARINBUILD_WORKER_ID"] for s in seen] == ["0", "1", "0", "1"]
    assert qr in emulator.deleted and emulator.queued_resource_names() == []
    assert [a["class"] for a in attempts] == ["SUCCESS"]
    held = attempts[0]["provisioned"][0]
    assert held["created_at"] <= held["active_at"] <= held["deleted_at"] and held["why_deleted"] == "attempt ended"
    assert status_of(str(out))["status"] == "SUCCESS"
    assert all(n.startswith(qr) for n in nodes)


def test_two_preemptions_mean_two_new_slices(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # Attempts 1 and 2 wait to be preempted; attempt 3 finishes.
    cmd = RECORD + "; test $MARINBUILD_ATTEMPT -ge 3 || sleep 60"
    cluster = setup(project, emulator, hosts, cmd, slices=2)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
        for attempt in (1, 2):
            wait_for(lambda a=attempt: all((out / f"a{a}-p{p}.env").exists() for p in range(2)), timeout=60)
            emulator.preempt(emulator.active_nodes()[-1])
        stdout, stderr = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, stdout + stderr
    _, attempts = attempts_of(project, cluster)
    assert [a["class"] for a in attempts] == ["PREEMPTED", "PREEMPTED", "SUCCESS"]
    qrs = [a["provisioned"][0]["queued_resource"] for a in attempts]
    assert len(set(qrs)) == 3 and set(qrs) <= set(emulator.deleted) and emulator.queued_resource_names() == []
    coordinators = []
    for a in (1, 2, 3):
        seen = [read_env(out / f"a{a}-p{p}.env") for p in range(2)]
        assert {s["MARINBUILD_ATTEMPT"] for s in seen} == {str(a)}
        coordinators.append(seen[0]["MEGASCALE_COORDINATOR_ADDRESS"])
        assert {s["MEGASCALE_COORDINATOR_ADDRESS"] for s in seen} == {coordinators[-1]}
    assert len(set(coordinators)) == 3  # new hosts each time, and values computed from them


def test_a_preemption_the_api_reports_first_is_shown_as_one(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # The API marks the node PREEMPTED while its hosts still answer: only the TPU API watcher
    # sees it, tears the gang down, and the attempt is shown and counted as a preemption.
    cmd = RECORD + "; test $MARINBUILD_ATTEMPT -ge 2 || sleep 60"
    cluster = setup(project, emulator, hosts, cmd, slices=2)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
        wait_for(lambda: all((out / f"a1-p{p}.env").exists() for p in range(2)), timeout=60)
        preempted = emulator.active_nodes()[-1]
        emulator.preempt(preempted, stop_hosts=False)
        stdout, stderr = runner.communicate(timeout=120)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode == 0, stdout + stderr
    _, attempts = attempts_of(project, cluster)
    assert [a["class"] for a in attempts] == ["PREEMPTED", "SUCCESS"]
    shown = stdout + stderr
    assert "attempt 1: PREEMPTED: the TPU API reports node(s) " + preempted.split("/")[-1] + " preempted" in shown, shown
    assert "attempt 1: CANCELLED" not in shown and "2 attempt(s): PREEMPTED, SUCCESS" in shown, shown


def test_capacity_failures_are_outlasted_and_counted_apart(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.fail_next(2)
    cluster = setup(project, emulator, hosts, RECORD, slices=1)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    _, attempts = attempts_of(project, cluster)
    assert [a["class"] for a in attempts] == ["PROVISIONING", "PROVISIONING", "SUCCESS"]
    assert "no more capacity" in attempts[0]["message"]
    assert "provisioning retry 2 (within 120 s) in " in result.stdout + result.stderr
    assert len(emulator.deleted) == 3 and emulator.queued_resource_names() == []
    out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
    # The step log's closing line counts the attempts that never reached a host too.
    assert "3 attempt(s): PROVISIONING, PROVISIONING, SUCCESS" in (out / "logs" / "step.log").read_text()
    shown = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)
    retries = next(r for r in shown if r["name"] == "train")["retries"]
    assert retries["provisioning"]["used"] == 2 and retries["preemption"]["used"] == 0
    # Hours held count the slices from creation to deletion, failed ones too, apart from run time.
    row = next(r for r in json.loads(marinbuild_in_process("show", "--json", cwd=project).stdout) if r["step"] == "train")
    assert row["provisioned_chip_hours"] > row["accelerator_hours"] > 0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.parametrize("phase", ["provisioning", "running"])
def test_a_signal_leaves_no_queued_resource(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet,
                                            sig: signal.Signals, phase: str) -> None:
    if phase == "provisioning":
        emulator.waiting_s = 300
    cluster = setup(project, emulator, hosts, RECORD + "; sleep 60", slices=1)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        if phase == "provisioning":
            wait_for(lambda: "WAITING_FOR_RESOURCES" in str(emulator.states()), timeout=60)
            if sig == signal.SIGINT:  # status tells what the running step waits on
                wait_for(lambda: _waiting_shown(project) is not None, timeout=30)
                note = _waiting_shown(project)
                assert note is not None and note["phase"] == "waiting for capacity"
                assert note["queued_resource"] == emulator.queued_resource_names()[0]
        else:
            out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
            wait_for(lambda: (out / "a1-p0.env").exists(), timeout=60)
        assert emulator.queued_resource_names()
        runner.send_signal(sig)
        runner.communicate(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode != 0
    assert emulator.queued_resource_names() == []


def _waiting_shown(project: Path) -> dict | None:
    rows = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)
    return next(r for r in rows if r["name"] == "train")["provisioning"]


def test_a_sigkilled_runners_leftover_is_deleted_by_the_next_run(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = setup(project, emulator, hosts, RECORD + "; test -e {output}/../go || sleep 60", slices=1)
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
    try:
        wait_for(lambda: (out / "a1-p0.env").exists(), timeout=60)
    finally:
        runner.kill()
        runner.communicate()
    left = emulator.queued_resource_names()
    assert len(left) == 1
    listed = json.loads(marinbuild_in_process("tpu", "list", "--cluster", str(cluster), "--json", cwd=project).stdout)
    assert [(r["name"], r["step"], r["held_by"]) for r in listed] == [(left[0], "train", None)]
    (out.parent / "go").touch()
    wait_for(lambda: not _lease_alive(out), timeout=30)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert left[0] in emulator.deleted and emulator.queued_resource_names() == []


def _lease_alive(out: Path) -> bool:
    lease = out / ".marinbuild" / "lease"
    if not lease.exists():
        return False
    pid = json.loads(lease.read_text())["owner"]["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_host_keys_come_from_the_api_and_a_differing_one_is_refused(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, tmp_path: Path) -> None:
    # known_hosts is empty and unknown keys are refused: only the API's keys let this run in.
    cluster = setup(project, emulator, hosts, RECORD, slices=1, tpu_type="v4-16")
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    assert (hosts.root / "no_known_hosts").read_text() == ""  # nothing was written there
    other = tmp_path / "other"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    liar = hosts.hosts[2].ip  # the next slice's worker 0: the first run took hosts 0 and 1
    emulator.report_host_key(liar, " ".join(other.with_suffix(".pub").read_text().split()[:2]))
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", "--force", "train", cwd=project, env=FAST)
    assert result.returncode == 1
    out, attempts = attempts_of(project, cluster)
    last = attempts[-1]
    assert last["class"] == "INFRA" and f"{liar}: host key" in last["message"]
    refused = [h for h in last["hosts"] if h["host"] == liar]
    assert refused and refused[0]["infra_error"].count("\n") == 0
    assert not any(read_env(p)["FAKE_HOST_ID"] == "4" for p in out.glob(f"a{last['attempt']}-p*.env"))
    assert emulator.queued_resource_names() == []


def test_cross_region_inputs_are_refused_at_plan_time(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, gcs_emulator: object) -> None:
    from tests.fixtures_gcs import gcs_filesystem

    fs = gcs_filesystem(gcs_emulator)  # type: ignore[arg-type]
    for bucket, location in (("far-data", "US-EAST1"), ("near-data", "US-CENTRAL2")):
        if not fs.exists(bucket):
            fs.mkdir(bucket)
        # The emulator keeps a location given by PATCH (it ignores one given at creation).
        fs.call("PATCH", "b/{}", bucket, json={"location": location}, json_out=True)
    extra = ('far = step("far", cmd="true", config={"data": "gs://far-data/set", "near": "gs://near-data/x"}, '
             'resources=ResourceConfig.with_tpu("v4-8"))')
    cluster = setup(project, emulator, hosts, RECORD, slices=1, extra=extra)
    env = {**FAST, **gcs_emulator.env}  # type: ignore[attr-defined]
    refused = marinbuild("run", "--cluster", str(cluster), "--no-sync", "far", cwd=project, env=env)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = refused.stderr.strip()
    assert len(line.splitlines()) == 1 and "gs://far-data (us-east1)" in line and "us-central2" in line
    assert "near-data" not in line and "--allow-cross-region" in line
    assert emulator.requests("POST") == []  # refused before anything was created
    plan = marinbuild("plan", "--cluster", str(cluster), "far", cwd=project, env=env)
    assert plan.returncode == 2 and "gs://far-data" in plan.stderr
    allowed = marinbuild("run", "--cluster", str(cluster), "--no-sync", "--allow-cross-region", "far", cwd=project, env=env)
    assert allowed.returncode == 0, allowed.stdout + allowed.stderr
    near = marinbuild("run", "--cluster", str(cluster), "--no-sync", "train", cwd=project, env=env)
    assert near.returncode == 0, near.stdout + near.stderr


def test_waiting_for_capacity_and_provisioning_are_shown(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.waiting_s = emulator.provisioning_s = 0.5
    cluster = setup(project, emulator, hosts, RECORD, slices=1)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = (result.stdout + result.stderr).splitlines()
    waiting = next(i for i, ln in enumerate(lines) if "[train]" in ln and "waiting for capacity" in ln)
    provisioning = next(i for i, ln in enumerate(lines) if "[train]" in ln and ": provisioning" in ln)
    assert waiting < provisioning and re.search(r"provisioning \(\d+ s\)", lines[provisioning])
    out = Path(plan_json(project, "--cluster", str(cluster))["train"]["output_path"])
    log = (out / "logs" / "step.log").read_text()  # the step's own log, beside its hosts'
    assert re.search(r"marinbuild: queued resource \S+ \(1 x v4-8\): waiting for capacity \(\d+ s\)", log), log


def test_a_silent_provisioned_step_is_killed_as_a_hang_and_retried_on_the_same_healthy_slice(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
step("train", cmd={RECORD + "; test $MARINBUILD_ATTEMPT -ge 2 || sleep 60"!r}, progress_timeout=2,
     resources=ResourceConfig.with_tpu("v4-8", slice_count=2))
""")
    cluster = project / "cluster.toml"
    cluster.write_text(cluster_toml(emulator, hosts))
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    assert result.returncode == 0, result.stdout + result.stderr
    _, attempts = attempts_of(project, cluster)
    assert [a["class"] for a in attempts] == ["HANG", "SUCCESS"]
    qrs = [a["queued_resource"] for a in attempts]
    # A new queued resource is a new wait for capacity: a healthy slice serves the retry.
    assert qrs[0] == qrs[1] and emulator.deleted == [qrs[0]] and emulator.queued_resource_names() == []
    assert len(attempts[0]["provisioned"]) == 1 and attempts[1]["provisioned"] == []
    assert attempts[0]["provisioned"][0]["deleted_at"] is not None  # the step's end deleted it
