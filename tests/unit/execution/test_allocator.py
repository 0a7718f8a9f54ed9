"""Unit tests of marinbuild.execution.allocator: all-or-nothing allocation of what a step asks for."""

from __future__ import annotations

import pytest

from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError
from marinbuild.execution.allocator import Allocation, Allocator, check_fits, shortage
from marinbuild.resources import Cores, Custom, Gpus, Memory, Request, Slices, Token

CAP = Capacity(cores=(0, 1, 2, 3), memory=8 * 2**30, gpus=(0, 1), gpu_type="NVIDIA H100 80GB",
               custom={"uplink": 1}, tokens={"gcs"}, slices={"v4-8": ("s1", "s2")})


def test_allocation_names_concrete_ids_and_release_returns_them() -> None:
    alloc = Allocator(CAP)
    a = alloc.try_allocate(Cores(2) & Memory(4) & Gpus(1, "h100") & Custom("uplink", 1))
    assert a is not None
    assert a.request.core_ids == (0, 1) and a.request.gpu_ids == (0,)
    assert alloc.free.cores == (2, 3) and alloc.free.memory == 4 * 2**30 and alloc.free.custom["uplink"] == 0
    assert alloc.in_use.cores == (0, 1)
    assert alloc.allocations == (a,)
    assert alloc.try_allocate(Custom("uplink", 1)) is None  # all or nothing
    alloc.release(a)
    assert alloc.free == CAP and alloc.allocations == ()


def test_asked_ids_are_given_only_when_free() -> None:
    alloc = Allocator(CAP)
    a = alloc.try_allocate(Cores([1, 3]))
    assert a is not None and a.request.core_ids == (1, 3)
    assert alloc.try_allocate(Cores([3])) is None
    assert not alloc.can_allocate(Cores(3))
    assert alloc.can_allocate(Cores(2))


def test_slices_and_tokens() -> None:
    alloc = Allocator(CAP)
    a = alloc.try_allocate(Slices("v4-8", 2) & Token("gcs"))
    assert a is not None and a.request.slice_names == ("s1", "s2")
    assert alloc.try_allocate(Slices("v4-8")) is None
    assert alloc.try_allocate(Token("gcs")) is not None  # tokens are matched, never used up


def test_check_fits_names_the_step_and_what_is_missing() -> None:
    check_fits("ok", Cores(4) & Memory(8), CAP)
    for request, missing in ((Cores(5), "core"), (Memory(9), "ram=9 GiB"), (Gpus(3), "GPU"),
                             (Token("tpu-only"), "tpu-only"), (Custom("nope", 1), "nope"), (Slices("v4-32"), "v4-32")):
        with pytest.raises(ResourceError, match="'big'") as e:
            check_fits("big", request, CAP)
        assert missing in str(e.value)


def test_shortage_says_what_is_lacking_now() -> None:
    alloc = Allocator(CAP)
    alloc.try_allocate(Cores(4))
    assert "core" in shortage(Cores(1), alloc.free)


def test_allocation_environment() -> None:
    env = Allocation(Request.of(Cores([2, 3])) & Memory(1) & Gpus([1]), machine_has_gpus=True).env()
    assert env["OMP_NUM_THREADS"] == "2" and env["MARINBUILD_CORES"] == "2,3"
    assert env["MARINBUILD_MEMORY"] == str(2**30) and env["CUDA_VISIBLE_DEVICES"] == "1"
    assert "CUDA_VISIBLE_DEVICES" not in Allocation(Request.of(Cores([0]))).env()
    tpu = Allocation(Request.of(Slices("v4-8", names=["s1"]))).env()
    assert tpu["MARINBUILD_TPU_TYPE"] == "v4-8" and tpu["MARINBUILD_TPU_SLICES"] == "s1"
