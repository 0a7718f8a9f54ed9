"""Unit tests of marinbuild.execution.backend_fields: settings refused where a backend would ignore them."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.errors import ResourceError
from marinbuild.execution.admission import requests_of
from marinbuild.execution.backend_fields import FieldCheck, check_fields, free_bytes
from marinbuild.graph import StepGraph, build_graph
from marinbuild.resources import ResourceConfig
from marinbuild.steps import step
from tests.helpers import placed_kind


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
