"""Unit tests of marinbuild.capacity: what the machine offers, read from text and cgroup files."""

from __future__ import annotations

import doctest
import os
import stat
from pathlib import Path

import pytest

import marinbuild.capacity
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


# -- Tests for capacity detection (cgroup and nvidia-smi parsing, the real machine) and the CLI overrides.


GiB = 2**30


def test_docstring_examples_hold():
    assert doctest.testmod(marinbuild.capacity).failed == 0


# --- pure parsers ---------------------------------------------------------------------------


def test_parse_cpu_max():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("200000 100000\n") == 2.0
    assert parse_cpu_max("50000 100000") == 0.5


def test_parse_cfs_quota():
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("300000\n", "100000\n") == 3.0


def test_parse_memory_limit():
    assert parse_memory_limit("max\n") is None
    assert parse_memory_limit("9223372036854771712\n") is None  # cgroup v1's "unlimited"
    assert parse_memory_limit("4294967296\n") == 4 * GiB


def test_parse_meminfo():
    text = "MemTotal:       24682416 kB\nMemFree:         1000 kB\n"
    assert parse_meminfo(text) == 24682416 * 1024
    with pytest.raises(ResourceError):
        parse_meminfo("MemFree: 1 kB\n")


def test_parse_nvidia_smi():
    same = "0, NVIDIA H100 80GB HBM3\n1, NVIDIA H100 80GB HBM3\n"
    assert parse_nvidia_smi(same) == ((0, 1), "NVIDIA H100 80GB HBM3")
    mixed = "0, NVIDIA A100-SXM4-40GB\n1, Tesla T4\n"
    assert parse_nvidia_smi(mixed) == ((0, 1), None)
    assert parse_nvidia_smi("") == ((), None)
    assert parse_nvidia_smi("No devices were found\n") == ((), None)


def test_restrict_visible_gpus():
    assert restrict_visible_gpus((0, 1, 2, 3), None) == (0, 1, 2, 3)
    assert restrict_visible_gpus((0, 1, 2, 3), "2,0") == (0, 2)
    assert restrict_visible_gpus((0, 1, 2, 3), "") == ()
    assert restrict_visible_gpus((0, 1), "1,7,0") == (1,)  # CUDA stops at the first bad index
    assert restrict_visible_gpus((0, 1), "GPU-5a1b") == (0, 1)


def test_trim_cores_rounds_a_quota_down_but_keeps_one():
    assert trim_cores([3, 1, 2, 0], None) == (0, 1, 2, 3)
    assert trim_cores([0, 1, 2, 3], 2.9) == (0, 1)
    assert trim_cores([0, 1, 2, 3], 0.5) == (0,)
    assert trim_cores([0, 1], 8.0) == (0, 1)


def test_memory_headroom_is_ten_percent_capped_at_two_gib():
    assert memory_headroom(10 * GiB) == GiB
    assert memory_headroom(24 * GiB) == 2 * GiB
    assert memory_headroom(0) == 0


def test_parse_named_counts():
    assert parse_named_counts(["uplink=2", " licence = 1"]) == {"uplink": 2, "licence": 1}
    for bad in ["uplink", "uplink=-1", "up link=1", "uplink=two"]:
        with pytest.raises(ResourceError, match="--resources"):
            parse_named_counts([bad])


# --- cgroup trees on disk -----------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_tightest_limit_up_a_deeper_tree(tmp_path):
    _write(tmp_path / "cpu.max", "max 100000\n")
    _write(tmp_path / "memory.max", "max\n")
    _write(tmp_path / "user.slice/cpu.max", "300000 100000\n")
    _write(tmp_path / "user.slice/memory.max", "8589934592\n")
    _write(tmp_path / "user.slice/job/cpu.max", "max 100000\n")
    _write(tmp_path / "user.slice/job/memory.max", "17179869184\n")
    limits = cgroup_limits(tmp_path, "0::/user.slice/job\n")
    assert limits.cpus == 3.0
    assert limits.memory == 8 * GiB


def test_cgroup_v1_reads_cpu_and_memory_controllers(tmp_path):
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
    _write(tmp_path / "cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_quota_us", "150000\n")
    _write(tmp_path / "cpu,cpuacct/docker/abc/cpu.cfs_period_us", "100000\n")
    _write(tmp_path / "memory/memory.limit_in_bytes", "9223372036854771712\n")
    _write(tmp_path / "memory/docker/abc/memory.limit_in_bytes", "2147483648\n")
    self_cgroup = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"
    limits = cgroup_limits(tmp_path, self_cgroup)
    assert limits.cpus == 1.5
    assert limits.memory == 2 * GiB


def test_cgroup_v1_path_missing_inside_a_container_falls_back_to_the_mount(tmp_path):
    _write(tmp_path / "memory/memory.limit_in_bytes", "1073741824\n")
    limits = cgroup_limits(tmp_path, "4:memory:/host/path/not/mounted\n")
    assert limits.memory == GiB
    assert limits.cpus is None


def test_cgroup_missing_or_garbled_files_mean_no_limit(tmp_path):
    _write(tmp_path / "cpu.max", "garbage\n")
    assert cgroup_limits(tmp_path, "0::/\n").cpus is None
    assert cgroup_limits(tmp_path / "absent", "0::/x\n1:cpu:/y\n") == cgroup_limits(tmp_path, "")
    assert cgroup_limits(tmp_path, "").memory is None


# --- the real machine ----------------------------------------------------------------------------


def _meminfo_total() -> int:
    return parse_meminfo(Path("/proc/meminfo").read_text())


def test_detect_capacity_on_this_machine(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi here
    cap = detect_capacity()
    assert cap.cores
    assert set(cap.cores) <= os.sched_getaffinity(0)
    total = _meminfo_total()
    assert 0 < cap.memory <= total - memory_headroom(total)
    assert cap.gpus == () and cap.gpu_type is None


def test_cgroup_limits_of_this_process_read_without_error():
    limits = cgroup_limits()
    assert limits.cpus is None or limits.cpus > 0
    assert limits.memory is None or limits.memory > 0


def _fake_nvidia_smi(directory: Path, body: str) -> None:
    exe = directory / "nvidia-smi"
    exe.write_text(f"#!/bin/sh\n{body}\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)


def test_gpus_come_from_nvidia_smi_when_present(monkeypatch, tmp_path):
    _fake_nvidia_smi(tmp_path, "printf '0, NVIDIA L4\\n1, NVIDIA L4\\n2, NVIDIA L4\\n'")
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,1")
    cap = detect_capacity()
    assert cap.gpus == (1, 2)
    assert cap.gpu_type == "NVIDIA L4"


def test_failing_nvidia_smi_means_no_gpus(monkeypatch, tmp_path):
    _fake_nvidia_smi(tmp_path, "echo 'NVIDIA-SMI has failed' >&2; exit 9")
    monkeypatch.setenv("PATH", str(tmp_path))
    cap = detect_capacity()
    assert cap.gpus == () and cap.gpu_type is None


# --- overrides ---------------------------------------------------------------------------------------


def test_with_overrides_applies_each_flag():
    cap = Capacity(cores=(0, 1, 2, 3), memory=8 * GiB, custom={"uplink": 1}, tokens={"a"})
    out = with_overrides(cap, cores=2, mem="3g", resources={"licence": 2}, tokens=["b"])
    assert out.cores == (0, 1)
    assert out.memory == 3 * GiB
    assert out.custom == {"uplink": 1, "licence": 2}
    assert out.tokens == {"a", "b"}
    assert with_overrides(cap) == cap


def test_with_overrides_beyond_detected_cores_adds_ids():
    assert with_overrides(Capacity(cores=(0, 1)), cores=4).cores == (0, 1, 2, 3)
    assert with_overrides(Capacity(), cores=2).cores == (0, 1)


def test_with_overrides_sets_slices_in_given_order():
    out = with_overrides(Capacity(), slices={"v4-8": ["pod-b", "pod-a"]})
    assert out.slices == {"v4-8": ("pod-b", "pod-a")}


@pytest.mark.parametrize("kw", [{"cores": 0}, {"cores": -1}, {"mem": "lots"}, {"resources": {"uplink": -1}}])
def test_with_overrides_refuses_bad_values(kw):
    with pytest.raises(ResourceError):
        with_overrides(Capacity(cores=(0,)), **kw)


def test_capacity_describe():
    cap = Capacity(cores=(0, 1), memory=22 * GiB, gpus=(0,), gpu_type="NVIDIA L4", slices={"v4-8": ["a", "b"]})
    assert cap.describe() == "2 cores, 22 GiB, 1 x NVIDIA L4, 2 x v4-8"
