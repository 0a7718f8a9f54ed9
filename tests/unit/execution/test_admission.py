"""Unit tests of marinbuild.execution.admission: requests per step, plan-time fit, and the gate."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError
from marinbuild.execution.admission import (
    RemoteAdmission,
    ResourceAdmission,
    check_plan_fits,
    describe_request,
    requests_of,
)
from marinbuild.graph import StepGraph, build_graph
from marinbuild.resources import Cores, Memory, Request, WTime
from marinbuild.steps import step
from marinbuild.walltime import WallTimeEstimator

CAP = Capacity(cores=(0, 1), memory=4 * 2**30)


def _graph(tmp_path: Path, **resources: object) -> StepGraph:
    return build_graph([step(n, cmd="true", resources=r) for n, r in resources.items()], str(tmp_path))


def test_requests_of_steps() -> None:
    graph = build_graph([step("a", cmd="true"), step("b", cmd="true", resources=Cores(2))], "/p")
    requests = requests_of(graph, ["a", "b"])
    assert requests == {"a": Request.of(Cores(1)), "b": Request.of(Cores(2))}
    assert describe_request(requests["b"]) == "Cores(2)"


def test_a_request_nothing_could_satisfy_is_refused_at_plan_time() -> None:
    check_plan_fits({"ok": Request.of(Cores(2))}, CAP)
    with pytest.raises(ResourceError, match="'huge'"):
        check_plan_fits({"ok": Request.of(Cores(1)), "huge": Cores(1) & Memory(64)}, CAP)


def test_the_gate_allocates_and_releases(tmp_path: Path) -> None:
    graph = _graph(tmp_path, a=Cores(2), b=Cores(1))
    gate = ResourceAdmission(CAP, requests_of(graph, ["a", "b"]), str(tmp_path))
    grant = gate.try_acquire(graph.nodes["a"])
    assert grant is not None and grant.cores == (0, 1) and dict(grant.env)["MARINBUILD_CORES"] == "0,1"
    assert gate.try_acquire(graph.nodes["b"]) is None
    assert "core" in gate.waits_on(graph.nodes["b"])
    gate.release(grant)
    assert gate.try_acquire(graph.nodes["b"]) is not None


def test_with_jobs_a_step_declaring_nothing_takes_no_core(tmp_path: Path) -> None:
    graph = _graph(tmp_path, a=None, b=None, c=None)
    gate = ResourceAdmission(CAP, requests_of(graph, "abc"), str(tmp_path), jobs=3)
    grants = [gate.try_acquire(graph.nodes[n]) for n in "abc"]
    assert all(g is not None and g.allocation is None and g.cores == () for g in grants)
    assert all("MARINBUILD_CORES" not in dict(g.env) for g in grants if g is not None)
    without_jobs = ResourceAdmission(CAP, requests_of(graph, "abc"), str(tmp_path))
    assert [without_jobs.try_acquire(graph.nodes[n]) is not None for n in "abc"] == [True, True, False]


def test_walltime_refuses_a_step_whose_soft_limit_exceeds_the_time_left(tmp_path: Path) -> None:
    graph = _graph(tmp_path, long=WTime(T=7200, softT=3600), short=WTime(T=5))
    gate = ResourceAdmission(CAP, requests_of(graph, ["long", "short"]), str(tmp_path), walltime=60)
    refusal = gate.refusal(graph.nodes["long"])
    assert refusal is not None and "soft wall time 3600 s exceeds" in refusal
    assert gate.refusal(graph.nodes["short"]) is None
    grant = gate.try_acquire(graph.nodes["short"])
    assert grant is not None and grant.timeout == 5
    assert ResourceAdmission(CAP, {}, str(tmp_path)).refusal(graph.nodes["long"]) is None


def test_a_wall_time_group_learns_from_successful_runs(tmp_path: Path) -> None:
    graph = _graph(tmp_path, g=WTime(group="tok"))
    history = WallTimeEstimator(str(tmp_path / ".marinbuild" / "walltime.json"))
    for seconds in [20, 40] * 4:
        history.record("tok", seconds)
    gate = ResourceAdmission(CAP, requests_of(graph, ["g"]), str(tmp_path))
    grant = gate.try_acquire(graph.nodes["g"])
    assert grant is not None and grant.timeout == 80.0 and grant.group == "tok"
    gate.release(grant, duration=30.0)
    history.refresh()
    assert history.samples("tok") == (20.0, 40.0) * 4 + (30.0,)


def test_remote_admission_hands_out_limits_not_resources(tmp_path: Path) -> None:
    graph = build_graph([step("r", cmd="true", resources=Cores(64) & WTime(T=30)), step("l", cmd="true", resources=Cores(1))],
                        str(tmp_path))
    local = ResourceAdmission(Capacity(cores=(0,), memory=2**30), requests_of(graph, ["r", "l"]), str(tmp_path))
    gate = RemoteAdmission(local, elsewhere=["r"])
    ray_grant = gate.try_acquire(graph.nodes["r"])
    assert ray_grant is not None and ray_grant.allocation is None and ray_grant.timeout == 30
    assert dict(ray_grant.env)["OMP_NUM_THREADS"] == "64"
    local_grant = gate.try_acquire(graph.nodes["l"])
    assert local_grant is not None and gate.try_acquire(graph.nodes["l"]) is None  # the one local core is taken
    gate.release(local_grant)
    assert gate.try_acquire(graph.nodes["l"]) is not None
    assert gate.refusal(graph.nodes["r"]) is None
