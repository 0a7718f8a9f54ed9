"""Unit tests of marinbuild.resources: the request language, ResourceConfig and the conversions."""

from __future__ import annotations

import pytest

from marinbuild.errors import ResourceError
from marinbuild.resources import (
    ZERO,
    Cores,
    CpuConfig,
    Custom,
    FrozenMap,
    GpuConfig,
    Gpus,
    Memory,
    Node,
    Request,
    ResourceConfig,
    Slices,
    Token,
    TpuConfig,
    WTime,
    as_request,
    to_request,
    to_resource_config,
)


def test_frozen_map_is_a_hashable_mapping() -> None:
    a, b = FrozenMap({"x": 1, "y": 2}), FrozenMap([("y", 2), ("x", 1)])
    assert a == b == {"x": 1, "y": 2} and hash(a) == hash(b)
    assert len(a) == 2 and list(a) == ["x", "y"] and a["x"] == 1


def test_parts_combine_with_and() -> None:
    req = Cores(2) & Memory(8) & WTime(T="1:00:00", softT=1800, group="g") & Token("gcs") & Custom("uplink", 1)
    assert (req.N, req.M, req.nbytes, req.T, req.softT, req.group) == (2, 8.0, 8 * 2**30, 3600.0, 1800.0, "g")
    assert req.tokens == {"gcs"} and req.custom == {"uplink": 1}
    assert ZERO & req == req and req & ZERO == req


def test_node_is_cores_and_memory() -> None:
    assert Node(2, "8g") == Cores(2) & Memory(8)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Cores(1) & Cores(2),
        lambda: Token("a") & Token("a"),
        lambda: Custom("c", 1) & Custom("c", 2),
        lambda: Gpus(1) & Slices("v4-8"),
    ],
)
def test_conflicting_parts_are_refused(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResourceError):
        make()


def test_memory_numbers_are_gib_and_strings_are_sizes() -> None:
    assert Memory(0.5).nbytes == 2**29
    assert Memory("512m") == Memory.of_bytes(512 * 2**20)
    assert repr(Memory(8)) == "Memory('8GiB')"
    assert repr(Memory.of_bytes(1001)) == "Memory('1001B')"
    for bad in (-1, float("nan"), True, None):
        with pytest.raises(ResourceError):
            Memory(bad)  # type: ignore[arg-type]


def test_cores_and_gpus_by_count_or_ids() -> None:
    assert Cores([4, 6]).N == 2 and Cores([4, 6]).ids == (4, 6) and Cores(3).ids is None
    assert Gpus([1, 3], "H100").n == 2 and repr(Gpus(2, "h100")) == "Gpus(2, 'h100')"
    with pytest.raises(ResourceError):
        Gpus(0)
    with pytest.raises(ResourceError):
        Cores(-1)


def test_wtime() -> None:
    assert WTime(T=60) == WTime(T=60, softT=60)
    assert repr(WTime(T=3600, softT=1800, group="g")) == "WTime(T='1:00:00', softT='0:30:00', group='g')"
    with pytest.raises(ResourceError, match="longer than"):
        WTime(T=10, softT=20)
    with pytest.raises(ResourceError, match="group"):
        WTime(group="")


def test_slices_alternatives_must_share_the_vm_shape() -> None:
    s = Slices("v4-8", 2, alternatives=["v5p-8"])
    assert s.tpu_types == ("v4-8", "v5p-8") and s.n == 2
    assert Slices("v4-8", names=["a", "b"]).n == 2
    with pytest.raises(ResourceError, match="cannot be alternatives"):
        Slices("v4-8", alternatives=["v4-32"])
    with pytest.raises(ResourceError, match="repeats"):
        Slices("v4-8", alternatives=["v4-8"])
    with pytest.raises(ResourceError, match="distinct"):
        Slices("v4-8", names=["a", "a"])


def test_request_reads_allocated_ids() -> None:
    req = Request.of(Cores([0, 1])) & Gpus([2])
    assert req.core_ids == (0, 1) and req.gpu_ids == (2,)
    assert req.allocated
    assert not (Cores(2) & Gpus(1)).allocated


def test_resource_config_constructors() -> None:
    cpu = ResourceConfig.with_cpu(cpu=2, ram="8g", env_vars={"A": "1"})
    assert (cpu.cpu, cpu.ram, cpu.device) == (2, 8 * 2**30, CpuConfig())
    assert ResourceConfig.with_gpu("H100", count=8).device == GpuConfig("H100", 8)
    tpu = ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2)
    assert tpu.device == TpuConfig("v4-8", 2) and tpu.replicas == 2 and tpu.tpu_types == ("v4-8", "v5p-8")
    assert cpu.tpu_types == ()


@pytest.mark.parametrize(
    "make",
    [
        lambda: ResourceConfig(device=TpuConfig("v4-8", 2), replicas=1),
        lambda: ResourceConfig(device_alternatives=("v4-8",)),
        lambda: ResourceConfig(env_vars={"A": 1}),  # type: ignore[dict-item]
        lambda: ResourceConfig.with_tpu([]),
        lambda: TpuConfig("v99-1"),
        lambda: GpuConfig(""),
        lambda: ResourceConfig(device="gpu"),  # type: ignore[arg-type]
    ],
)
def test_bad_resource_configs_are_refused(make) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ResourceError):
        make()


def test_conversions_round_trip() -> None:
    rc = ResourceConfig.with_cpu(cpu=2, ram="8g", tokens={"gcs"}, custom={"uplink": 1}, walltime=WTime(T=60))
    req = to_request(rc)
    assert req == Cores(2) & Memory(8) & WTime(T=60) & Token("gcs") & Custom("uplink", 1)
    back = to_resource_config(req)
    assert (back.cpu, back.ram, back.tokens, back.custom, back.walltime) == (2, 8 * 2**30, {"gcs"}, {"uplink": 1}, WTime(T=60))
    tpu = to_request(ResourceConfig.with_tpu("v4-8", slice_count=2))
    assert tpu.slices == Slices("v4-8", 2) and tpu.N == 0
    assert to_resource_config(Gpus(2)).device == GpuConfig("auto", 2)


def test_as_request() -> None:
    assert as_request(None) == Request.of(Cores(1))
    assert as_request(Cores(3)) == Request.of(Cores(3))
    assert as_request(ResourceConfig.with_cpu(4, ram=None)) == Request.of(Cores(4))
    with pytest.raises(ResourceError, match="resources must be"):
        as_request("2 cores")  # type: ignore[arg-type]
