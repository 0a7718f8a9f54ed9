"""The SSH gang against real sshd hosts: environment, teardown, quoting, host keys, sync, logs."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from marinbuild.backends.retrying import RetryBudgets
from marinbuild.backends.tpu.attempts import TpuJob, run_tpu_step
from marinbuild.backends.tpu.cluster import load_cluster
from marinbuild.backends.tpu.workdir_sync import list_project_files, pack_workdir
from tests.fixtures_ssh import FakeFleet, live_processes_matching, pids_with_env, run_job, wait_for

V4_32 = [("pod", "v4-32", [0, 1, 2, 3])]
REPO = Path(__file__).resolve().parent.parent


def test_two_slices_get_megascale_and_process_ids(fleet: FakeFleet, tmp_path: Path) -> None:
    slices = [("s0", "v4-16", [0, 1]), ("s1", "v4-16", [2, 3])]
    lines: list[str] = []
    result = run_job(
        fleet, tmp_path, slices,
        'env | grep -E "^(MARINBUILD|MEGASCALE|FAKE_HOST_ID)" | sort > "$MARINBUILD_OUTPUT/env_$FAKE_HOST_ID"; '
        'echo "hello from $MARINBUILD_PROCESS_ID"',
        env={"STEP_VAR": "v"}, lines=lines, ssh={"megascale_port": 8081},
    )
    assert result.status == "SUCCESS", result.error
    out = tmp_path / "out"
    coordinator_port = load_cluster(tmp_path / "cluster.toml").slices[0].ssh.coordinator_port
    for host in range(4):
        env = dict(line.split("=", 1) for line in (out / f"env_{host}").read_text().splitlines())
        s, w = divmod(host, 2)
        assert env["MARINBUILD_SLICE_ID"] == str(s)
        assert env["MARINBUILD_WORKER_ID"] == str(w)
        assert env["MARINBUILD_NUM_SLICES"] == "2"
        assert env["MARINBUILD_PROCESS_ID"] == str(s * 2 + w)
        assert env["MARINBUILD_NUM_PROCESSES"] == "4"
        assert env["MARINBUILD_COORDINATOR_ADDRESS"] == f"127.0.0.2:{coordinator_port}"
        assert env["MARINBUILD_OUTPUT"] == str(out)
        assert env["MARINBUILD_ATTEMPT"] == "1"
        assert env["MEGASCALE_COORDINATOR_ADDRESS"] == "127.0.0.2:8081"
        assert env["MEGASCALE_NUM_SLICES"] == "2"
        assert env["MEGASCALE_PORT"] == "8081"
        assert env["MEGASCALE_SLICE_ID"] == str(s)
        log = (out / "logs" / f"slice_{s:02d}_worker_{w:02d}.log").read_text()
        assert f"hello from {s * 2 + w}" in log
    # Only worker 0 of slice 0 speaks on the console.
    hello = [ln for ln in lines if "hello from" in ln]
    assert hello == ["[step] hello from 0"]


def test_single_slice_has_no_megascale(fleet: FakeFleet, tmp_path: Path) -> None:
    result = run_job(fleet, tmp_path, [("one", "v4-8", [1])],
                     'env | grep -c "^MEGASCALE_" > "$MARINBUILD_OUTPUT/n" || true')
    assert result.status == "SUCCESS", result.error
    assert (tmp_path / "out" / "n").read_text().strip() == "0"


def test_one_host_failing_tears_down_every_host(fleet: FakeFleet, tmp_path: Path) -> None:
    # Host 2 also starts a process that leaves the process group; the attempt's marker
    # variable must still find and kill it.
    command = (
        'if [ "$MARINBUILD_PROCESS_ID" = 1 ]; then sleep 1; date +%s.%N > "$MARINBUILD_OUTPUT/failed_at"; exit 1; fi; '
        'if [ "$MARINBUILD_PROCESS_ID" = 2 ]; then setsid sleep 3011 & fi; '
        "exec sleep 3017"
    )
    result = run_job(fleet, tmp_path, V4_32, command)
    returned = time.time()
    failed_at = float((tmp_path / "out" / "failed_at").read_text())
    assert returned - failed_at < 5.0
    assert live_processes_matching("sleep 3017") == []
    assert live_processes_matching("sleep 3011") == []
    assert result.status == "FAILED"
    (attempt,) = result.attempts
    assert attempt.classification == "FAILED"
    host1 = fleet.hosts[1].entry
    assert attempt.first_failed_host == host1
    assert attempt.exit_codes[host1] == 1
    assert all(not h.survivors for h in attempt.hosts)
    assert attempt.teardown_s is not None and attempt.teardown_s < 5.0
    record = json.loads((tmp_path / "out" / "attempts.json").read_text())
    assert record["attempts"][0]["first_failed_host"] == host1
    assert record["attempts"][0]["exit_codes"][host1] == 1


def test_env_values_arrive_verbatim_and_secrets_are_redacted(fleet: FakeFleet, tmp_path: Path) -> None:
    marker = Path(f"/tmp/marinbuild-injection-{uuid.uuid4().hex}")
    payload = f"$(touch {marker})"
    tricky = "it's \"quoted\" `touch {m}` ; | & $HOME \\ end".replace("{m}", str(marker))
    secret = f"tok-{uuid.uuid4().hex}"
    lines: list[str] = []
    result = run_job(
        fleet, tmp_path, [("one", "v4-8", [0])],
        'printf %s "$PAYLOAD" > "$MARINBUILD_OUTPUT/payload"; printf %s "$TRICKY" > "$MARINBUILD_OUTPUT/tricky"; '
        'echo "token is $API_TOKEN"',
        env={"PAYLOAD": payload, "TRICKY": tricky, "API_TOKEN": secret}, lines=lines,
    )
    assert result.status == "SUCCESS", result.error
    out = tmp_path / "out"
    assert (out / "payload").read_text() == payload
    assert (out / "tricky").read_text() == tricky
    assert not marker.exists()
    log = (out / "logs" / "slice_00_worker_00.log").read_text()
    assert "token is ***" in log and secret not in log
    assert "[step] token is ***" in lines
    record = (out / "attempts.json").read_text()
    assert secret not in record
    assert json.loads(record)["env"]["API_TOKEN"] == "***"


def test_unknown_host_key_is_refused_unless_opted_in(fleet: FakeFleet, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts_empty"
    empty.write_text("")
    refused = run_job(fleet, tmp_path, [("one", "v4-8", [3])], "true",
                      ssh={"known_hosts": str(empty)}, budgets=RetryBudgets(failure=3))
    assert refused.status == "INFRA"
    assert len(refused.attempts) == 1  # a refused key is never retried
    assert fleet.hosts[3].entry in (refused.error or "")
    assert "unknown host key" in (refused.error or "")
    accepted = run_job(fleet, tmp_path, [("one", "v4-8", [3])], "true",
                       ssh={"known_hosts": str(empty), "accept_unknown_host_keys": True})
    assert accepted.status == "SUCCESS", accepted.error
    assert empty.read_text() == ""  # trust given for one run is not written down


def test_changed_host_key_is_refused_even_when_unknown_keys_are_accepted(fleet: FakeFleet, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = " ".join(Path(f"{other}.pub").read_text().split()[:2])
    wrong = tmp_path / "known_hosts_wrong"
    wrong.write_text(f"[{fleet.hosts[0].ip}]:{fleet.hosts[0].port} {pub}\n")
    result = run_job(fleet, tmp_path, [("one", "v4-8", [0])], "true",
                     ssh={"known_hosts": str(wrong), "accept_unknown_host_keys": True})
    assert result.status == "INFRA"
    assert "differs" in (result.error or "")


def test_host_that_stops_answering_ssh_counts_as_preempted(fleet: FakeFleet, tmp_path: Path) -> None:
    out = tmp_path / "out"

    def vanish() -> None:
        wait_for(lambda: len(list(out.glob("started_*"))) == 2)
        fleet.hosts[1].stop()

    t = threading.Thread(target=vanish)
    t.start()
    result = run_job(fleet, tmp_path, [("pair", "v4-16", [0, 1])],
                     'touch "$MARINBUILD_OUTPUT/started_$FAKE_HOST_ID"; exec sleep 3018',
                     budgets=RetryBudgets(preemption=0))
    t.join()
    assert result.status == "PREEMPTED"
    (attempt,) = result.attempts
    assert attempt.preempted_hosts == (fleet.hosts[1].entry,)
    assert live_processes_matching("sleep 3018") == []


def test_cancel_tears_everything_down(fleet: FakeFleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    cancel = threading.Event()

    def stop_soon() -> None:
        wait_for(lambda: len(list(out.glob("started_*"))) == 4)
        cancel.set()

    t = threading.Thread(target=stop_soon)
    t.start()
    result = run_job(fleet, tmp_path, V4_32,
                     'touch "$MARINBUILD_OUTPUT/started_$FAKE_HOST_ID"; exec sleep 3019', cancel=cancel)
    t.join()
    assert result.status == "CANCELLED"
    assert result.attempts[0].classification == "CANCELLED"
    assert live_processes_matching("sleep 3019") == []


def test_workdir_is_synced_once_per_content(fleet: FakeFleet, tmp_path: Path) -> None:
    project = tmp_path / "project"
    (project / "pkg").mkdir(parents=True)
    (project / "data.txt").write_text("v1\n")
    (project / "pkg" / "run.sh").write_text("#!/bin/sh\ncat data.txt\n")
    (project / "pkg" / "run.sh").chmod(0o755)
    (project / ".gitignore").write_text("ignored.txt\n")
    (project / "ignored.txt").write_text("do not ship\n")
    subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    assert list_project_files(project) == [".gitignore", "data.txt", "pkg/run.sh"]
    first = pack_workdir(project, tmp_path / "p1")
    assert pack_workdir(project, tmp_path / "p2").digest == first.digest  # deterministic

    command = 'test ! -e ignored.txt && ./pkg/run.sh > "$MARINBUILD_OUTPUT/seen_$FAKE_HOST_ID"'
    pair = [("pair", "v4-16", [0, 1])]
    r1 = run_job(fleet, tmp_path, pair, command, workdir=str(project))
    assert r1.status == "SUCCESS", r1.error
    assert r1.attempts[0].synced_hosts == 2
    r2 = run_job(fleet, tmp_path, pair, command, workdir=str(project))
    assert r2.attempts[0].synced_hosts == 0  # already there, found by digest
    (project / "data.txt").write_text("v2\n")
    r3 = run_job(fleet, tmp_path, pair, command, workdir=str(project))
    assert r3.attempts[0].synced_hosts == 2
    assert (tmp_path / "out" / "seen_1").read_text() == "v2\n"
    assert (fleet.hosts[0].home / "marinbuild-work" / first.digest / "data.txt").read_text() == "v1\n"


def test_default_hygiene_removes_libtpu_lockfile(fleet: FakeFleet, tmp_path: Path) -> None:
    lock = Path("/tmp/libtpu_lockfile")
    lock.write_text("")
    result = run_job(fleet, tmp_path, [("one", "v4-8", [0])], "true")
    assert result.status == "SUCCESS", result.error
    assert not lock.exists()


def test_ssh_config_alias_and_remote_output_logs(fleet: FakeFleet, tmp_path: Path) -> None:
    import fsspec

    h = fleet.hosts[2]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host fake-two\n  HostName {h.ip}\n  Port {h.port}\n  User root\n")
    cluster_path = tmp_path / "cluster.toml"
    cluster_path.write_text(
        fleet.cluster_toml([("one", "v4-8", [2])], ssh_config=str(config)).replace(h.entry, "fake-two")
    )
    cluster = load_cluster(cluster_path)
    url = f"memory://tpu-{uuid.uuid4().hex}/step"
    job = TpuJob(name="step", output_path=url, command='echo "$MARINBUILD_COORDINATOR_ADDRESS"', slices=("one",))
    result = run_tpu_step(job, cluster, workdir=None, cancel=threading.Event(), console=lambda s: None)
    assert result.status == "SUCCESS", result.error
    fs = fsspec.filesystem("memory")
    log = fs.cat_file(f"{url}/logs/slice_00_worker_00.log").decode()
    assert f"{h.ip}:" in log  # the coordinator is the resolved HostName, not the alias
    assert json.loads(fs.cat_file(f"{url}/attempts.json"))["attempts"][0]["class"] == "SUCCESS"


@pytest.mark.parametrize("host", [0])
def test_nothing_of_a_successful_step_is_left_running(fleet: FakeFleet, tmp_path: Path, host: int) -> None:
    result = run_job(fleet, tmp_path, [("one", "v4-8", [host])], "(exec sleep 3021) & echo started")
    assert result.status == "SUCCESS", result.error
    assert live_processes_matching("sleep 3021") == []
    assert pids_with_env(f"FAKE_HOST_ID={host}", f"HOME={fleet.hosts[host].home}", "MARINBUILD_ATTEMPT=1") == []


def test_unresolvable_host_fails_fast_and_a_refusing_host_is_infra_on_its_own_budget(
    fleet: FakeFleet, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    base = fleet.cluster_toml([("one", "v4-8", [0])])
    path = tmp_path / "cluster.toml"
    path.write_text(base.replace(fleet.hosts[0].entry, "no-such-host.invalid"))
    job = TpuJob(name="step", output_path=str(tmp_path / "a"), command="true", slices=("one",),
                 budgets=RetryBudgets(preemption=5))
    result = run_tpu_step(job, load_cluster(path), workdir=None, cancel=threading.Event(), console=lambda s: None)
    assert result.status == "INFRA" and len(result.attempts) == 1
    assert "cannot resolve 'no-such-host.invalid'" in (result.error or "")

    # Nothing listens on port 1 (a wrong port): never answered, so not a preemption; the
    # infrastructure budget (2 retries), not the preemption budget (100), ends it.
    path.write_text(base.replace(fleet.hosts[0].entry, "127.0.0.1:1"))
    job = TpuJob(name="step", output_path=str(tmp_path / "b"), command="true", slices=("one",),
                 budgets=RetryBudgets(preemption=100, infra=2))
    lines: list[str] = []
    result = run_tpu_step(job, load_cluster(path), workdir=None, cancel=threading.Event(), console=lines.append)
    assert result.status == "INFRA"
    assert [a.classification for a in result.attempts] == ["INFRA"] * 3
    assert result.attempts[0].first_failed_host == "127.0.0.1:1"
    said = [line for line in lines if ": INFRA: " in line]
    assert len(said) == 3 and all("127.0.0.1:1: cannot connect" in line and "refused" in line for line in said), lines

    # A port that answers but speaks no SSH: paramiko's tracebacks never reach the terminal.
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        port = server.getsockname()[1]
        stop = threading.Event()

        def babble() -> None:
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                with conn:
                    conn.sendall(b"HTTP/1.0 400 Bad Request\r\n\r\n")

        t = threading.Thread(target=babble, daemon=True)
        t.start()
        path.write_text(base.replace(fleet.hosts[0].entry, f"127.0.0.1:{port}"))
        capfd.readouterr()
        job = TpuJob(name="step", output_path=str(tmp_path / "c"), command="true", slices=("one",),
                     budgets=RetryBudgets(infra=0))
        result = run_tpu_step(job, load_cluster(path), workdir=None, cancel=threading.Event(), console=lambda s: None)
        stop.set()
        t.join()
    assert result.status == "INFRA" and f"127.0.0.1:{port}: cannot connect" in (result.error or "")
    printed = capfd.readouterr()
    assert printed.out == "" and printed.err == "", printed


def test_a_host_that_answered_before_and_now_refuses_counts_as_preempted(fleet: FakeFleet, tmp_path: Path) -> None:
    out = tmp_path / "out"
    victim = fleet.hosts[0]

    def vanish() -> None:
        wait_for(lambda: (out / "started").exists())
        victim.stop()  # the VM is gone: its sshd refuses from now on

    t = threading.Thread(target=vanish)
    t.start()
    result = run_job(fleet, tmp_path, [("one", "v4-8", [0])], 'touch "$MARINBUILD_OUTPUT/started"; exec sleep 3019',
                     budgets=RetryBudgets(preemption=1, infra=0))
    t.join()
    assert result.status == "PREEMPTED"
    assert [a.classification for a in result.attempts] == ["PREEMPTED", "PREEMPTED"]


def test_killing_marinbuild_stops_the_remote_processes(fleet: FakeFleet, tmp_path: Path) -> None:
    cluster = fleet.write_cluster(tmp_path / "cluster.toml", [("pair", "v4-16", [0, 1])])
    out = tmp_path / "out"
    out.mkdir()
    driver = textwrap.dedent(f"""
        import threading
        from marinbuild.backends.tpu.cluster import load_cluster
        from marinbuild.backends.tpu.attempts import TpuJob, run_tpu_step
        job = TpuJob(name="step", output_path={str(out)!r}, slices=("pair",),
                     command='touch "$MARINBUILD_OUTPUT/started_$FAKE_HOST_ID"; exec sleep 3041')
        run_tpu_step(job, load_cluster({str(cluster)!r}), workdir=None, cancel=threading.Event(), console=print)
    """)
    proc = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO)
    try:
        wait_for(lambda: len(list(out.glob("started_*"))) == 2)
        assert len(live_processes_matching("sleep 3041")) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        # No teardown ran: the hosts notice on their own that marinbuild is gone.
        wait_for(lambda: live_processes_matching("sleep 3041") == [], timeout=5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("in_git", [False, True])
def test_the_local_prefix_and_step_outputs_are_never_synced(tmp_path: Path, in_git: bool) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Marinfile.py").write_text("# the project\n")
    (project / "data.txt").write_text("v1\n")
    if in_git:  # no .gitignore: git itself would list the outputs
        subprocess.run(["git", "init", "-q"], cwd=project, check=True)
    first = pack_workdir(project, tmp_path / "p1", exclude=[project / "exp"])
    for out in ("exp/train-1f0e", "marinbuild-out/eval-2a3b", "elsewhere/data-3c4d"):
        (project / out / ".marinbuild").mkdir(parents=True)
        (project / out / ".marinbuild" / "status").write_text('{"status": "SUCCESS"}')
        (project / out / "checkpoint.bin").write_bytes(b"\0" * 1000)
    (project / "exp" / ".marinbuild").mkdir()
    (project / "exp" / ".marinbuild" / "walltime.json").write_text("{}")
    assert list_project_files(project, exclude=[project / "exp"]) == ["Marinfile.py", "data.txt"]
    # Outputs come and go from run to run; the project's digest stays, so nothing is sent again.
    assert pack_workdir(project, tmp_path / "p2", exclude=[project / "exp"]).digest == first.digest


def test_a_tpu_run_ships_the_project_but_not_its_outputs(fleet: FakeFleet, tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "Marinfile.py").write_text(textwrap.dedent("""
        from marinbuild import step, versioned, ResourceConfig
        for i in range(2):
            step(f"t{i}", cmd="find . -type f | sort > {output}/shipped.txt", config={"v": versioned(i)},
                 resources=ResourceConfig.with_tpu("v4-8"))
    """))
    cluster = fleet.write_cluster(project / "cluster.toml", [("one", "v4-8", [0])], python=sys.executable)
    env = {**dict(__import__("os").environ), "PYTHONPATH": str(REPO), "MARINBUILD_RETRY_BASE_DELAY": "0.05"}
    said = []
    for target, quiet in (("t0", []), ("t1", ["-q"])):  # t1 runs after t0 left outputs (and markers) in ./marinbuild-out
        result = subprocess.run([sys.executable, "-m", "marinbuild", "run", target, "--cluster", str(cluster), *quiet],
                                cwd=project, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr
        said.append(result.stdout)
    assert "[t0] attempt 1" in said[0] and "attempt" not in said[1]  # -q: TPU steps say nothing either
    outs = sorted((project / "marinbuild-out").glob("t*-*"))
    shipped = (outs[1] / "shipped.txt").read_text().split()
    assert shipped == ["./.marinbuild-complete", "./Marinfile.py", "./cluster.toml"]
    attempts = [json.loads((o / "attempts.json").read_text())["attempts"] for o in outs]
    assert [a[-1]["synced_hosts"] for a in attempts] == [1, 0]  # the same project: not sent again


def test_host_output_goes_to_its_own_callback_apart_from_attempt_lines(fleet: FakeFleet, tmp_path: Path) -> None:
    # The command line prints host output only with --print-output; attempt lines always (but -q).
    cluster = load_cluster(fleet.write_cluster(tmp_path / "cluster.toml", [("one", "v4-8", [0])]))
    (tmp_path / "out").mkdir()
    job = TpuJob(name="step", output_path=str(tmp_path / "out"), command="echo hello from the host", slices=("one",))
    lines: list[str] = []
    printed: list[str] = []
    result = run_tpu_step(job, cluster, workdir=None, cancel=threading.Event(), console=lines.append,
                          output=printed.append)
    assert result.status == "SUCCESS", result.error
    assert printed == ["[step] hello from the host"]
    assert lines and not any("hello" in line for line in lines)
