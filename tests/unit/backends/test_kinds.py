from __future__ import annotations

import pytest

import marinbuild.backends.base as base
import marinbuild.backends.kinds as kinds
from marinbuild.errors import ResourceError
from marinbuild.resources import ResourceConfig, to_request


class _Elsewhere(kinds.PlacedKind):
    name = "elsewhere"


def test_a_backend_from_outside_finds_the_kinds_half_of_the_interface_in_base_too() -> None:
    for name in kinds.__all__:
        assert getattr(base, name) is getattr(kinds, name)
        assert name in base.__all__


def test_the_defaults_refuse_what_a_backend_running_a_step_once_elsewhere_cannot_honour() -> None:
    placed = _Elsewhere()
    request = to_request(ResourceConfig())
    assert placed.takes("a", request) and placed.check_step("a", ResourceConfig(), request) is request
    with pytest.raises(ResourceError, match=r"step 'a': replicas=2 is for TPU steps .* the elsewhere backend runs a step once"):
        placed.check_step("a", ResourceConfig(replicas=2), request)
    with pytest.raises(ResourceError, match=r"preemptible=False cannot be honoured on the elsewhere backend"):
        placed.check_step("a", ResourceConfig(preemptible=False), request)
    with pytest.raises(ResourceError, match=r"image='x:1' is not supported on the elsewhere backend"):
        placed.image("a", "x:1", lambda image: (None, image))
    with pytest.raises(NotImplementedError, match="the elsewhere backend runs no steps"):
        placed.backend(None, lambda node: None)  # type: ignore[arg-type]


def test_replicas_are_for_tpu_steps() -> None:
    kinds.check_replicas("a", ResourceConfig(replicas=1), "ray")
    kinds.check_replicas("t", ResourceConfig.with_tpu("v5litepod-8", slice_count=2), "ray")
    with pytest.raises(ResourceError, match="the ray backend runs a step once"):
        kinds.check_replicas("a", ResourceConfig(replicas=3), "ray")


def test_a_kind_says_its_part_or_refuses_to_plan() -> None:
    with pytest.raises(NotImplementedError):
        kinds.BackendKind().plan(None)  # type: ignore[arg-type]
