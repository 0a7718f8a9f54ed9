"""Unit tests of marinbuild.resources: the request language, ResourceConfig and the conversions."""

from __future__ import annotations

import doctest

import pytest

import marinbuild.resources
import marinbuild.units
from marinbuild.errors import ResourceError, UserError
from marinbuild.resources import (
    ZERO,
    Cores,
    CpuConfig,
    Custom,
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
from marinbuild.tpu_types import tpu_topology
from marinbuild.units import format_bytes, format_duration, parse_duration, parse_memory


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


# -- Tests for the resource model: units, the TPU table as seen by configs, ResourceConfig and the request language.


GiB = 2**30


@pytest.mark.parametrize("module", [marinbuild.units, marinbuild.resources])
def test_docstring_examples_hold(module):
    assert doctest.testmod(module).failed == 0


# --- units ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("4g", 4 * GiB),
        ("4G", 4 * GiB),
        ("4gb", 4 * GiB),
        ("4Gb", 4 * GiB),
        ("4GiB", 4 * GiB),
        ("4gib", 4 * GiB),
        ("4GB", 4 * 10**9),
        ("4MB", 4 * 10**6),
        ("4kB", 4000),
        ("4KB", 4000),
        ("4k", 4096),
        ("512m", 512 * 2**20),
        ("2t", 2 * 2**40),
        ("1.5g", 3 * GiB // 2),
        (".5k", 512),
        ("  3 MiB ", 3 * 2**20),
        ("4096", 4096),
        ("10b", 10),
        (4096, 4096),
        (4096.0, 4096),
    ],
)
def test_parse_memory_follows_one_rule(text, expected):
    assert parse_memory(text) == expected


@pytest.mark.parametrize("bad", ["", "g", "4x", "4 gigs", "-1g", "4iB", -5, 1.5, float("nan"), True, None, [4]])
def test_parse_memory_refuses_bad_input_naming_it(bad):
    with pytest.raises(ResourceError) as err:
        parse_memory(bad)
    assert repr(bad) in str(err.value)
    assert "\n" not in str(err.value)
    assert err.value.exit_code == 2


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (90, 90.0),
        (2.5, 2.5),
        ("3600", 3600.0),
        ("1:00:00", 3600.0),
        ("05:30", 330.0),
        ("90:00", 5400.0),
        ("1-02:03:04", 93784.0),
        ("0:00:01.5", 1.5),
    ],
)
def test_parse_duration(value, seconds):
    assert parse_duration(value) == seconds


@pytest.mark.parametrize("bad", ["1:60:00", "1-24:00:00", "2-30", "1h", "-5", "abc", -1, True])
def test_parse_duration_refuses_bad_input(bad):
    with pytest.raises(ResourceError):
        parse_duration(bad)


@pytest.mark.parametrize("seconds", [0, 59, 3725, 90000, 0.5, 7322.25])
def test_format_duration_reads_back(seconds):
    assert parse_duration(format_duration(seconds)) == seconds


def test_format_bytes():
    assert format_bytes(4 * GiB) == "4 GiB"
    assert format_bytes(3 * GiB // 2) == "1.5 GiB"
    assert format_bytes(512 * 2**20) == "512 MiB"
    assert format_bytes(1023) == "1023 B"


# --- TPU table, as configs use it ------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "vms", "chips_per_vm"),
    [
        ("v4-8", 1, 4),
        ("v4-32", 4, 4),
        ("v5p-8", 1, 4),
        ("v5litepod-4", 1, 4),
        ("v5litepod-16", 4, 4),
        ("v6e-8", 1, 8),
        ("v6e-16", 4, 4),
        ("v6e-256", 64, 4),
    ],
)
def test_tpu_table(name, vms, chips_per_vm):
    top = tpu_topology(name)
    assert (top.vm_count, top.chips_per_vm) == (vms, chips_per_vm)
    assert TpuConfig(name).topology == top


def test_unknown_tpu_type_is_a_resource_error():
    with pytest.raises(ResourceError, match="v9-8"):
        ResourceConfig.with_tpu("v9-8")


# --- ResourceConfig ---------------------------------------------------------------------------


def test_with_cpu_parses_sizes():
    rc = ResourceConfig.with_cpu(cpu=2, ram="8g", disk="100GB")
    assert (rc.cpu, rc.ram, rc.disk) == (2, 8 * GiB, 100 * 10**9)
    assert rc.device == CpuConfig()
    assert ResourceConfig.with_cpu().ram == 4 * GiB


def test_with_gpu():
    rc = ResourceConfig.with_gpu("H100", count=8, ram="64g")
    assert rc.device == GpuConfig("H100", 8)
    assert rc.ram == 64 * GiB
    assert ResourceConfig.with_gpu().device == GpuConfig("auto", 1)


def test_with_tpu_sets_replicas_and_holds_no_local_core():
    rc = ResourceConfig.with_tpu("v4-8", slice_count=2)
    assert rc.device == TpuConfig("v4-8", 2)
    assert rc.replicas == 2
    assert rc.cpu == 0
    assert rc.tpu_types == ("v4-8",)


def test_with_tpu_accepts_alternatives_of_the_same_shape():
    rc = ResourceConfig.with_tpu(["v4-8", "v5p-8"])
    assert rc.device.tpu_type == "v4-8"
    assert rc.device_alternatives == ("v5p-8",)
    assert rc.tpu_types == ("v4-8", "v5p-8")


def test_with_tpu_refuses_alternatives_of_another_shape_naming_both():
    with pytest.raises(ResourceError) as err:
        ResourceConfig.with_tpu(["v6e-4", "v6e-8"])
    assert "v6e-4" in str(err.value) and "v6e-8" in str(err.value)


def test_with_tpu_refuses_vm_count_mismatch():
    with pytest.raises(ResourceError, match="v4-32"):
        ResourceConfig.with_tpu(["v4-8", "v4-32"])


@pytest.mark.parametrize(
    "make",
    [
        lambda: ResourceConfig(cpu=-1),
        lambda: ResourceConfig(cpu=1.5),
        lambda: ResourceConfig(ram="lots"),
        lambda: ResourceConfig(replicas=0),
        lambda: ResourceConfig.with_tpu("v4-8", slice_count=0),
        lambda: ResourceConfig.with_tpu([]),
        lambda: ResourceConfig.with_tpu(["v4-8", "v4-8"]),
        lambda: ResourceConfig.with_gpu(count=0),
        lambda: ResourceConfig(device=TpuConfig("v4-8", 2), replicas=1),
        lambda: ResourceConfig(device_alternatives=("v4-8",)),
        lambda: ResourceConfig(custom={"not a name": 1}),
        lambda: ResourceConfig(custom={"uplink": -1}),
        lambda: ResourceConfig(env_vars={"A": 1}),
    ],
)
def test_bad_configs_are_user_errors(make):
    with pytest.raises(ResourceError) as err:
        make()
    assert isinstance(err.value, UserError)


def test_resource_config_is_hashable_with_mappings():
    a = ResourceConfig.with_cpu(env_vars={"B": "2", "A": "1"}, custom={"uplink": 1}, tokens="gcs")
    b = ResourceConfig.with_cpu(env_vars={"A": "1", "B": "2"}, custom={"uplink": 1}, tokens=["gcs"])
    assert a == b and hash(a) == hash(b)
    assert a.tokens == frozenset({"gcs"})
    assert a.env_vars == {"A": "1", "B": "2"}
    with pytest.raises(TypeError):
        a.env_vars["C"] = "3"  # type: ignore[index]


def test_walltime_on_config_accepts_a_duration():
    assert ResourceConfig(walltime="1:00:00").walltime == WTime(T=3600)


# --- the request language ----------------------------------------------------------------------


def test_combining_two_of_one_kind_is_refused():
    with pytest.raises(ResourceError, match="cannot combine two Memory"):
        Memory(2) & Memory(8)
    with pytest.raises(ResourceError, match="cannot combine two Cores"):
        Node(1, 2) & Cores(2)


def test_tokens_combine_when_distinct_only():
    assert (Token("a") & Token("b")).tokens == {"a", "b"}
    with pytest.raises(ResourceError, match="'a'"):
        Token("a") & Cores(1) & Token("a")


def test_custom_resources_combine_when_distinct_only():
    req = Custom("uplink", 2) & Custom("licence", 1)
    assert req.custom == {"uplink": 2, "licence": 1}
    with pytest.raises(ResourceError, match="uplink"):
        req & Custom("uplink", 1)


def test_gpus_and_slices_do_not_combine():
    with pytest.raises(ResourceError, match="one kind of accelerator"):
        Gpus(1) & Slices("v4-8")


def test_zero_is_the_identity():
    req = Cores(2) & Memory(1)
    assert ZERO & req == req
    assert req & ZERO == req
    assert ZERO & ZERO == ZERO
    assert repr(ZERO) == "ZERO"


def test_combination_does_not_depend_on_order():
    assert Cores(2) & Memory(8) & Token("x") == Token("x") & Memory(8) & Cores(2)


def test_grain_style_attributes():
    req = Node(N=2, M=8) & WTime(T="1:00:00", softT=1800, group="g")
    assert (req.N, req.M, req.nbytes) == (2, 8.0, 8 * GiB)
    assert (req.T, req.softT, req.group) == (3600.0, 1800.0, "g")
    assert (ZERO.N, ZERO.M, ZERO.T) == (0, 0.0, None)


def test_requested_and_allocated_forms():
    assert Cores(3).ids is None
    allocated = Cores([1, 3, 4])
    assert allocated.ids == (1, 3, 4) and allocated.N == 3
    assert Gpus([0, 2]).n == 2
    assert Slices("v4-8", names=["a", "b"]).n == 2
    req = Cores([0]) & Gpus([1])
    assert (req.core_ids, req.gpu_ids, req.slice_names) == ((0,), (1,), ())
    assert req.allocated
    assert as_request(Slices("v4-8", names=["a"])).slice_names == ("a",)
    assert not (Cores(1) & Gpus([1])).allocated
    with pytest.raises(ResourceError, match="repeats"):
        Cores([1, 1])


def test_reprs_read_like_the_language():
    req = Cores(2) & Memory("8g") & WTime(T=3600) & Token("gcs") & Custom("uplink", 1)
    assert repr(req) == "Cores(2) & Memory('8GiB') & WTime(T='1:00:00') & Token('gcs') & Custom('uplink', 1)"
    assert repr(Memory.of_bytes(10**9 + 1)) == "Memory('1000000001B')"


# --- conversions -----------------------------------------------------------------------------------


def test_request_round_trips_through_config():
    req = Cores(2) & Memory("8g") & WTime(T="1:00:00")
    rc = to_resource_config(req)
    assert (rc.cpu, rc.ram, rc.walltime) == (2, 8 * GiB, WTime(T=3600))
    assert to_request(rc) == req


@pytest.mark.parametrize(
    "req",
    [
        ZERO,
        Cores(1),
        Gpus(2, "H100") & Cores(4) & Memory(16),
        Gpus(1) & Custom("uplink", 2) & Token("gcs") & WTime(group="train"),
        Slices("v4-8", 2, alternatives=["v5p-8"]) & Memory(1),
    ],
)
def test_requests_round_trip(req):
    assert to_request(to_resource_config(req)) == as_request(req)


@pytest.mark.parametrize(
    "rc",
    [
        ResourceConfig(),
        ResourceConfig.with_cpu(cpu=3, ram="2g", custom={"uplink": 1}, tokens={"gcs"}),
        ResourceConfig.with_gpu("A100", count=2, cpu=4),
        ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2, walltime=WTime(T=600, group="g")),
    ],
)
def test_schedulable_configs_round_trip(rc):
    assert to_resource_config(to_request(rc)) == rc


def test_config_to_request_maps_devices():
    assert to_request(ResourceConfig.with_gpu(count=2)).gpus == Gpus(2)
    assert to_request(ResourceConfig.with_tpu("v4-8", slice_count=2)) == Slices("v4-8", 2) & ZERO


def test_as_request_defaults_to_one_core_and_no_memory():
    assert as_request(None) == Request(cores=Cores(1))
    assert as_request(None).nbytes == 0
    assert as_request(Cores(2)) == Cores(2) & ZERO
    assert as_request(ResourceConfig.with_cpu(cpu=2, ram="1g")) == Cores(2) & Memory(1)
    req = Cores(2) & Memory(1)
    assert as_request(req) is req
    with pytest.raises(ResourceError):
        as_request("2 cores")  # type: ignore[arg-type]
