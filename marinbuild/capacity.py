"""What this machine offers to steps: cores, memory, GPUs, named resources, tokens, TPU slices.

``detect_capacity()`` reads the machine once: the cores this process may run on
(``sched_getaffinity``) trimmed to a cgroup CPU quota, memory from the cgroup limit or
``MemTotal`` less a headroom, and GPUs from ``nvidia-smi`` when it is installed.
``with_overrides`` applies the command-line flags (``--cores``, ``--mem``,
``--resources NAME=N``, ``--token NAME``).

The file parsers are pure functions of the file text, so they are tested on fixtures.

Memory headroom: marinbuild keeps ``min(10 % of memory, 2 GiB)`` for itself and the
system, so steps are offered the rest (a 24 GiB machine offers 22 GiB).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from marinbuild.errors import ResourceError
from marinbuild.resources import Custom, FrozenMap, Token
from marinbuild.units import format_bytes, parse_memory

__all__ = [
    "MEMORY_HEADROOM_CAP",
    "MEMORY_HEADROOM_FRACTION",
    "Capacity",
    "CgroupLimits",
    "Machine",
    "cgroup_limits",
    "detect_capacity",
    "memory_headroom",
    "parse_cfs_quota",
    "parse_cpu_max",
    "parse_meminfo",
    "parse_memory_limit",
    "parse_named_counts",
    "parse_nvidia_smi",
    "restrict_visible_gpus",
    "trim_cores",
    "with_overrides",
]

MEMORY_HEADROOM_FRACTION = 0.10
MEMORY_HEADROOM_CAP = 2 * 2**30
# cgroup v1 reports "no limit" as a page-rounded 2**63 - 1; anything this large is no limit.
_NO_LIMIT = 2**60

T = TypeVar("T")


@dataclass(frozen=True)
class Capacity:
    """Everything one machine (and its TPU cluster) offers.

    ``slices`` maps a TPU type to the names of slices of that type, in the cluster
    file's order, which is the order they are handed out in. ``tokens`` are offered,
    not consumed. Core and GPU ids are kept sorted.

    >>> Capacity(cores=(0, 1), memory=8 * 2**30).cores
    (0, 1)
    """

    cores: tuple[int, ...] = ()
    memory: int = 0
    gpus: tuple[int, ...] = ()
    gpu_type: str | None = None
    custom: Mapping[str, int] = field(default_factory=FrozenMap)
    tokens: frozenset[str] = frozenset()
    slices: Mapping[str, tuple[str, ...]] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        def fix(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        fix("cores", tuple(sorted(set(self.cores))))
        fix("gpus", tuple(sorted(set(self.gpus))))
        if self.memory < 0:
            raise ResourceError(f"capacity memory must be ≥ 0, got {self.memory}")
        fix("custom", FrozenMap(sorted((k, Custom(k, v).n) for k, v in self.custom.items())))
        fix("tokens", frozenset(Token(t).token for t in self.tokens))
        fix("slices", FrozenMap(sorted((t, tuple(dict.fromkeys(names))) for t, names in self.slices.items())))

    def describe(self) -> str:
        """One line for people, e.g. ``2 cores, 22 GiB, no GPUs``."""
        parts = [f"{len(self.cores)} core{'s' if len(self.cores) != 1 else ''}", format_bytes(self.memory)]
        parts.append(f"{len(self.gpus)} x {self.gpu_type or 'GPU'}" if self.gpus else "no GPUs")
        parts += [f"{k}={v}" for k, v in self.custom.items()]
        parts += [f"token {t}" for t in sorted(self.tokens)]
        parts += [f"{len(names)} x {t}" for t, names in self.slices.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class CgroupLimits:
    """Limits found in this process's cgroups; None where there is none."""

    cpus: float | None = None
    memory: int | None = None


# ---------------------------------------------------------------------------------------
# Pure parsers.


def parse_cpu_max(text: str) -> float | None:
    """CPUs allowed by a cgroup v2 ``cpu.max`` (``"max 100000"`` is no limit).

    >>> parse_cpu_max("150000 100000")
    1.5
    """
    fields = text.split()
    if not fields or fields[0] == "max":
        return None
    period = int(fields[1]) if len(fields) > 1 else 100_000
    return int(fields[0]) / period


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """CPUs allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` (quota -1: none).

    >>> parse_cfs_quota("200000", "100000")
    2.0
    """
    quota = int(quota_text.strip())
    return None if quota < 0 else quota / int(period_text.strip())


def parse_memory_limit(text: str) -> int | None:
    """Bytes allowed by v2 ``memory.max`` or v1 ``memory.limit_in_bytes``; None for no limit.

    >>> parse_memory_limit("max") is None
    True
    """
    text = text.strip()
    if text == "max":
        return None
    limit = int(text)
    return None if limit >= _NO_LIMIT else limit


def parse_meminfo(text: str) -> int:
    """``MemTotal`` from ``/proc/meminfo``, in bytes.

    >>> parse_meminfo("MemTotal:       1024 kB\\nMemFree: 1 kB")
    1048576
    """
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            value, *unit = line.split(":", 1)[1].split()
            return int(value) * (1024 if unit == ["kB"] else 1)
    raise ResourceError("/proc/meminfo has no MemTotal line")


def parse_nvidia_smi(text: str) -> tuple[tuple[int, ...], str | None]:
    """GPU indices and their common type from ``nvidia-smi --query-gpu=index,name --format=csv,noheader``.

    The type is None when the machine mixes models (then only untyped requests fit).

    >>> parse_nvidia_smi("0, NVIDIA H100 80GB HBM3\\n1, NVIDIA H100 80GB HBM3\\n")
    ((0, 1), 'NVIDIA H100 80GB HBM3')
    """
    indices, names = [], set()
    for line in text.splitlines():
        if "," not in line:
            continue
        index, name = (part.strip() for part in line.split(",", 1))
        if index.isdigit():
            indices.append(int(index))
            names.add(name)
    return tuple(indices), (names.pop() if len(names) == 1 else None)


def restrict_visible_gpus(gpus: tuple[int, ...], cuda_visible_devices: str | None) -> tuple[int, ...]:
    """Keep only the GPUs that ``CUDA_VISIBLE_DEVICES`` lets marinbuild itself use.

    UUID forms are not matched against indices, so they leave the list as it is.

    >>> restrict_visible_gpus((0, 1, 2, 3), "1,3")
    (1, 3)
    """
    if cuda_visible_devices is None:
        return gpus
    items = [s.strip() for s in cuda_visible_devices.split(",") if s.strip()]
    if not all(s.lstrip("-").isdigit() for s in items):
        return gpus
    visible = []
    for s in items:
        # CUDA stops at the first invalid index, so do the same.
        if int(s) not in gpus:
            break
        visible.append(int(s))
    return tuple(sorted(set(visible)))


def trim_cores(cores: Iterable[int], cpus: float | None) -> tuple[int, ...]:
    """The lowest ``floor(cpus)`` cores (at least one), or all of them without a quota.

    Rounding down never over-subscribes a fractional quota.

    >>> trim_cores([0, 1, 2, 3], 2.5)
    (0, 1)
    """
    ordered = tuple(sorted(cores))
    if cpus is None:
        return ordered
    return ordered[: max(1, math.floor(cpus))]


def memory_headroom(total: int) -> int:
    """Bytes kept back from ``total``: 10 % of it, at most 2 GiB.

    >>> memory_headroom(4 * 2**30) == 4 * 2**30 // 10
    True
    """
    return min(int(total * MEMORY_HEADROOM_FRACTION), MEMORY_HEADROOM_CAP)


def parse_named_counts(items: Iterable[str]) -> dict[str, int]:
    """``["NAME=N", ...]`` from ``--resources`` flags, as a dict.

    >>> parse_named_counts(["uplink=1", "gpu_mem_gb=80"])
    {'uplink': 1, 'gpu_mem_gb': 80}
    """
    counts: dict[str, int] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip().isidentifier() or not value.strip().isdigit():
            raise ResourceError(f"--resources {item!r}: write NAME=N with N a whole number, e.g. uplink=2")
        counts[name.strip()] = int(value)
    return counts


# ---------------------------------------------------------------------------------------
# Reading the machine.


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _own_and_ancestors(mount: Path, relative: str) -> list[Path]:
    """``mount/relative`` and every parent up to ``mount``: a limit may sit on any of them."""
    dirs, current = [], mount / relative.strip("/")
    while True:
        dirs.append(current)
        if current == mount:
            return dirs
        current = current.parent


_V1_MOUNTS = {"cpu": ("cpu", "cpu,cpuacct", "cpuacct,cpu"), "memory": ("memory",)}


def _v1_dirs(root: Path, controller: str, relative: str) -> list[Path]:
    """The v1 directories to read for ``controller``, own group first."""
    for name in _V1_MOUNTS[controller]:
        mount = root / name
        if mount.is_dir():
            # Inside a container the listed path may not exist; the mount root is then ours.
            return [d for d in _own_and_ancestors(mount, relative) if d.is_dir()] or [mount]
    return []


def _parsed(parse: Callable[[str], T | None], path: Path) -> T | None:
    """``parse`` of the file at ``path``; None when it is missing or unreadable."""
    text = _read(path)
    try:
        return None if text is None else parse(text)
    except (ValueError, IndexError, ZeroDivisionError):
        return None


def _v1_cpus(d: Path) -> float | None:
    period = _read(d / "cpu.cfs_period_us")
    if period is None:
        return None
    return _parsed(lambda quota: parse_cfs_quota(quota, period), d / "cpu.cfs_quota_us")


def cgroup_limits(root: Path = Path("/sys/fs/cgroup"), self_cgroup: str | None = None) -> CgroupLimits:
    """The tightest CPU and memory limits over this process's cgroups (v2 and v1) and their parents.

    ``self_cgroup`` is the text of ``/proc/self/cgroup`` (read when not given). A missing
    or unreadable file is no limit, never an error.
    """
    if self_cgroup is None:
        self_cgroup = _read(Path("/proc/self/cgroup")) or ""
    cpus: list[float | None] = []
    mems: list[int | None] = []
    for line in self_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and not controllers:
            for d in _own_and_ancestors(root, relative):
                cpus.append(_parsed(parse_cpu_max, d / "cpu.max"))
                mems.append(_parsed(parse_memory_limit, d / "memory.max"))
        names = controllers.split(",")
        if "cpu" in names:
            cpus += [_v1_cpus(d) for d in _v1_dirs(root, "cpu", relative)]
        if "memory" in names:
            v1_memory = _v1_dirs(root, "memory", relative)
            mems += [_parsed(parse_memory_limit, d / "memory.limit_in_bytes") for d in v1_memory]
    return CgroupLimits(
        cpus=min((c for c in cpus if c is not None), default=None),
        memory=min((m for m in mems if m is not None), default=None),
    )


def _total_memory() -> int:
    text = _read(Path("/proc/meminfo"))
    if text is not None:
        return parse_meminfo(text)
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def _online_cores() -> tuple[int, ...]:
    if hasattr(os, "sched_getaffinity"):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _detect_gpus() -> tuple[tuple[int, ...], str | None]:
    """GPUs from nvidia-smi; none when it is missing, fails or hangs."""
    import shutil
    import subprocess

    exe = shutil.which("nvidia-smi")
    if exe is None:
        return (), None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index,name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return (), None
    gpus, gpu_type = parse_nvidia_smi(out)
    return restrict_visible_gpus(gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), gpu_type


def detect_capacity() -> Capacity:
    """What this machine offers, read from the OS (see the module docstring for the rules).

    >>> detect_capacity().memory > 0
    True
    """
    limits = cgroup_limits()
    total = _total_memory()
    if limits.memory is not None:
        total = min(total, limits.memory)
    gpus, gpu_type = _detect_gpus()
    return Capacity(
        cores=trim_cores(_online_cores(), limits.cpus),
        memory=total - memory_headroom(total),
        gpus=gpus,
        gpu_type=gpu_type if gpus else None,
    )


@dataclass(frozen=True)
class Machine:
    """What this run may use of the machine, as the command line says it (``--cores``, ``--mem``,
    ``--resources``, ``--token``); ``None`` means detected. :func:`with_overrides` applies it."""

    cores: int | None = None
    mem: str | None = None
    resources: tuple[str, ...] = ()
    tokens: tuple[str, ...] = ()


def with_overrides(
    cap: Capacity,
    *,
    cores: int | None = None,
    mem: int | str | None = None,
    resources: Mapping[str, int] | None = None,
    tokens: Iterable[str] = (),
    slices: Mapping[str, Iterable[str]] | None = None,
) -> Capacity:
    """``cap`` as changed by ``--cores N``, ``--mem SIZE``, ``--resources NAME=N``, ``--token NAME``.

    ``--cores N`` keeps the lowest N detected ids; past the detected count it adds ids
    above them, which are counted but cannot be pinned. ``--mem`` replaces the detected
    memory as given (no headroom is taken). Named resources replace same-named ones,
    tokens add to the offered ones, ``slices`` replaces the TPU slices per type.

    >>> with_overrides(Capacity(cores=(0, 1, 2)), cores=2, mem="1g", tokens=["gcs"]).cores
    (0, 1)
    """
    changes: dict[str, Any] = {}
    if cores is not None:
        n = _positive(cores)
        extra = range(max(cap.cores, default=-1) + 1, max(cap.cores, default=-1) + 1 + n)
        changes["cores"] = (*cap.cores, *extra)[:n]
    if mem is not None:
        changes["memory"] = parse_memory(mem)
    if resources:
        changes["custom"] = {**cap.custom, **resources}
    changes["tokens"] = cap.tokens | frozenset(tokens)
    if slices is not None:
        changes["slices"] = {**cap.slices, **{t: tuple(names) for t, names in slices.items()}}
    return replace(cap, **changes)


def _positive(cores: int) -> int:
    if isinstance(cores, bool) or not isinstance(cores, int) or cores < 1:
        raise ResourceError(f"--cores {cores!r}: give a whole number ≥ 1")
    return cores
