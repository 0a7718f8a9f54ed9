"""The Ray backend against a real Ray cluster on this machine (see tests/fixtures_ray.py)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from marinbuild.backends.ray.backend import TaskSpec, execute_task
from marinbuild.backends.ray.cluster import TOKEN_SHARE, RayNode, place, placement_of
from marinbuild.backends.ray.lease_fence import LeaseFence
from marinbuild.errors import ResourceError
from marinbuild.resources import Cores, Custom, Gpus, Memory, Request, Slices, Token, as_request
from marinbuild.store.lease import LeaseRecord, Owner
from marinbuild.store.step_logs import HEADER_PREFIX
from marinbuild.store.storage import Storage

from .helpers import (
    REPO,
    alive,
    copy_example,
    marinbuild,
    plan_json,
    snapshot,
    start_marinbuild,
    status_of,
    write_marinfile,
)

if TYPE_CHECKING:
    from .fixtures_ray import RayCluster

pytest_plugins = ["tests.fixtures_ray"]


def ray_env(cluster: RayCluster, **extra: str) -> dict[str, str]:
    return {**cluster.env, "MARINBUILD_LEASE_POLL": "0.5", **extra}


def run_on_ray(cluster: RayCluster, cwd: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return marinbuild(
        "run", "--backend", "ray", "--ray-address", cluster.address, *args,
        cwd=cwd, env=ray_env(cluster), timeout=timeout,
    )


def wait_for(condition, timeout: float = 60, what: str = "condition"):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def outputs(folder: Path) -> dict[str, str]:
    """Every file under the prefix with its hash; marker and attempt-ledger contents (times, owners, hosts) and
    log headers left out."""
    root = folder / "marinbuild-out"
    snap = snapshot(root)
    for k in snap:
        if k.endswith("/logs/step.log"):  # what the step printed; the attempt header names the backend
            text = (root / k).read_text()
            snap[k] = "\n".join(line for line in text.splitlines() if not line.startswith(HEADER_PREFIX))
    return {k: ("marker" if "/.marinbuild/" in k or k.endswith("/attempts.json") else v) for k, v in snap.items()}


# -- the examples, and where steps run --------------------------------------------------------


@pytest.mark.parametrize("name", ["hello_world", "diamond"])
def test_example_on_ray_matches_a_local_run_and_is_up_to_date_locally(ray_cluster, tmp_path, name):
    on_ray = copy_example(name, tmp_path / "ray")
    local = copy_example(name, tmp_path / "local")
    result = run_on_ray(ray_cluster, on_ray, "-j", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert marinbuild("run", "-j", "3", cwd=local).returncode == 0
    assert outputs(on_ray) == outputs(local)
    assert {row["action"] for row in plan_json(on_ray).values()} == {"skip"}
    again = marinbuild("run", "--backend", "ray", "--ray-address", "127.0.0.1:1", cwd=on_ray)  # joins nothing
    assert again.returncode == 0 and "nothing to do" in again.stdout
    for row in plan_json(on_ray).values():
        info = json.loads((Path(row["output_path"]) / ".marinbuild" / "info.json").read_text())
        assert info["ray"]["node_id"] in (ray_cluster.head_node, ray_cluster.extra_node)


PROBE = """
import json, os, sys
import ray
from marinbuild import Cores, Custom, step, this_output_path, versioned

def probe(cfg):
    ctx = ray.get_runtime_context()
    names = ("MARINBUILD_OUTPUT", "MARINBUILD_STEP", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GREETING")
    seen = {
        "pid": os.getpid(),
        "task_id": ctx.get_task_id(),
        "node_id": ctx.get_node_id(),
        "env": {k: os.environ.get(k) for k in names},
        "cwd": os.getcwd(),
    }
    print("hello from", cfg["who"])
    print("a warning on stderr", file=sys.stderr)
    with open(os.path.join(cfg["out"], "probe.json"), "w") as f:
        json.dump(seen, f)

def broken(cfg):
    print("about to fail")
    raise ValueError("the data is bad")

step("probe", probe, {"who": "probe", "out": this_output_path(), "v": versioned(1)},
     env={"GREETING": "hi"}, resources=Cores(2))
step("special", probe, {"who": "special", "out": this_output_path(), "v": versioned(2)},
     resources=Custom("special", 1))
step("shell", cmd='echo "$MARINBUILD_STEP $OMP_NUM_THREADS $GREETING" > {output}/env.txt; echo out-line; echo err-line >&2',
     config={"v": versioned(3)}, env={"GREETING": "hey"})
step("broken", broken, {"v": versioned(4)})
"""


def test_steps_run_in_ray_workers_with_their_environment_and_logs(ray_cluster, project):
    write_marinfile(project, PROBE)
    driver = start_marinbuild("run", "-k", "--backend", "ray", "--ray-address", ray_cluster.address,
                              cwd=project, env=ray_env(ray_cluster))
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 1, stdout + stderr  # "broken" fails, the rest succeed
    rows = plan_json(project)
    assert {n: r["action"] for n, r in rows.items()} == {"probe": "skip", "special": "skip", "shell": "skip", "broken": "run"}

    probe_out = Path(rows["probe"]["output_path"])
    seen = json.loads((probe_out / "probe.json").read_text())
    assert seen["task_id"] and seen["pid"] != driver.pid  # a Ray task, not the driver
    assert seen["node_id"] == ray_cluster.head_node  # two cores: only the head has them
    assert seen["env"] == {
        "MARINBUILD_OUTPUT": str(probe_out),
        "MARINBUILD_STEP": "probe",
        "OMP_NUM_THREADS": "2",
        "MKL_NUM_THREADS": "2",
        "GREETING": "hi",
    }
    assert seen["cwd"] == str(project)
    log = (probe_out / "logs" / "step.log").read_text()
    assert "hello from probe" in log and "a warning on stderr" in log

    special = json.loads((Path(rows["special"]["output_path"]) / "probe.json").read_text())
    assert special["node_id"] == ray_cluster.extra_node

    shell_out = Path(rows["shell"]["output_path"])
    assert (shell_out / "env.txt").read_text().split() == ["shell", "1", "hey"]
    shell_log = (shell_out / "logs" / "step.log").read_text()
    assert "out-line" in shell_log and "err-line" in shell_log

    broken_out = Path(rows["broken"]["output_path"])
    assert status_of(str(broken_out))["status"] == "FAILED"
    assert "ValueError: the data is bad" in status_of(str(broken_out))["error"]
    broken_log = (broken_out / "logs" / "step.log").read_text()
    assert "about to fail" in broken_log and "Traceback" in broken_log
    assert "FAIL" in stdout and "ValueError: the data is bad" in stdout


def test_marinfile_default_backend_without_address_starts_a_ray_for_the_run(tmp_path, project):
    ray_tmp = Path(tempfile.mkdtemp(prefix="mbrayl-", dir="/tmp"))  # Ray's socket paths must stay short
    write_marinfile(project, """
        import os
        import ray
        from marinbuild import step, this_output_path, versioned

        DEFAULT_BACKEND = "ray"

        def where(cfg):
            with open(os.path.join(cfg["out"], "task.txt"), "w") as f:
                f.write(str(ray.get_runtime_context().get_task_id()))

        step("where", where, {"out": this_output_path(), "v": versioned(1)})
    """)
    env = {"HOME": str(tmp_path), "RAY_ADDRESS": "", "RAY_USAGE_STATS_ENABLED": "0", "RAY_TMPDIR": str(ray_tmp)}
    try:
        result = marinbuild("run", cwd=project, env=env, timeout=180)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project)["where"]["output_path"])
    assert (out / "task.txt").read_text() not in ("", "None")


# -- resources ----------------------------------------------------------------------------


def test_requests_no_single_node_can_hold_are_refused_at_plan_time(ray_cluster, project):
    write_marinfile(project, """
        from marinbuild import Cores, Custom, step, versioned
        step("huge", cmd="true", config={"v": versioned(1)}, resources=Cores(64))
    """)
    result = run_on_ray(ray_cluster, project)
    assert result.returncode == 2
    assert "step 'huge' asks for cpu=64" in result.stderr and "Ray would wait for it forever" in result.stderr
    assert not (project / "marinbuild-out").exists()

    # 3 CPUs exist in the cluster, but no node has 2 of them together with "special".
    write_marinfile(project, """
        from marinbuild import Cores, Custom, step, versioned
        step("split", cmd="true", config={"v": versioned(1)}, resources=Cores(2) & Custom("special", 1))
    """)
    result = run_on_ray(ray_cluster, project)
    assert result.returncode == 2
    assert "step 'split'" in result.stderr and "no single live Ray node offers all of them" in result.stderr


HEAD = RayNode("head", "10.0.0.1", {"CPU": 8.0, "memory": 32.0 * 2**30, "GPU": 2.0, "accelerator_type:H100": 1.0})
SMALL = RayNode("small", "10.0.0.2", {"CPU": 2.0, "memory": 4.0 * 2**30, "gcs": 1.0})
TPU = RayNode("tpu", "10.0.0.3", {"CPU": 96.0, "TPU": 4.0, "TPU-v4-8-head": 1.0})


def test_requests_map_to_ray_options():
    opts = placement_of("s", Cores(4) & Memory("8g") & Gpus(2, "h100") & Custom("uplink", 3) & Token("gcs"), [HEAD])
    assert opts is not None
    assert dict(opts.options) == {
        "num_cpus": 4,
        "memory": 8 * 2**30,
        "num_gpus": 2,
        "accelerator_type": "H100",
        "resources": {"uplink": 3.0, "gcs": TOKEN_SHARE},
    }
    assert dict(placement_of("plain", as_request(None), [HEAD]).options) == {"num_cpus": 1}


def test_tpu_steps_go_to_ray_only_for_single_host_slices_it_heads():
    single = placement_of("t", Request.of(Slices("v4-8")), [TPU])
    assert single is not None and dict(single.options)["resources"] == {"TPU-v4-8-head": 1.0, "TPU": 4.0}
    assert placement_of("t", Request.of(Slices("v4-32")), [TPU]) is None  # 4 hosts: SSH gang
    assert placement_of("t", Request.of(Slices("v4-8", 2)), [TPU]) is None  # multislice
    assert placement_of("t", Request.of(Slices("v4-8")), [HEAD]) is None  # no TPU head offered


def test_node_check_names_the_step_and_the_resource():
    nodes = [HEAD, SMALL]
    assert set(place({"a": Request.of(Cores(8)), "b": Request.of(Token("gcs"))}, nodes)) == {"a", "b"}
    cases = [
        (Memory("64g"), "ram=64 GiB"),
        (Gpus(4), "gpu count=4"),
        (Gpus(1, "A100"), "gpu_type='A100'"),
        (Custom("uplink", 1), "resources.uplink=1"),
        (Token("bucket"), "token 'bucket'"),
        (Cores(4) & Token("gcs"), "no single live Ray node offers all of them together"),
    ]
    for request, words in cases:
        with pytest.raises(ResourceError) as caught:
            place({"step1": Request.of(request)}, nodes)
        assert "step 'step1'" in str(caught.value) and words in str(caught.value), caught.value


# -- faults ---------------------------------------------------------------------------------

SLOW = """
import os, time
from marinbuild import step, this_output_path, versioned

ROOT = {root!r}

def note(line):
    with open(os.path.join(ROOT, "events.log"), "a") as f:
        f.write(line + "\\n")

def slow(cfg):
    note(f"start {{os.getpid()}}")
    deadline = time.time() + 120
    while not os.path.exists(os.path.join(ROOT, "release")) and time.time() < deadline:
        time.sleep(0.05)
    for part in range(3):
        with open(os.path.join(cfg["out"], f"part{{part}}.txt"), "w") as f:
            f.write(str(part))
    note(f"end {{os.getpid()}}")

slow_step = step("slow", slow, {{"out": this_output_path(), "v": versioned({version})}})
"""


def events(project: Path) -> list[tuple[str, int]]:
    path = project / "events.log"
    if not path.exists():
        return []
    return [(kind, int(pid)) for kind, pid in (line.split() for line in path.read_text().splitlines())]


def test_killed_worker_reruns_the_step_once_to_a_complete_output(ray_cluster, project):
    write_marinfile(project, SLOW.format(root=str(project), version=1))
    driver = start_marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address,
                              cwd=project, env=ray_env(ray_cluster))
    first = wait_for(lambda: events(project), what="the step to start")[0][1]
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: not alive(first), what="the killed worker to go")
    (project / "release").touch()
    stdout, stderr = driver.communicate(timeout=180)
    assert driver.returncode == 0, stdout + stderr
    seen = events(project)
    assert [kind for kind, _ in seen] == ["start", "start", "end"]
    assert seen[2][1] != first
    out = Path(plan_json(project)["slow"]["output_path"])
    assert sorted(p.name for p in out.glob("part*.txt")) == ["part0.txt", "part1.txt", "part2.txt"]
    assert status_of(str(out))["status"] == "SUCCESS"
    assert "attempt 2" in (out / "logs" / "step.log").read_text()


def test_a_dead_driver_takes_its_task_along_and_the_next_driver_runs_it_once(ray_cluster, project):
    write_marinfile(project, SLOW.format(root=str(project), version=2))
    driver = start_marinbuild("run", "--backend", "ray", "--ray-address", ray_cluster.address,
                              cwd=project, env=ray_env(ray_cluster))
    worker = wait_for(lambda: events(project), what="the step to start")[0][1]
    driver.send_signal(signal.SIGKILL)
    driver.communicate()
    # Ray kills the running tasks of a driver that is gone; nothing may keep working.
    wait_for(lambda: not alive(worker), timeout=90, what="Ray to stop the dead driver's task")
    (project / "release").touch()
    second = run_on_ray(ray_cluster, project)
    assert second.returncode == 0, second.stdout + second.stderr
    seen = events(project)
    assert [kind for kind, _ in seen] == ["start", "start", "end"] and seen[2][1] != worker


def processes_running(text: str) -> list[int]:
    """Live processes whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, ValueError):
            continue
        if entry.isdigit() and text in cmdline and alive(int(entry)):
            found.append(int(entry))
    return found


def test_a_timed_out_step_and_whatever_steps_leave_behind_are_killed(ray_cluster, project):
    write_marinfile(project, """
        import os
        from marinbuild import Cores, WTime, step, versioned

        def nothing_left(cfg):
            for entry in os.listdir("/proc"):
                try:
                    cmdline = open(f"/proc/{entry}/cmdline", "rb").read()
                    state = open(f"/proc/{entry}/stat").read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    continue
                if b"sleep\\x00124.25" in cmdline and state != "Z":
                    raise RuntimeError(f"left running: {cmdline!r}")

        step("sleepy", cmd="sleep 123.25 & sleep 123.5", config={"v": versioned(1)}, resources=Cores(1) & WTime(T=2))
        leaves = step("leaves", cmd="(sleep 124.25 &); echo done", config={"v": versioned(2)})
        step("after", nothing_left, {"after": leaves})
    """)
    result = run_on_ray(ray_cluster, project, "-k")
    assert result.returncode == 1
    rows = plan_json(project)
    sleepy = status_of(rows["sleepy"]["output_path"])
    assert sleepy["status"] == "FAILED" and "timeout" in sleepy["error"]
    assert status_of(rows["leaves"]["output_path"])["status"] == "SUCCESS"
    assert status_of(rows["after"]["output_path"])["status"] == "SUCCESS"  # checked while the run went on
    wait_for(lambda: not processes_running("sleep 123.") and not processes_running("sleep 124.25"),
             what="the steps' processes to be gone")


SPANS = """
import os, time
from marinbuild import step, versioned

def span(cfg):
    start = time.time()
    time.sleep(0.3)
    with open(os.path.join({root!r}, "spans.log"), "a") as f:
        f.write(f"{{start}} {{time.time()}}\\n")

for i in range(3):
    step(f"s{{i}}", span, {{"i": versioned(i)}})
"""


def test_jobs_cap_concurrency(ray_cluster, project):
    write_marinfile(project, SPANS.format(root=str(project)))
    result = run_on_ray(ray_cluster, project, "-j", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    spans = sorted(tuple(map(float, line.split())) for line in (project / "spans.log").read_text().splitlines())
    assert len(spans) == 3
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2))


# -- the task body: retries of one submission ---------------------------------------------------


def _spec(project: Path, out: Path, token: str, fn) -> TaskSpec:  # type: ignore[no-untyped-def]
    return TaskSpec(name="s", output_path=str(out), prefix=str(project), workdir=str(project), env={},
                    token=token, log_file=str(out / "logs" / "step.log"), fn=fn, config=None, fresh_output=True)


def test_a_retry_after_a_recorded_outcome_does_not_run_again(tmp_path):
    out = tmp_path / "s-1"
    (out / ".marinbuild").mkdir(parents=True)
    (out / ".marinbuild" / "status").write_text(json.dumps(
        {"status": "SUCCESS", "time": 100.0, "duration": 1.0, "owner": "h:1 tok/1"}))

    def must_not_run(cfg):  # type: ignore[no-untyped-def]
        raise AssertionError("ran twice")

    result = execute_task(_spec(tmp_path, out, "tok", must_not_run))
    assert result.ok and result.ended == 100.0


def test_a_retry_after_a_lost_attempt_clears_a_fresh_output_and_runs(tmp_path):
    out = tmp_path / "s-1"
    (out / ".marinbuild").mkdir(parents=True)
    (out / ".marinbuild" / "status").write_text(json.dumps({"status": "RUNNING", "time": 1.0, "owner": "h:1 tok/1"}))
    (out / "partial.bin").write_text("half")

    def work(cfg):  # type: ignore[no-untyped-def]
        (out / "done.txt").write_text("ok")

    result = execute_task(_spec(tmp_path, out, "tok", work))
    assert result.ok and result.attempt == 2
    assert sorted(p.name for p in out.iterdir()) == [".marinbuild", "done.txt", "logs"]
    assert status_of(str(out))["status"] == "SUCCESS"
    assert Storage.for_prefix(str(tmp_path)).read_text(str(out / "logs" / "step.log")).startswith("marinbuild: attempt 2")


def test_the_task_records_nothing_once_the_lease_names_another_runner(tmp_path):
    out = tmp_path / "s-1"
    (out / ".marinbuild").mkdir(parents=True)
    path = out / ".marinbuild" / "lease"
    mine, theirs = Owner.current(nonce="mine"), Owner.current(nonce="theirs")
    path.write_text(LeaseRecord(mine, 1.0, 1.0).to_json())
    fence = LeaseFence(str(tmp_path), str(path), mine)

    def taken_over_meanwhile(cfg):  # type: ignore[no-untyped-def]
        path.write_text(LeaseRecord(theirs, 2.0, 2.0).to_json())
        (out / "done.txt").write_text("ok")

    spec = replace(_spec(tmp_path, out, "tok", taken_over_meanwhile), lease=fence)
    result = execute_task(spec)
    assert not result.ok and not result.recorded and result.error == "lease lost while running"
    assert status_of(str(out))["status"] == "RUNNING"  # no SUCCESS from a runner that lost the lease

    again = execute_task(replace(spec, token="tok2"))
    assert not again.recorded and again.error == "lease lost before the step started"
    assert status_of(str(out))["owner"].endswith("tok/1")  # untouched


# -- leases: a local driver and a Ray driver share an ancestor ----------------------------------

SHARED = """
import os, time
from marinbuild import output_path_of, step, this_output_path, versioned

ROOT = {root!r}

def ancestor(cfg):
    with open(os.path.join(ROOT, "ancestor.log"), "a") as f:
        f.write(f"run {{os.getpid()}}\\n")
    time.sleep(3)
    with open(os.path.join(cfg["out"], "data.txt"), "w") as f:
        f.write("data")

def child(cfg):
    with open(os.path.join(cfg["data"], "data.txt")) as f:
        assert f.read() == "data"

base = step("ancestor", ancestor, {{"out": this_output_path(), "v": versioned(1)}})
step("left", child, {{"data": base, "side": versioned("left")}})
step("right", child, {{"data": base, "side": versioned("right")}})
"""


def test_local_and_ray_drivers_sharing_an_ancestor_run_it_once(ray_cluster, project):
    write_marinfile(project, SHARED.format(root=str(project)))
    env = ray_env(ray_cluster)
    local = start_marinbuild("run", "left", cwd=project, env=env)
    on_ray = start_marinbuild("run", "right", "--backend", "ray", "--ray-address", ray_cluster.address,
                              cwd=project, env=env)
    for driver in (local, on_ray):
        stdout, stderr = driver.communicate(timeout=180)
        assert driver.returncode == 0, stdout + stderr
    assert len((project / "ancestor.log").read_text().splitlines()) == 1
    assert {row["action"] for row in plan_json(project).values()} == {"skip"}


# -- connecting -----------------------------------------------------------------------------------


def test_token_authentication(ray_token_cluster, tmp_path):
    folder = copy_example("hello_world", tmp_path)
    without = marinbuild(
        "run", "--backend", "ray", "--ray-address", ray_token_cluster.address, cwd=folder,
        env={"HOME": str(tmp_path), "RAY_AUTH_MODE": "disabled", "RAY_gcs_server_port_wait_time_s": "2"},
    )
    assert without.returncode == 2
    assert "requires a token" in without.stderr and "RAY_AUTH_TOKEN" in without.stderr
    with_token = run_on_ray(ray_token_cluster, folder)
    assert with_token.returncode == 0, with_token.stdout + with_token.stderr
    assert {row["action"] for row in plan_json(folder).values()} == {"skip"}


def test_ray_backend_without_ray_installed_is_one_clear_error(tmp_path, project):
    fake = tmp_path / "no-ray" / "ray"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    write_marinfile(project, """
        from marinbuild import step, versioned
        DEFAULT_BACKEND = "ray"
        step("a", cmd="true", config={"v": versioned(1)})
    """)
    result = marinbuild("run", cwd=project, env={"PYTHONPATH": f"{REPO}{os.pathsep}{fake.parent}"})
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "marinbuild: error: the Ray backend needs ray, which is not installed: pip install 'marinbuild[ray]' "
        "(in a checkout: pip install -e '.[ray]')"
    )
    assert marinbuild("run", "--backend", "local", cwd=project).returncode == 0
