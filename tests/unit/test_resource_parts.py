"""Unit tests of marinbuild.resource_parts: each part of the request language on its own."""

from __future__ import annotations

import pytest

from marinbuild.errors import ResourceError
from marinbuild.resources import (
    Cores,
    FrozenMap,
    Gpus,
    Memory,
    Slices,
    WTime,
)

GiB = 2**30


def test_frozen_map_is_a_hashable_mapping() -> None:
    a, b = FrozenMap({"x": 1, "y": 2}), FrozenMap([("y", 2), ("x", 1)])
    assert a == b == {"x": 1, "y": 2} and hash(a) == hash(b)
    assert len(a) == 2 and list(a) == ["x", "y"] and a["x"] == 1


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


def test_memory_numbers_are_gib_and_strings_use_the_units_rule():
    assert Memory(8).nbytes == 8 * GiB
    assert Memory(0.5).nbytes == GiB // 2
    assert Memory("8GB").nbytes == 8 * 10**9
    assert Memory("8g") == Memory(8)
    assert Memory(8).M == 8.0
    with pytest.raises(ResourceError):
        Memory(-1)


def test_wtime_soft_defaults_to_hard_and_may_not_exceed_it():
    assert WTime(T=60).softT == 60.0
    assert WTime(group="g").T is None
    with pytest.raises(ResourceError, match="softT"):
        WTime(T=60, softT=120)
