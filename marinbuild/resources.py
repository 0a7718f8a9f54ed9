"""What a step needs: ``ResourceConfig`` (the declaration) and the request language built with ``&``.

Two views of one thing. ``ResourceConfig`` is what a Marinfile usually writes::

    ResourceConfig.with_cpu(cpu=2, ram="8g")
    ResourceConfig.with_tpu("v4-8", slice_count=2)

The request language is what the allocator reasons in, and what a step sees once it
runs, because an allocated request names concrete things (core ids, GPU indices, slice
names)::

    Cores(2) & Memory("8g") & WTime(T="1:00:00")

``to_request`` and ``to_resource_config`` convert between them; ``as_request`` accepts
either (or nothing: one core, no memory).

Memory in the request language: a number is **GiB**, as in Grain (``Memory(8)`` is
8 GiB, never 8 bytes); a string follows :func:`marinbuild.units.parse_memory`. Inside,
everything is bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from marinbuild.errors import ResourceError
from marinbuild.resource_parts import (
    Cores,
    Custom,
    FrozenMap,
    Gpus,
    Memory,
    Part,
    Slices,
    Token,
    WTime,
    bytes_of,
    checked_alternatives,
    checked_count,
    custom_map,
    token_set,
)
from marinbuild.tpu_types import TpuTopology, tpu_topology
from marinbuild.units import parse_memory

__all__ = [
    "ZERO",
    "Cores",
    "CpuConfig",
    "Custom",
    "DeviceConfig",
    "FrozenMap",
    "GpuConfig",
    "Gpus",
    "Memory",
    "Node",
    "Part",
    "Request",
    "ResourceConfig",
    "ResourceLike",
    "Slices",
    "Token",
    "TpuConfig",
    "WTime",
    "as_request",
    "to_request",
    "to_resource_config",
]


@dataclass(frozen=True)
class Request:
    """A combination of parts, at most one of each kind (several distinct tokens or custom names).

    Build it with ``&``; ``ZERO`` is the empty request and the identity of ``&``.
    Grain-style shorthands read through: ``N`` (cores), ``M`` (GiB), ``T``, ``softT``, ``group``.

    >>> req = Cores(2) & Memory(8) & WTime(T=60)
    >>> req.N, req.M, req.T
    (2, 8.0, 60.0)
    """

    cores: Cores | None = None
    memory: Memory | None = None
    wtime: WTime | None = None
    gpus: Gpus | None = None
    slices: Slices | None = None
    tokens: frozenset[str] = frozenset()
    custom: Mapping[str, int] = field(default_factory=FrozenMap)

    def __post_init__(self) -> None:
        object.__setattr__(self, "tokens", token_set(self.tokens))
        object.__setattr__(self, "custom", custom_map(self.custom))
        if self.gpus is not None and self.slices is not None:
            raise ResourceError("cannot combine Gpus and Slices: a step runs on one kind of accelerator")

    @staticmethod
    def of(part: Part | Request) -> Request:
        """The request holding just ``part`` (a request is returned as is)."""
        if isinstance(part, Request):
            return part
        if isinstance(part, Token):
            return Request(tokens=frozenset([part.token]))
        if isinstance(part, Custom):
            return Request(custom=FrozenMap({part.name: part.n}))
        slot = _SLOTS.get(type(part))
        if slot is None:
            raise ResourceError(f"{part!r} is not a resource")
        only: dict[str, Any] = {slot: part}
        return Request(**only)

    def __and__(self, other: Part | Request) -> Request:
        other = Request.of(other)
        merged: dict[str, Any] = {}
        for slot in _SLOTS.values():
            mine, theirs = getattr(self, slot), getattr(other, slot)
            if mine is not None and theirs is not None:
                raise ResourceError(f"cannot combine two {type(mine).__name__}: {mine!r} & {theirs!r}")
            merged[slot] = mine if theirs is None else theirs
        if self.tokens & other.tokens:
            raise ResourceError(f"cannot combine Token {min(self.tokens & other.tokens)!r} with itself")
        both = set(self.custom) & set(other.custom)
        if both:
            raise ResourceError(f"cannot combine two Custom {min(both)!r}")
        return Request(
            **merged,
            tokens=self.tokens | other.tokens,
            custom={**self.custom, **other.custom},
        )

    @property
    def N(self) -> int:
        """Cores asked for (0 without ``Cores``)."""
        return self.cores.N if self.cores else 0

    @property
    def M(self) -> float:
        """Memory in GiB (0 without ``Memory``)."""
        return self.memory.M if self.memory else 0.0

    @property
    def nbytes(self) -> int:
        """Memory in bytes (0 without ``Memory``)."""
        return self.memory.nbytes if self.memory else 0

    @property
    def T(self) -> float | None:
        """Hard wall-time limit in seconds, if any."""
        return self.wtime.T if self.wtime else None

    @property
    def softT(self) -> float | None:
        """Soft wall-time limit in seconds, if any."""
        return self.wtime.softT if self.wtime else None

    @property
    def group(self) -> str | None:
        """Wall-time estimation group, if any."""
        return self.wtime.group if self.wtime else None

    @property
    def core_ids(self) -> tuple[int, ...]:
        """Allocated core ids (empty when none or not allocated)."""
        return (self.cores.ids or ()) if self.cores else ()

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """Allocated GPU indices (empty when none or not allocated)."""
        return (self.gpus.ids or ()) if self.gpus else ()

    @property
    def slice_names(self) -> tuple[str, ...]:
        """Allocated TPU slice names (empty when none or not allocated)."""
        return (self.slices.names or ()) if self.slices else ()

    @property
    def allocated(self) -> bool:
        """True when every part that names things (cores, GPUs, slices) names them."""
        return (
            (self.cores is None or self.cores.ids is not None)
            and (self.gpus is None or self.gpus.ids is not None)
            and (self.slices is None or self.slices.names is not None)
        )

    def __repr__(self) -> str:
        parts: list[str] = [repr(getattr(self, s)) for s in _SLOTS.values() if getattr(self, s) is not None]
        parts += [f"Token({t!r})" for t in sorted(self.tokens)]
        parts += [f"Custom({k!r}, {v})" for k, v in sorted(self.custom.items())]
        return " & ".join(parts) or "ZERO"


_SLOTS: dict[type, str] = {Cores: "cores", Memory: "memory", WTime: "wtime", Gpus: "gpus", Slices: "slices"}

ZERO = Request()
"""No resources at all; ``ZERO & x == x``."""


def Node(N: int, M: float | str) -> Request:
    """``Cores(N) & Memory(M)``.

    >>> Node(2, 8) == Cores(2) & Memory("8g")
    True
    """
    return Cores(N) & Memory(M)


# ---------------------------------------------------------------------------------------
# ResourceConfig: the declaration form.


@dataclass(frozen=True)
class CpuConfig:
    """No accelerator."""


@dataclass(frozen=True)
class GpuConfig:
    """``count`` GPUs of ``gpu_type`` (``"auto"``: whatever the machine has).

    >>> GpuConfig("H100", count=8).count
    8
    """

    gpu_type: str = "auto"
    count: int = 1

    def __post_init__(self) -> None:
        if not (isinstance(self.gpu_type, str) and self.gpu_type):
            raise ResourceError(f"gpu_type must be a non-empty string, got {self.gpu_type!r}")
        checked_count(self.count, "gpu count", minimum=1)


@dataclass(frozen=True)
class TpuConfig:
    """``slice_count`` slices of ``tpu_type``; the type must be in the TPU table.

    >>> TpuConfig("v4-32").topology.vm_count
    4
    """

    tpu_type: str
    slice_count: int = 1

    def __post_init__(self) -> None:
        tpu_topology(self.tpu_type)
        checked_count(self.slice_count, "slice_count", minimum=1)

    @property
    def topology(self) -> TpuTopology:
        """VM count and chips per VM of one slice."""
        return tpu_topology(self.tpu_type)


DeviceConfig = CpuConfig | GpuConfig | TpuConfig


@dataclass(frozen=True)
class ResourceConfig:
    """What one step needs, in the form a Marinfile writes; prefer the ``with_*`` constructors.

    ``ram`` and ``disk`` are bytes (size strings such as ``"4g"`` are converted on
    construction). ``replicas`` is the gang size: the slice count for TPU steps, and
    otherwise a hint for remote backends (a local step runs once). ``disk``, ``image``,
    ``env_vars`` and ``preemptible`` are carried for backends; the local allocator does
    not count them.

    >>> ResourceConfig.with_cpu(cpu=2, ram="8g").ram == 8 * 2**30
    True
    """

    cpu: int = 1
    ram: int | None = None
    disk: int | None = None
    device: DeviceConfig = field(default_factory=CpuConfig)
    replicas: int = 1
    device_alternatives: tuple[str, ...] = ()
    preemptible: bool = True
    env_vars: Mapping[str, str] = field(default_factory=FrozenMap)
    image: str | None = None
    custom: Mapping[str, int] = field(default_factory=FrozenMap)
    tokens: frozenset[str] = frozenset()
    walltime: WTime | None = None

    def __post_init__(self) -> None:
        def fix(name: str, value: object) -> None:
            object.__setattr__(self, name, value)

        checked_count(self.cpu, "cpu")
        for name in ("ram", "disk"):
            value = getattr(self, name)
            if value is not None:
                fix(name, parse_memory(value))
        checked_count(self.replicas, "replicas", minimum=1)
        fix("device_alternatives", tuple(self.device_alternatives))
        self._check_device()
        fix("env_vars", FrozenMap(self.env_vars))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env_vars.items()):
            raise ResourceError(f"env_vars must map strings to strings, got {dict(self.env_vars)!r}")
        fix("custom", custom_map(self.custom))
        fix("tokens", token_set(self.tokens))
        if self.walltime is not None and not isinstance(self.walltime, WTime):
            fix("walltime", WTime(T=self.walltime))

    def _check_device(self) -> None:
        if not isinstance(self.device, (CpuConfig, GpuConfig, TpuConfig)):
            raise ResourceError(f"device must be CpuConfig, GpuConfig or TpuConfig, got {self.device!r}")
        if isinstance(self.device, TpuConfig):
            checked_alternatives(self.device.tpu_type, self.device_alternatives)
            if self.replicas != self.device.slice_count:
                raise ResourceError(
                    f"replicas={self.replicas} differs from slice_count={self.device.slice_count}; "
                    "a TPU step runs one replica per slice"
                )
        elif self.device_alternatives:
            raise ResourceError("device_alternatives only apply to TPU types")

    @staticmethod
    def with_cpu(
        cpu: int = 1, ram: int | str | None = "4g", disk: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A CPU-only step: ``cpu`` cores and ``ram`` (4 GiB unless given).

        >>> ResourceConfig.with_cpu(4).cpu
        4
        """
        return ResourceConfig(cpu=cpu, ram=bytes_of(ram), disk=bytes_of(disk), device=CpuConfig(), **kw)

    @staticmethod
    def with_gpu(
        gpu_type: str = "auto", count: int = 1, cpu: int = 1, ram: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A GPU step: ``count`` GPUs of ``gpu_type`` (``"auto"``: any).

        >>> ResourceConfig.with_gpu("H100", count=8).device
        GpuConfig(gpu_type='H100', count=8)
        """
        return ResourceConfig(cpu=cpu, ram=bytes_of(ram), device=GpuConfig(gpu_type, count), **kw)

    @staticmethod
    def with_tpu(
        tpu_type: str | Sequence[str], slice_count: int = 1, cpu: int = 0, ram: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A TPU step on ``slice_count`` slices; a list gives the canonical type then alternatives.

        Alternatives must share ``vm_count`` and ``chips_per_vm`` with the first type.
        ``cpu`` and ``ram`` are what the step holds on the machine running marinbuild
        (it only drives the slices over SSH), so they default to nothing.

        >>> ResourceConfig.with_tpu(["v4-8", "v5p-8"], slice_count=2).device_alternatives
        ('v5p-8',)
        """
        types = [tpu_type] if isinstance(tpu_type, str) else list(tpu_type)
        if not types:
            raise ResourceError("with_tpu needs at least one TPU type")
        return ResourceConfig(
            cpu=cpu,
            ram=bytes_of(ram),
            device=TpuConfig(types[0], slice_count),
            replicas=slice_count,
            device_alternatives=tuple(types[1:]),
            **kw,
        )

    @property
    def tpu_types(self) -> tuple[str, ...]:
        """Canonical TPU type then alternatives; empty for non-TPU steps."""
        if isinstance(self.device, TpuConfig):
            return (self.device.tpu_type, *self.device_alternatives)
        return ()


# ---------------------------------------------------------------------------------------
# Conversions.

ResourceLike = ResourceConfig | Request | Part | None


def to_request(rc: ResourceConfig) -> Request:
    """The request the allocator schedules for ``rc`` (cpu=0 and ram=None add nothing).

    >>> to_request(ResourceConfig.with_cpu(cpu=2, ram="8g"))
    Cores(2) & Memory('8GiB')
    """
    req = ZERO
    if rc.cpu:
        req &= Cores(rc.cpu)
    if rc.ram:
        req &= Memory.of_bytes(rc.ram)
    if rc.walltime is not None:
        req &= rc.walltime
    if isinstance(rc.device, GpuConfig):
        req &= Gpus(rc.device.count, None if rc.device.gpu_type == "auto" else rc.device.gpu_type)
    elif isinstance(rc.device, TpuConfig):
        req &= Slices(rc.device.tpu_type, rc.device.slice_count, alternatives=rc.device_alternatives)
    return replace(req, tokens=rc.tokens, custom=rc.custom)


def to_resource_config(req: Request | Part) -> ResourceConfig:
    """The ResourceConfig declaring ``req``; allocated ids become counts.

    >>> to_resource_config(Cores(2) & Memory(8)).ram == 8 * 2**30
    True
    """
    req = Request.of(req)
    device: DeviceConfig = CpuConfig()
    replicas, alternatives = 1, ()  # type: tuple[int, tuple[str, ...]]
    if req.gpus is not None:
        device = GpuConfig(req.gpus.gpu_type or "auto", req.gpus.n)
    elif req.slices is not None:
        device = TpuConfig(req.slices.tpu_type, req.slices.n)
        replicas, alternatives = req.slices.n, req.slices.alternatives
    return ResourceConfig(
        cpu=req.N,
        ram=req.memory.nbytes if req.memory else None,
        device=device,
        replicas=replicas,
        device_alternatives=alternatives,
        custom=req.custom,
        tokens=req.tokens,
        walltime=req.wtime,
    )


def as_request(resources: ResourceLike) -> Request:
    """Any way of saying what a step needs, as a Request; None means one core and no memory.

    >>> as_request(None)
    Cores(1)
    """
    if resources is None:
        return Request.of(Cores(1))
    if isinstance(resources, ResourceConfig):
        return to_request(resources)
    if isinstance(resources, (Request, Part)):
        return Request.of(resources)
    raise ResourceError(f"resources must be a ResourceConfig or a request such as Cores(2), got {resources!r}")
