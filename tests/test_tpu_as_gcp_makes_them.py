"""TPU slices made on demand as Google's API really makes them, through the real command line.

Hosts are real sshd processes on loopback; the TPU API emulator makes them as GCP does: sshd,
the login user and the host keys arriving after ACTIVE, deletes and creates that take time,
FAILED queued resources with their error codes, 403 and 400 answers, bursts of 503, unhealthy
nodes. Each test drives one of its controls.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from tests.fixtures_created_slices import FAST, ledger, train_out, train_step
from tests.fixtures_ssh import FakeFleet, wait_for
from tests.tpu_api_emulator import TpuApiEmulator

from .helpers import marinbuild, marinbuild_in_process, start_marinbuild

pytest_plugins = ["tests.fixtures_created_slices"]


def _run(project: Path, cluster: Path, *args: str) -> tuple[int, str]:
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", *args, cwd=project, env=FAST)
    return result.returncode, result.stdout + result.stderr


def _step_log(out: Path) -> str:
    return (out / "logs" / "step.log").read_text()


@pytest.mark.parametrize("key_style", ["joined", "typed"])
def test_sshd_logins_and_host_keys_arriving_after_active_are_waited_for(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, key_style: str) -> None:
    emulator.sshd_after_s = 1.0      # connection refused at first
    emulator.logins_after_s = 2.0    # then sshd up but the key not authorized
    emulator.keys_after_s = 1.5      # guest attributes empty at first
    emulator.key_style = key_style   # several keys in one entry (an unreadable one first), or TYPE BASE64 values
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    rc, text = _run(project, cluster)
    assert rc == 0, text
    out = train_out(project, cluster)
    attempts = ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["SUCCESS"], attempts  # no retry burnt on a slow boot
    log = _step_log(out)
    assert "booting: 0/1 hosts reachable" in log, log
    assert (out / "out").read_text() == "ok\n" and emulator.queued_resource_names() == []


def test_status_shows_the_hosts_booting(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    emulator.sshd_after_s = 300.0  # down until `status` has shown them booting
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        seen: list[str] = []

        def booting() -> bool:
            seen.append(marinbuild_in_process("status", cwd=project).stdout)
            return "booting: 0/1 hosts reachable" in seen[-1]

        wait_for(booting, timeout=60)
        emulator.boot_now()
        assert runner.wait(timeout=120) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    assert [a["class"] for a in ledger(train_out(project, cluster))["attempts"]] == ["SUCCESS"]


def test_failures_on_a_healthy_slice_rerun_on_it(project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts, "test $MARINBUILD_ATTEMPT -ge 3 || exit 3; echo ok > {output}/out")
    rc, text = _run(project, cluster, "--retries", "2")
    assert rc == 0, text
    attempts = ledger(train_out(project, cluster))["attempts"]
    assert [a["class"] for a in attempts] == ["FAILED", "FAILED", "SUCCESS"]
    shared = {a["queued_resource"] for a in attempts}
    assert len(shared) == 1 and len(emulator.requests("POST", "/queuedResources")) == 1
    assert [len(a["provisioned"]) for a in attempts] == [1, 0, 0]  # made once, named by each attempt
    assert emulator.deleted == list(shared) and emulator.queued_resource_names() == []


def test_an_unhealthy_node_ends_the_attempt_as_lost_and_a_new_slice_serves_the_retry(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts,
                         "test $MARINBUILD_ATTEMPT -ge 2 || (touch {output}/../started; sleep 60); echo ok > {output}/out")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    out = train_out(project, cluster)
    try:
        wait_for(lambda: (out.parent / "started").exists(), timeout=60)
        emulator.set_health(emulator.active_nodes()[0], "UNHEALTHY_MAINTENANCE")
        assert runner.wait(timeout=120) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        runner.communicate()
    attempts = ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["INFRA", "SUCCESS"], attempts
    assert "UNHEALTHY_MAINTENANCE: slice lost" in attempts[0]["message"]
    assert attempts[0]["queued_resource"] != attempts[1]["queued_resource"]
    assert attempts[0]["provisioned"][0]["why_deleted"] == "lost"
    assert emulator.queued_resource_names() == []


def test_a_slow_delete_blocks_neither_the_step_nor_a_ctrl_c(project: Path, emulator: TpuApiEmulator,
                                                           hosts: FakeFleet) -> None:
    emulator.delete_op_s = 90.0  # Google's deletes take a minute or more
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    rc, text = _run(project, cluster)
    assert rc == 0 and "could not delete" not in text, text
    out = train_out(project, cluster)
    first = ledger(out)["attempts"][0]["provisioned"][0]
    assert first["deleted_at"] is not None and first["why_deleted"] == "attempt ended"
    assert emulator.states()[first["queued_resource"]][-1] == "DELETING"
    # Ctrl-C while the next step runs: the record is written at once, the delete left to the API.
    cluster = train_step(project, emulator, hosts, "touch {output}/../running2; sleep 60")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", "--force", "train", cwd=project, env=FAST)
    out = train_out(project, cluster)
    try:
        wait_for(lambda: (out.parent / "running2").exists(), timeout=60)
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
        stdout, stderr = runner.communicate()
    assert runner.returncode == 130, stdout + stderr
    assert "could not delete" not in stdout + stderr
    last = ledger(out)["attempts"][-1]
    assert last["class"] == "CANCELLED"
    held = last["provisioned"][0]
    assert held["deleted_at"] is not None and emulator.states()[held["queued_resource"]][-1] == "DELETING"
    status = json.loads((out / ".marinbuild" / "status").read_text())
    assert status["status"] != "RUNNING"


def test_failed_queued_resources_are_judged_by_their_code(project: Path, emulator: TpuApiEmulator,
                                                         hosts: FakeFleet) -> None:
    emulator.fail_next(2, "capacity")
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    rc, text = _run(project, cluster)
    assert rc == 0, text
    out = train_out(project, cluster)
    assert [a["class"] for a in ledger(out)["attempts"]] == ["PROVISIONING", "PROVISIONING", "SUCCESS"]
    for why, words in (("quota", "quota TPUV4sPodPerProjectPerZoneForTPUAPI exhausted"),
                       ("invalid", "invalid configuration")):
        emulator.fail_next(1, why)
        creates = len(emulator.requests("POST", "/queuedResources"))
        rc, text = _run(project, cluster, "--force", "train")
        assert rc == 1, text
        last = ledger(out)["attempts"][-1]
        assert last["class"] == "PROVISIONING" and words in last["message"], last
        assert len(emulator.requests("POST", "/queuedResources")) == creates + 1  # not retried as capacity
    assert emulator.queued_resource_names() == []


def test_403_and_400_on_create_are_final_and_one_line(project: Path, emulator: TpuApiEmulator,
                                                      hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    for code, words in ((403, "permission tpu.queuedResources.create is missing"),
                        (400, "Invalid value for field 'queuedResource.tpu.nodeSpec[0].node.tags[0]'")):
        emulator.refuse_creates(1, code)
        creates = len(emulator.requests("POST", "/queuedResources"))
        rc, text = _run(project, cluster, "--force", "train")
        assert rc == 1, text
        attempts = ledger(train_out(project, cluster))["attempts"]
        message = attempts[-1]["message"]
        assert attempts[-1]["class"] == "INFRA" and words in message and "project emulated" in message, message
        assert "http" not in message and "%24alt" not in text and "\n" not in message
        assert len(emulator.requests("POST", "/queuedResources")) == creates + 1  # asked once
        assert "could not delete" not in text  # nothing was made, so nothing is held
    assert emulator.queued_resource_names() == []


def test_a_burst_of_503_while_waiting_keeps_the_queue_place(project: Path, emulator: TpuApiEmulator,
                                                            hosts: FakeFleet) -> None:
    emulator.waiting_s = 2.0
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    # One call's five tries then span 0.05 + 0.1 + 0.2 + 0.4 s (0.75 s; 8 s with the default).
    cluster.write_text(cluster.read_text() + "api_retry_delay = 0.05\n")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    try:
        wait_for(lambda: bool(emulator.queued_resource_names()), timeout=60)
        emulator.unavailable_for(3.0)  # four times as long as one call's five tries
        assert runner.wait(timeout=120) == 0
    finally:
        if runner.poll() is None:
            runner.kill()
        stdout, stderr = runner.communicate()
    out = train_out(project, cluster)
    attempts = ledger(out)["attempts"]
    assert [a["class"] for a in attempts] == ["SUCCESS"]
    assert len(emulator.requests("POST", "/queuedResources")) == 1
    assert len(emulator.refused) >= 5, emulator.refused  # a call's every try met the burst
    # The run's done line names the wait too, apart from the step's own time.
    done = re.search(r"done\s+train \((\d+\.\d) s after (\d+(?:\.\d)?) s waiting for capacity\)", stdout + stderr)
    assert done is not None and float(done.group(2)) >= 2.0, stdout + stderr
    # The wait is said apart from the time on hosts, and billed apart.
    waited = re.search(r"1 attempt\(s\): SUCCESS; (\d+\.\d) s waiting for capacity before ACTIVE;", _step_log(out))
    assert waited is not None and float(waited.group(1)) >= 2.0, _step_log(out)
    (made,) = attempts[0]["provisioned"]
    assert made["waiting_s"] >= 2.0 and made["active_at"] - made["created_at"] == pytest.approx(made["waiting_s"], abs=0.01)


def test_the_request_names_the_tier_the_bound_and_the_generations_image(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    text = cluster.read_text().replace('runtime_version = "tpu-ubuntu2204-base"\n', "")
    cluster.write_text(text + 'capacity = "spot"\n')
    rc, out = _run(project, cluster)
    assert rc == 0, out
    body = emulator.requests("POST", "/queuedResources")[-1][2]
    assert "spot" in body and "guaranteed" not in body
    assert body["tpu"]["nodeSpec"][0]["node"]["runtimeVersion"] == "tpu-ubuntu2204-base"
    valid = float(body["queueingPolicy"]["validUntilDuration"].rstrip("s"))
    assert 60 <= valid <= 120  # what is left of provision_timeout (120 s in this cluster file)


def test_a_sigkilled_runs_leftover_is_seen_through_any_spelling_of_the_prefix(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, tmp_path: Path) -> None:
    real = tmp_path / "outputs"
    real.mkdir()
    link = tmp_path / "linked"
    link.symlink_to(real)
    cluster = train_step(project, emulator, hosts, "touch {output}/../started; sleep 60")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", "--prefix", str(link),
                              cwd=project, env=FAST)
    try:
        wait_for(lambda: (real / "started").exists(), timeout=60)
    finally:
        runner.kill()
        runner.communicate()
    left = emulator.queued_resource_names()
    assert len(left) == 1
    for spelling in (str(real), str(tmp_path / "outputs" / ".." / "outputs")):
        listed = marinbuild_in_process("tpu", "list", "--cluster", str(cluster), "--prefix", spelling, "--json", cwd=project)
        assert [r["name"] for r in json.loads(listed.stdout)] == left, listed.stdout + listed.stderr
        assert [r["step"] for r in json.loads(listed.stdout)] == ["train"]
    wait_for(lambda: not _runner_alive(real), timeout=30)
    down = marinbuild("tpu", "down", "--cluster", str(cluster), "--prefix", str(real), cwd=project)
    assert down.returncode == 0, down.stdout + down.stderr
    assert left[0] in emulator.deleted and emulator.queued_resource_names() == []


def _runner_alive(prefix: Path) -> bool:
    for lease in prefix.glob("*/.marinbuild/lease"):
        pid = json.loads(lease.read_text())["owner"]["pid"]
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return True
    return False


def test_the_emulators_controls_answer_over_http(emulator: TpuApiEmulator) -> None:
    from urllib.request import Request, urlopen

    def post(path: str) -> dict[str, object]:
        with urlopen(Request(emulator.endpoint + path, method="POST")) as answer:
            return json.loads(answer.read())

    assert post("/emulator/fail/2/quota") == {"fail_next": 2, "why": "quota"}
    assert post("/emulator/refuse-creates/1/403") == {"refuse_creates": 1, "code": 403}
    assert post("/emulator/delete-op-s/90") == {"delete_op_s": 90.0}
    assert post("/emulator/keys-after-s/30") == {"keys_after_s": 30.0}
    assert post("/emulator/key-style/joined") == {"key_style": "joined"}
    assert post("/emulator/unavailable-for/0.5")["unavailable_for"] == 0.5
    assert (emulator.failures, emulator.delete_op_s, emulator.keys_after_s) == (["quota", "quota"], 90.0, 30.0)
    with urlopen(emulator.endpoint + "/emulator/state") as answer:
        assert json.loads(answer.read())["queued_resources"] == {}


@pytest.mark.parametrize("late", ["sshd", "keys"])
def test_hosts_later_than_ssh_ready_timeout_are_waited_for_again_on_the_kept_slice(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet, late: str) -> None:
    # sshd or the guest agent's host keys arriving after the bound: the attempt is INFRA (not a
    # final host-key refusal), and the retry on the same slice waits for them anew instead of
    # spending every infra retry at once on hosts that are only slow.
    setattr(emulator, f"{late}_after_s", 6.0)
    cluster = train_step(project, emulator, hosts, "echo ok > {output}/out")
    cluster.write_text(cluster.read_text() + "ssh_ready_timeout = 4\n")
    rc, text = _run(project, cluster)
    assert rc == 0, text
    attempts = ledger(train_out(project, cluster))["attempts"]
    assert [a["class"] for a in attempts] == ["INFRA", "SUCCESS"], text
    assert len({a["queued_resource"] for a in attempts}) == 1
    assert len(emulator.requests("POST", "/queuedResources")) == 1
    if late == "keys":
        assert "the TPU API reported no host key for" in attempts[0]["message"], attempts[0]["message"]
        assert "known_hosts" not in attempts[0]["message"]
    assert "Traceback" not in text
    assert emulator.queued_resource_names() == []


def test_a_stop_is_recorded_without_waiting_for_the_watchs_poll_in_flight(
        project: Path, emulator: TpuApiEmulator, hosts: FakeFleet) -> None:
    # The running step's watch is asking for the zone's nodes while the API answers "try again":
    # a Ctrl-C then records the step at once, not once that poll has been answered.
    cluster = train_step(project, emulator, hosts, "touch {output}/../running2; sleep 60")
    runner = start_marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, env=FAST)
    out = train_out(project, cluster)
    try:
        wait_for(lambda: (out.parent / "running2").exists(), timeout=60)
        # Long, so that only a stop that waited for the poll could be recorded after it.
        burst_end = time.time() + 30.0
        emulator.unavailable_for(30.0, path_contains="/nodes")
        wait_for(lambda: any(p.endswith("/nodes") for p in emulator.refused), timeout=30)  # the watch's poll
        signalled = time.time()
        runner.send_signal(signal.SIGINT)
        runner.wait(timeout=60)
    finally:
        if runner.poll() is None:
            runner.kill()
        stdout, stderr = runner.communicate()
    assert runner.returncode == 130 and "Traceback" not in stdout + stderr, stdout + stderr
    status = json.loads((out / ".marinbuild" / "status").read_text())
    assert status["status"] == "FAILED" and status["time"] < burst_end, (status["time"], signalled, burst_end)
    assert [a["class"] for a in ledger(out)["attempts"]] == ["CANCELLED"]
    wait_for(lambda: emulator.queued_resource_names() == [], timeout=30)
