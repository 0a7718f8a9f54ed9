"""Unit tests of marinbuild.execution.backend_fields: settings refused where a backend would ignore them."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from marinbuild.backends.base import Job
from marinbuild.backends.container import container_argv, working_engine
from marinbuild.backends.tpu.cluster import parse_cluster
from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError
from marinbuild.execution.admission import requests_of
from marinbuild.execution.allocator import Allocator
from marinbuild.execution.backend_fields import FieldCheck, check_fields, free_bytes
from marinbuild.graph import StepGraph, build_graph
from marinbuild.resources import ResourceConfig
from marinbuild.steps import step
from tests.fixtures_ssh import live_processes_matching, wait_for
from tests.helpers import marinbuild, marinbuild_in_process, placed_kind, plan_json, status_of, write_marinfile


def _check(graph: StepGraph, backend: str = "local", engine=None) -> FieldCheck:  # type: ignore[no-untyped-def]
    names = list(graph.order)
    return check_fields(graph, names, requests_of(graph, names), to_run=names, marinfile="/nowhere/Marinfile.py",
                        kind_of=lambda n: placed_kind(backend), engine_for=engine or (lambda image: (None, "no engine here")))


def _graph(prefix: str, **rc: ResourceConfig) -> StepGraph:
    return build_graph([step(n, cmd="true", resources=r) for n, r in rc.items()], prefix)


def test_steps_without_settings_pass_unchanged(tmp_path: Path) -> None:
    graph = _graph(str(tmp_path), a=ResourceConfig.with_cpu(1))
    found = _check(graph)
    assert found.requests == requests_of(graph, ["a"]) and found.images == {} and found.notes == ()


def test_replicas_are_for_tpu_steps_only(tmp_path: Path) -> None:
    with pytest.raises(ResourceError, match=r"'many': replicas=3 is for TPU steps.*local backend"):
        _check(_graph(str(tmp_path), many=ResourceConfig.with_cpu(1, replicas=3)))


def test_env_var_names_a_shell_cannot_export_are_refused_on_tpu(tmp_path: Path) -> None:
    graph = _graph(str(tmp_path), t=ResourceConfig.with_tpu("v4-8", env_vars={"BAD-NAME": "1"}))
    with pytest.raises(ResourceError, match="'BAD-NAME' cannot be exported on the tpu backend"):
        _check(graph, "tpu")
    _check(graph, "local")  # a local step gets it through its environment


def test_images_need_a_working_engine_on_the_local_backend(tmp_path: Path) -> None:
    graph = _graph(str(tmp_path), boxed=ResourceConfig.with_cpu(1, image="python:3.11"))
    with pytest.raises(ResourceError, match=r"needs podman or docker.*no engine here"):
        _check(graph)
    assert _check(graph, engine=lambda image: ("podman", "")).images == {"boxed": ("podman", "python:3.11")}
    with pytest.raises(ResourceError, match="not supported on the ray backend"):
        _check(graph, "ray")


def test_disk_is_checked_where_it_can_be(tmp_path: Path) -> None:
    free = free_bytes(str(tmp_path / "not" / "yet"))
    assert free > 0
    with pytest.raises(ResourceError, match="asks for disk="):
        _check(_graph(str(tmp_path), big=ResourceConfig.with_cpu(1, disk=free * 4)))
    remote = _check(_graph("gs://bucket/p", big=ResourceConfig.with_cpu(1, disk=free * 4)))
    assert remote.notes == ("disk requests are not checked: free space of gs://bucket/p cannot be asked",)


def test_not_preemptible_is_refused_on_ray_and_free_locally(tmp_path: Path) -> None:
    graph = _graph(str(tmp_path), careful=ResourceConfig.with_cpu(1, preemptible=False))
    assert _check(graph).requests["careful"] == requests_of(graph, ["careful"])["careful"]
    with pytest.raises(ResourceError, match=r"'careful'.*ray backend"):
        _check(graph, "ray")


# -- Every ResourceConfig field is honoured by the backend a step runs on, or refused at plan time.


NO_IMAGE = "registry.invalid/marinbuild-tests/none:0"


def graph_of(*steps, prefix: str = "/tmp/mb-fields"):  # type: ignore[no-untyped-def]
    return build_graph(list(steps), prefix)


def checked(graph, backend: str = "local", cluster=None, engine=None):  # type: ignore[no-untyped-def]
    names = list(graph.order)
    kind = placed_kind(backend, cluster)
    return check_fields(
        graph, names, requests_of(graph, names), to_run=names, marinfile="/nowhere/Marinfile.py",
        kind_of=lambda n: kind, engine_for=engine,
    )


def test_env_vars_reach_local_steps_over_the_runners_and_marinbuilds_own_win(project):
    write_marinfile(project, """
import os
from marinbuild import step, ResourceConfig

def show(cfg):
    with open(os.path.join(os.environ["MARINBUILD_OUTPUT"], "fn.txt"), "w") as f:
        f.write(f"{os.environ['FOO']} {os.environ['MARINBUILD_STEP']}")

rc = ResourceConfig.with_cpu(1, ram=None, env_vars={"FOO": "from-env-vars", "MARINBUILD_STEP": "spoofed"})
step("fn", show, resources=rc)
step("sh", cmd='echo "$FOO $MARINBUILD_STEP" > {output}/sh.txt', resources=rc)
""")
    result = marinbuild("run", cwd=project, env={"FOO": "from-the-runner"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project)
    assert (Path(rows["fn"]["output_path"]) / "fn.txt").read_text() == "from-env-vars fn"
    assert (Path(rows["sh"]["output_path"]) / "sh.txt").read_text() == "from-env-vars sh\n"


def test_an_image_no_engine_here_can_run_is_refused_at_plan_time(project):
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
step("boxed", cmd="true", resources=ResourceConfig.with_cpu(1, ram=None, image={NO_IMAGE!r}))
""")
    result = marinbuild_in_process("plan", cwd=project)
    assert result.returncode == 2
    line = result.stderr.strip()
    assert "'boxed'" in line and NO_IMAGE in line and "local backend" in line and len(line.splitlines()) == 1
    assert not (project / "marinbuild-out").exists()
    assert working_engine(NO_IMAGE)[0] is None


def test_an_image_is_refused_on_the_tpu_and_ray_backends():
    g = graph_of(step("boxed", cmd="true", resources=ResourceConfig.with_cpu(1, image="python:3.11")))
    for backend in ("tpu", "ray"):
        with pytest.raises(ResourceError, match=f"'boxed'.*{backend} backend"):
            checked(g, backend, engine=lambda image: ("docker", ""))
    # Where an engine really runs the image, the step is run in it.
    assert checked(g, "local", engine=lambda image: ("podman", "")).images == {"boxed": ("podman", "python:3.11")}


def test_a_container_mounts_the_project_and_the_output_and_passes_the_environment(tmp_path):
    job = Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "log"), workdir=str(tmp_path),
              env={"A": "1"}, command="echo hi")
    argv = container_argv("docker", "img", job, job.env, "echo hi")
    assert argv[:3] == ["docker", "run", "--rm"] and argv[-4:] == ["img", "/bin/sh", "-c", "echo hi"]
    assert f"{tmp_path}:{tmp_path}" in argv and f"{tmp_path / 'out'}:{tmp_path / 'out'}" in argv
    assert "A=1" in argv and argv[argv.index("-w") + 1] == str(tmp_path)


def test_disk_is_checked_against_the_free_space_of_a_local_prefix(project):
    free = shutil.disk_usage(project).free
    write_marinfile(project, f"""
from marinbuild import step, ResourceConfig
step("small", cmd="true", resources=ResourceConfig.with_cpu(1, ram=None, disk=1))
step("huge", cmd="true", resources=ResourceConfig.with_cpu(1, ram=None, disk={free * 4}))
""")
    refused = marinbuild_in_process("plan", cwd=project)
    assert refused.returncode == 2
    assert "'huge'" in refused.stderr and "disk=" in refused.stderr and "free" in refused.stderr
    fine = marinbuild_in_process("plan", "small", cwd=project)
    assert fine.returncode == 0, fine.stderr


def test_a_remote_prefix_says_once_that_disk_cannot_be_checked(project):
    write_marinfile(project, """
from marinbuild import step, ResourceConfig
big = ResourceConfig.with_cpu(1, ram=None, disk="100000t")
step("a", cmd="true", resources=big)
step("b", cmd="true", resources=big)
""")
    result = marinbuild("plan", "--prefix", "memory://fields", cwd=project)
    assert result.returncode == 0, result.stderr
    notes = [ln for ln in result.stderr.splitlines() if "disk" in ln]
    assert len(notes) == 1 and "memory://fields" in notes[0] and "not checked" in notes[0]


CLUSTER = {
    "slices": [
        {"name": "spot-a", "tpu_type": "v4-8", "hosts": ["h1"], "preemptible": True},
        {"name": "stable", "tpu_type": "v4-8", "hosts": ["h2"]},
        {"name": "spot-b", "tpu_type": "v5p-8", "hosts": ["h3"], "preemptible": True},
    ]
}


def test_preemptible_false_keeps_a_step_off_preemptible_slices():
    cluster = parse_cluster(CLUSTER)
    assert [s.preemptible for s in cluster.slices] == [True, False, True]
    g = graph_of(
        step("careful", cmd="true", resources=ResourceConfig.with_tpu("v4-8", preemptible=False)),
        step("anywhere", cmd="true", resources=ResourceConfig.with_tpu("v4-8")),
    )
    requests = checked(g, "tpu", cluster=cluster).requests
    allocator = Allocator(Capacity(cores=(0, 1), slices=cluster.slices_by_type()))
    careful = allocator.try_allocate(requests["careful"])
    assert careful is not None and careful.request.slice_names == ("stable",)  # spot-a comes first in the file
    assert allocator.try_allocate(requests["careful"]) is None  # waits for "stable", never takes spot-a
    anywhere = allocator.try_allocate(requests["anywhere"])
    assert anywhere is not None and anywhere.request.slice_names == ("spot-a",)


def test_preemptible_false_with_only_preemptible_slices_is_a_plan_time_error(project):
    g = graph_of(step("careful", cmd="true", resources=ResourceConfig.with_tpu("v5p-8", preemptible=False)))
    with pytest.raises(ResourceError, match=r"'careful'.*preemptible=False.*tpu backend.*spot-b"):
        checked(g, "tpu", cluster=parse_cluster(CLUSTER))
    with pytest.raises(ResourceError, match=r"'careful'.*ray backend"):
        checked(g, "ray")
    # On this machine (never preempted) a CPU step asking for it simply runs.
    local = graph_of(step("cpu", cmd="true", resources=ResourceConfig.with_cpu(1, preemptible=False)))
    assert checked(local, "local").requests["cpu"] == requests_of(local, ["cpu"])["cpu"]
    # Through the command line: a cluster file whose v5p-8 slices are all preemptible.
    (project / "cluster.toml").write_text(
        '[[slices]]\nname = "spot"\ntpu_type = "v5p-8"\nhosts = ["127.0.0.9"]\npreemptible = true\n'
    )
    write_marinfile(project, """
from marinbuild import step, ResourceConfig
step("careful", cmd="true", resources=ResourceConfig.with_tpu("v5p-8", preemptible=False))
""")
    result = marinbuild_in_process("plan", "--cluster", "cluster.toml", cwd=project)
    assert result.returncode == 2 and "'careful'" in result.stderr and "preemptible" in result.stderr


def test_an_env_var_name_the_shell_cannot_export_is_refused_for_tpu_hosts():
    g = graph_of(step("t", cmd="true", resources=ResourceConfig.with_tpu("v4-8", env_vars={"BAD-NAME": "1"})))
    with pytest.raises(ResourceError, match=r"'t'.*BAD-NAME.*tpu backend"):
        checked(g, "tpu", cluster=parse_cluster(CLUSTER))
    assert os.environ.get("BAD-NAME") is None


def test_replicas_beyond_one_are_refused_where_a_step_runs_once():
    g = graph_of(step("many", cmd="true", resources=ResourceConfig.with_cpu(1, replicas=3)))
    for backend in ("local", "ray"):
        with pytest.raises(ResourceError, match=rf"'many'.*replicas=3.*{backend} backend"):
            checked(g, backend)


def test_a_tpu_steps_wall_time_tears_its_gang_down(project, fleet):
    write_marinfile(project, """
from marinbuild import step, ResourceConfig, WTime
step("slow", cmd="sleep 61", resources=ResourceConfig.with_tpu("v4-8", walltime=WTime(T=2)))
""")
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-8", [0])])
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project, timeout=120)
    assert result.returncode == 1
    out = plan_json(project, "--cluster", str(cluster))["slow"]["output_path"]
    assert "exceeded its wall time of 2 s" in status_of(out)["error"]
    wait_for(lambda: not live_processes_matching("sleep 61"))  # the host's command went with the gang
