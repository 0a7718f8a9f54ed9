"""Unit tests of marinbuild.execution.allocator: all-or-nothing allocation of what a step asks for."""

from __future__ import annotations

import doctest
import threading

import pytest

import marinbuild.execution.allocator
from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError
from marinbuild.execution.allocator import THREAD_ENV_VARS, Allocation, Allocator, check_fits, shortage
from marinbuild.resources import (
    ZERO,
    Cores,
    Custom,
    Gpus,
    Memory,
    Request,
    ResourceConfig,
    Slices,
    Token,
    WTime,
    as_request,
)

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


# -- Tests for the allocator: all-or-nothing hand-out, release, environment, and plan-time fit checks.


GiB = 2**30

MACHINE = Capacity(
    cores=(0, 1, 2, 3),
    memory=8 * GiB,
    gpus=(0, 1),
    gpu_type="NVIDIA H100 80GB HBM3",
    custom={"uplink": 2},
    tokens={"gcs"},
    slices={"v4-8": ["pod-b", "pod-a"], "v5p-8": ["pod-p"]},
)


def test_docstring_examples_hold():
    assert doctest.testmod(marinbuild.execution.allocator).failed == 0


def test_cores_go_out_lowest_ids_first():
    alloc = Allocator(MACHINE)
    first = alloc.try_allocate(Cores(2))
    second = alloc.try_allocate(Cores(1))
    assert first.request.core_ids == (0, 1)
    assert second.request.core_ids == (2,)
    alloc.release(first)
    assert alloc.try_allocate(Cores(4)) is None  # 0, 1 and 3 are free...
    assert alloc.try_allocate(Cores(2)).request.core_ids == (0, 1)  # ...and the lowest go first
    assert alloc.try_allocate(Cores(1)).request.core_ids == (3,)


def test_all_or_nothing_memory_fits_but_cores_do_not():
    alloc = Allocator(MACHINE)
    held = alloc.try_allocate(Cores(3))
    before = alloc.free
    assert alloc.try_allocate(Cores(2) & Memory(1)) is None
    assert alloc.free == before
    assert alloc.free.memory == 8 * GiB
    alloc.release(held)
    assert alloc.free == MACHINE


@pytest.mark.parametrize(
    "short",
    [
        Cores(1) & Memory(9) & Gpus(1),
        Cores(1) & Gpus(3),
        Cores(1) & Memory(1) & Custom("uplink", 3),
        Cores(1) & Memory(1) & Token("other"),
        Cores(1) & Slices("v4-8", 3),
        Cores(1) & Gpus(1, "A100"),
    ],
)
def test_any_short_dimension_leaves_every_pool_as_it_was(short):
    alloc = Allocator(MACHINE)
    assert not alloc.can_allocate(short)
    assert alloc.try_allocate(short) is None
    assert alloc.free == MACHINE
    assert alloc.allocations == ()


def test_can_allocate_reserves_nothing():
    alloc = Allocator(MACHINE)
    request = Cores(4) & Memory(8) & Gpus(2)
    assert alloc.can_allocate(request)
    assert alloc.can_allocate(request)
    assert alloc.free == MACHINE
    taken = alloc.try_allocate(request)
    assert taken is not None
    assert not alloc.can_allocate(Cores(1))


def test_pool_is_whole_again_after_every_release():
    alloc = Allocator(MACHINE)
    requests = [
        Cores(1) & Memory(2) & Gpus(1) & Custom("uplink", 1) & Token("gcs"),
        Cores(2) & Memory("1.5g") & Custom("uplink", 1),
        ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2),
        ResourceConfig.with_tpu(["v4-8", "v5p-8"]),
        Gpus(1) & WTime(T=60),
        None,
    ]
    held = [alloc.try_allocate(r) for r in requests]
    assert all(h is not None for h in held)
    assert alloc.free.cores == () and alloc.free.gpus == ()
    assert alloc.free.custom == {"uplink": 0}
    assert alloc.in_use.memory == 2 * GiB + GiB * 3 // 2
    for h in reversed(held[::2]):
        alloc.release(h)
    for h in held[1::2]:
        alloc.release(h)
    assert alloc.free == MACHINE
    assert alloc.in_use == Capacity(gpu_type=MACHINE.gpu_type)
    assert alloc.allocations == ()


def test_free_and_in_use_add_up_to_capacity():
    alloc = Allocator(MACHINE)
    alloc.try_allocate(Cores(3) & Memory(2) & Gpus(1) & Custom("uplink", 2))
    alloc.try_allocate(Slices("v4-8") & ZERO)
    free, used = alloc.free, alloc.in_use
    assert sorted(free.cores + used.cores) == list(MACHINE.cores)
    assert free.memory + used.memory == MACHINE.memory
    assert sorted(free.gpus + used.gpus) == list(MACHINE.gpus)
    assert used.custom == {"uplink": 2} and free.custom == {"uplink": 0}
    assert used.slices == {"v4-8": ("pod-b",)}
    assert free.slices == {"v4-8": ("pod-a",), "v5p-8": ("pod-p",)}


def test_slices_are_all_of_one_type_falling_back_to_an_alternative():
    alloc = Allocator(MACHINE)
    both = alloc.try_allocate(ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2))
    assert both.request.slices.tpu_type == "v4-8"
    assert both.request.slice_names == ("pod-b", "pod-a")  # the cluster file's order
    alt = alloc.try_allocate(ResourceConfig.with_tpu(["v4-8", "v5p-8"]))
    assert alt.request.slices.tpu_type == "v5p-8"
    assert alt.request.slice_names == ("pod-p",)
    alloc.release(both)
    # Two slices exist only as v4-8; one v4-8 plus one v5p-8 never makes a pair.
    alloc.release(alt)
    alloc.try_allocate(Slices("v4-8"))
    assert alloc.try_allocate(ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2)) is None


def test_released_slices_return_to_their_place():
    alloc = Allocator(MACHINE)
    b = alloc.try_allocate(Slices("v4-8"))
    a = alloc.try_allocate(Slices("v4-8"))
    alloc.release(b)
    alloc.release(a)
    assert alloc.free.slices["v4-8"] == ("pod-b", "pod-a")


def test_an_allocation_is_a_request_for_exactly_its_ids():
    alloc = Allocator(MACHINE)
    first = alloc.try_allocate(Cores(2) & Gpus(1))
    tpu = alloc.try_allocate(Slices("v4-8") & ZERO)
    assert first.request.allocated and tpu.request.allocated
    alloc.release(first)
    alloc.release(tpu)
    alloc.try_allocate(Cores([0]))  # take one of those ids
    assert alloc.try_allocate(first.request) is None
    alloc = Allocator(MACHINE)
    assert alloc.try_allocate(first.request).request == first.request
    alloc.try_allocate(Slices("v4-8", names=["pod-a"]) & ZERO)
    assert alloc.try_allocate(tpu.request).request == tpu.request
    assert alloc.try_allocate(tpu.request) is None


def test_gpu_type_matches_by_name_ignoring_case():
    alloc = Allocator(MACHINE)
    assert alloc.can_allocate(Gpus(1, "h100"))
    assert not alloc.can_allocate(Gpus(1, "A100"))
    assert alloc.try_allocate(Gpus(2, "H100")).request.gpu_ids == (0, 1)


def test_tokens_are_matched_not_used_up():
    alloc = Allocator(MACHINE)
    held = [alloc.try_allocate(Token("gcs") & ZERO) for _ in range(10)]
    assert all(h is not None for h in held)
    assert alloc.free.tokens == {"gcs"}


def test_zero_request_always_fits():
    alloc = Allocator(Capacity())
    assert alloc.try_allocate(ZERO) is not None


def test_release_of_something_not_held_is_refused():
    alloc = Allocator(MACHINE)
    held = alloc.try_allocate(Cores(1))
    alloc.release(held)
    with pytest.raises(ValueError, match="not held"):
        alloc.release(held)
    with pytest.raises(ValueError):
        Allocator(MACHINE).release(Allocation(as_request(Memory(1))))
    assert alloc.free == MACHINE


def test_equal_allocations_are_counted_separately():
    alloc = Allocator(MACHINE)
    a, b = alloc.try_allocate(Memory(1)), alloc.try_allocate(Memory(1))
    assert a == b
    alloc.release(a)
    alloc.release(b)
    assert alloc.free == MACHINE
    with pytest.raises(ValueError):
        alloc.release(a)


def test_threads_never_oversubscribe_the_pool():
    alloc = Allocator(Capacity(cores=tuple(range(4)), memory=4 * GiB))
    most = []
    lock = threading.Lock()

    def worker():
        for _ in range(300):
            held = alloc.try_allocate(Cores(1) & Memory(1))
            if held is None:
                continue
            with lock:
                most.append(len(alloc.allocations))
            alloc.release(held)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most and max(most) <= 4
    assert alloc.free == alloc.capacity


# --- environment ----------------------------------------------------------------------------------


def test_env_sizes_thread_pools_and_lists_cores():
    alloc = Allocator(MACHINE)
    env = alloc.try_allocate(Cores(3) & Memory(2)).env()
    assert {env[v] for v in THREAD_ENV_VARS} == {"3"}
    assert env["MARINBUILD_CORES"] == "0,1,2"
    assert env["MARINBUILD_MEMORY"] == str(2 * GiB)


def test_env_hides_gpus_from_cpu_steps_on_a_gpu_machine():
    alloc = Allocator(MACHINE)
    assert alloc.try_allocate(Cores(1)).env()["CUDA_VISIBLE_DEVICES"] == ""
    assert alloc.try_allocate(Gpus(1)).env()["CUDA_VISIBLE_DEVICES"] == "0"
    assert alloc.try_allocate(Gpus(1)).env()["CUDA_VISIBLE_DEVICES"] == "1"


def test_env_leaves_cuda_alone_without_gpus_and_names_slices():
    alloc = Allocator(Capacity(slices={"v4-8": ["a", "b"]}))
    env = alloc.try_allocate(ResourceConfig.with_tpu("v4-8", slice_count=2)).env()
    assert "CUDA_VISIBLE_DEVICES" not in env
    assert env["OMP_NUM_THREADS"] == "1"  # no local core, still one thread
    assert env["MARINBUILD_CORES"] == ""
    assert (env["MARINBUILD_TPU_TYPE"], env["MARINBUILD_TPU_SLICES"]) == ("v4-8", "a,b")


# --- plan-time checks --------------------------------------------------------------------------------


def _message(request, capacity=MACHINE) -> str:
    with pytest.raises(ResourceError) as err:
        check_fits("train", request, capacity)
    message = str(err.value)
    assert message.startswith("step 'train' ")
    assert "\n" not in message
    return message


def test_check_fits_names_cpu():
    assert (
        _message(Cores(3), Capacity(cores=(0, 1)))
        == "step 'train' asks for cpu=3 but this machine offers 2 (use --cores to change)"
    )


def test_check_fits_names_ram():
    message = _message(ResourceConfig.with_cpu(cpu=1, ram="16g"))
    assert "ram=16 GiB" in message and "8 GiB" in message and "--mem" in message


@pytest.mark.parametrize(
    ("request_", "words"),
    [
        (ResourceConfig.with_gpu(count=3), ["gpu count=3", "2 GPUs"]),
        (ResourceConfig.with_gpu("A100"), ["gpu_type='A100'", "NVIDIA H100"]),
        (ResourceConfig.with_tpu("v6e-8"), ["tpu=v6e-8", "no slice of type v6e-8", "v4-8 x 2"]),
        (ResourceConfig.with_tpu("v4-8", slice_count=3), ["tpu=v4-8 x 3 slices", "only 2"]),
        (Custom("uplink", 3), ["resources.uplink=3", "offers 2", "--resources uplink=N"]),
        (Custom("licence", 1), ["resources.licence=1", "offers 0"]),
        (Token("tpu-quota"), ["token 'tpu-quota'", "--token tpu-quota"]),
        (Cores([9]), ["cores [9]"]),
    ],
)
def test_check_fits_names_the_dimension(request_, words):
    message = _message(request_)
    for word in words:
        assert word in message


def test_check_fits_passes_requests_that_fit_an_idle_machine():
    for request in [None, ZERO, Cores(4) & Memory(8) & Gpus(2), ResourceConfig.with_tpu("v4-8", 2)]:
        check_fits("train", request, MACHINE)
    alloc = Allocator(MACHINE)
    alloc.try_allocate(Cores(4))
    check_fits("train", Cores(4), alloc.capacity)  # fits the machine, though not right now
