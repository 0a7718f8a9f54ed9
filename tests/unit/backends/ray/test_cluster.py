"""Unit tests of marinbuild.backends.ray.cluster: requests turned into Ray task options, checked per node."""

from __future__ import annotations

import pytest

from marinbuild.backends.ray.cluster import TOKEN_SHARE, RayNode, place, placement_of, require_ray
from marinbuild.errors import ResourceError
from marinbuild.resources import Cores, Custom, Gpus, Memory, Request, Slices, Token

BIG = RayNode("n1", "10.0.0.1", {"CPU": 8.0, "memory": 32 * 2**30, "GPU": 2.0, "accelerator_type:H100": 1.0,
                                 "gcs": 1.0, "uplink": 2.0})
TPU = RayNode("n2", "10.0.0.2", {"CPU": 4.0, "TPU-v4-8-head": 1.0, "TPU": 4.0})


def test_options_and_demand_of_a_request() -> None:
    p = placement_of("s", Cores(2) & Memory(4) & Gpus(1, "h100") & Custom("uplink", 1) & Token("gcs"), [BIG])
    assert p is not None
    assert dict(p.options) == {"num_cpus": 2, "memory": 4 * 2**30, "num_gpus": 1, "accelerator_type": "H100",
                               "resources": {"uplink": 1.0, "gcs": TOKEN_SHARE}}
    assert p.demand["CPU"] == 2 and p.demand["accelerator_type:H100"] == TOKEN_SHARE
    assert dict(placement_of("z", Request(), []).options) == {"num_cpus": 0}  # type: ignore[union-attr]


def test_a_single_host_tpu_slice_goes_to_a_node_heading_it() -> None:
    p = placement_of("t", Request.of(Slices("v4-8")), [TPU])
    assert p is not None and p.options["resources"] == {"TPU-v4-8-head": 1.0, "TPU": 4.0}
    assert placement_of("t", Request.of(Slices("v4-8", 2)), [TPU]) is None  # multislice: the SSH gang
    assert placement_of("t", Request.of(Slices("v4-32")), [TPU]) is None  # several hosts


def test_a_request_no_single_node_holds_is_refused_at_plan_time() -> None:
    assert set(place({"a": Request.of(Cores(8)), "t": Request.of(Slices("v4-8"))}, [BIG, TPU])) == {"a", "t"}
    with pytest.raises(ResourceError, match=r"'a' asks for cpu=9 .*largest offers 8"):
        place({"a": Request.of(Cores(9))}, [BIG, TPU])
    with pytest.raises(ResourceError, match="no single live Ray node offers all of them together"):
        place({"a": Cores(5) & Gpus(1)}, [RayNode("cpus", "x", {"CPU": 8.0}), RayNode("gpu", "y", {"CPU": 1.0, "GPU": 1.0})])
    with pytest.raises(ResourceError, match="token 'nowhere'"):
        place({"a": Request.of(Token("nowhere"))}, [BIG])


def test_unknown_gpu_types_and_rays_own_resource_names_are_refused() -> None:
    with pytest.raises(ResourceError, match=r"gpu_type='A100' but no live Ray node has it \(accelerator types: H100\)"):
        placement_of("g", Request.of(Gpus(1, "A100")), [BIG])
    with pytest.raises(ResourceError, match="Ray's own resource"):
        placement_of("c", Request.of(Custom("GPU", 1)), [BIG])


def test_require_ray() -> None:
    assert require_ray().__name__ == "ray"
