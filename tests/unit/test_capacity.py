"""Unit tests of marinbuild.capacity: what the machine offers, read from text and cgroup files."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.capacity import (
    Capacity,
    cgroup_limits,
    detect_capacity,
    memory_headroom,
    parse_cfs_quota,
    parse_cpu_max,
    parse_meminfo,
    parse_memory_limit,
    parse_named_counts,
    parse_nvidia_smi,
    restrict_visible_gpus,
    trim_cores,
    with_overrides,
)
from marinbuild.errors import ResourceError


def test_parsers() -> None:
    assert parse_cpu_max("max 100000") is None and parse_cpu_max("50000 100000") == 0.5
    assert parse_cfs_quota("-1", "100000") is None and parse_cfs_quota("300000\n", "100000\n") == 3.0
    assert parse_memory_limit("max") is None and parse_memory_limit(str(2**62)) is None
    assert parse_memory_limit("1073741824\n") == 2**30
    assert parse_meminfo("MemFree: 1 kB\nMemTotal:  2048 kB\n") == 2 * 2**20
    with pytest.raises(ResourceError):
        parse_meminfo("nothing")


def test_nvidia_smi_and_visible_devices() -> None:
    assert parse_nvidia_smi("0, A100\n1, H100\n") == ((0, 1), None)  # mixed: no common type
    assert parse_nvidia_smi("garbage\n") == ((), None)
    assert restrict_visible_gpus((0, 1, 2), None) == (0, 1, 2)
    assert restrict_visible_gpus((0, 1, 2), "2,0") == (0, 2)
    assert restrict_visible_gpus((0, 1, 2), "1,7,2") == (1,)  # CUDA stops at the first bad index
    assert restrict_visible_gpus((0, 1), "GPU-1234") == (0, 1)


def test_trim_cores_and_headroom() -> None:
    assert trim_cores([3, 1, 2], None) == (1, 2, 3)
    assert trim_cores([0, 1, 2, 3], 0.5) == (0,)
    assert memory_headroom(100 * 2**30) == 2 * 2**30


def test_named_counts() -> None:
    assert parse_named_counts([" uplink = 2 "]) == {"uplink": 2}
    for bad in ("uplink", "up-link=1", "uplink=x", "uplink=-1"):
        with pytest.raises(ResourceError, match="NAME=N"):
            parse_named_counts([bad])


def test_capacity_normalizes_and_describes() -> None:
    cap = Capacity(cores=(1, 0, 1), memory=2**30, gpus=(1, 0), gpu_type="H100", custom={"u": 2}, tokens={"gcs"},
                   slices={"v4-8": ("a", "b", "a")})
    assert cap.cores == (0, 1) and cap.gpus == (0, 1) and cap.slices["v4-8"] == ("a", "b")
    assert cap.describe() == "2 cores, 1 GiB, 2 x H100, u=2, token gcs, 2 x v4-8"
    with pytest.raises(ResourceError):
        Capacity(memory=-1)


def test_overrides() -> None:
    cap = Capacity(cores=(0, 1), memory=2**30, tokens={"a"})
    more = with_overrides(cap, cores=4, mem="2g", resources={"u": 1}, tokens=["b"], slices={"v4-8": ["s1"]})
    assert more.cores == (0, 1, 2, 3) and more.memory == 2 * 2**30
    assert more.custom == {"u": 1} and more.tokens == {"a", "b"} and more.slices == {"v4-8": ("s1",)}
    assert with_overrides(cap, cores=1).cores == (0,)
    with pytest.raises(ResourceError, match="--cores"):
        with_overrides(cap, cores=0)


def _cgroup(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree(tmp_path: Path) -> None:
    _cgroup(tmp_path, {"cpu.max": "400000 100000", "memory.max": "max",
                       "a/cpu.max": "max 100000", "a/memory.max": str(2**30),
                       "a/b/cpu.max": "150000 100000", "a/b/memory.max": "max"})
    limits = cgroup_limits(tmp_path, "0::/a/b\n")
    assert limits.cpus == 1.5 and limits.memory == 2**30


def test_cgroup_v1(tmp_path: Path) -> None:
    _cgroup(tmp_path, {"cpu,cpuacct/g/cpu.cfs_quota_us": "200000", "cpu,cpuacct/g/cpu.cfs_period_us": "100000",
                       "memory/g/memory.limit_in_bytes": str(3 * 2**30)})
    limits = cgroup_limits(tmp_path, "4:cpu,cpuacct:/g\n3:memory:/g\n")
    assert limits.cpus == 2.0 and limits.memory == 3 * 2**30


def test_missing_cgroup_files_are_no_limit(tmp_path: Path) -> None:
    limits = cgroup_limits(tmp_path, "0::/nowhere\n")
    assert limits.cpus is None and limits.memory is None


def test_detect_capacity_of_this_machine() -> None:
    cap = detect_capacity()
    assert cap.cores and cap.memory > 0
