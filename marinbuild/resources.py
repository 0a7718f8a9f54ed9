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

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from marinbuild.errors import ResourceError
from marinbuild.tpu_types import TpuTopology, tpu_topology
from marinbuild.units import format_bytes, format_duration, parse_duration, parse_memory

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

K = TypeVar("K")
V = TypeVar("V")


class FrozenMap(Mapping[K, V]):
    """An immutable, hashable mapping, so that frozen dataclasses holding one stay hashable.

    >>> FrozenMap({"b": 1, "a": 2}) == {"a": 2, "b": 1}
    True
    """

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[K, V] | Iterable[tuple[K, V]] = ()) -> None:
        pairs = items.items() if isinstance(items, Mapping) else items
        self._items: dict[K, V] = dict(pairs)

    def __getitem__(self, key: K) -> V:
        return self._items[key]

    def __iter__(self) -> Iterator[K]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenMap({self._items!r})"


def _count(value: object, what: str, minimum: int = 0) -> int:
    """``value`` as a whole number ≥ ``minimum``, refusing bools and fractions."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError(f"{what} must be a whole number, got {value!r}")
    if value < minimum:
        raise ResourceError(f"{what} must be ≥ {minimum}, got {value}")
    return value


def _ids(values: Iterable[object], what: str) -> tuple[int, ...]:
    ids = tuple(_count(v, what) for v in values)
    if len(set(ids)) != len(ids):
        raise ResourceError(f"{what} repeats an id: {list(ids)}")
    return ids


def _bytes(size: int | str | None) -> int | None:
    return None if size is None else parse_memory(size)


def _custom_map(custom: Mapping[str, int]) -> FrozenMap[str, int]:
    """Checked counts, sorted by name so that reprs and messages read the same every run."""
    return FrozenMap(sorted((k, Custom(k, v).n) for k, v in dict(custom).items()))


def _token_set(tokens: Iterable[str] | str) -> frozenset[str]:
    """Checked token names; a lone string is one token, not a set of letters."""
    names = [tokens] if isinstance(tokens, str) else list(tokens)
    return frozenset(Token(t).token for t in names)


# ---------------------------------------------------------------------------------------
# The request language: parts, combined with & into a Request.


class Part:
    """One kind of resource (``Cores``, ``Memory``, ...); ``a & b`` makes a :class:`Request`."""

    def __and__(self, other: Part | Request) -> Request:
        return Request.of(self) & other


@dataclass(frozen=True, init=False)
class Cores(Part):
    """CPU cores: ``Cores(3)`` asks for three; ``Cores([0, 2, 5])`` is (or asks for) those ids.

    >>> Cores(2).N, Cores([4, 6]).ids
    (2, (4, 6))
    """

    N: int
    ids: tuple[int, ...] | None

    def __init__(self, N: int | Sequence[int]) -> None:
        if isinstance(N, Sequence):
            ids = _ids(N, "core id")
            object.__setattr__(self, "N", len(ids))
            object.__setattr__(self, "ids", ids)
        else:
            object.__setattr__(self, "N", _count(N, "Cores(N)"))
            object.__setattr__(self, "ids", None)

    def __repr__(self) -> str:
        return f"Cores({list(self.ids) if self.ids is not None else self.N})"


@dataclass(frozen=True, init=False)
class Memory(Part):
    """Memory. ``Memory(8)`` and ``Memory(0.5)`` are GiB (Grain's convention); strings use parse_memory.

    ``.M`` is the size in GiB, ``.nbytes`` in bytes.

    >>> Memory(8) == Memory("8g") == Memory.of_bytes(8 * 2**30)
    True
    """

    nbytes: int

    def __init__(self, M: float | str) -> None:
        if isinstance(M, str):
            nbytes = parse_memory(M)
        elif isinstance(M, (int, float)) and not isinstance(M, bool):
            if not (math.isfinite(M) and M >= 0):
                raise ResourceError(f"Memory({M!r}) must be ≥ 0")
            nbytes = round(M * 2**30)
        else:
            raise ResourceError(f"Memory({M!r}): give GiB as a number or a size string such as '4g'")
        object.__setattr__(self, "nbytes", nbytes)

    @classmethod
    def of_bytes(cls, nbytes: int) -> Memory:
        """Memory of exactly ``nbytes`` bytes."""
        return cls(f"{_count(nbytes, 'memory bytes')}")

    @property
    def M(self) -> float:
        """The size in GiB."""
        return self.nbytes / 2**30

    def __repr__(self) -> str:
        # Show the rounded human form only when it reads back as the same size.
        text = format_bytes(self.nbytes).replace(" ", "")
        return f"Memory({text if parse_memory(text) == self.nbytes else f'{self.nbytes}B'!r})"


@dataclass(frozen=True, init=False)
class WTime(Part):
    """A wall-time limit: hard ``T`` and soft ``softT`` in seconds, or a ``group`` to estimate them.

    ``softT`` defaults to ``T``. Durations may be seconds or ``[d-]hh:mm:ss`` strings.
    The allocator does not count wall time; the runner enforces ``T``.

    >>> WTime(T="1:00:00") == WTime(T=3600, softT=3600)
    True
    """

    T: float | None
    softT: float | None
    group: str | None

    def __init__(
        self,
        T: float | str | None = None,
        softT: float | str | None = None,
        group: str | None = None,
    ) -> None:
        hard = None if T is None else parse_duration(T)
        soft = hard if softT is None else parse_duration(softT)
        if hard is not None and soft is not None and soft > hard:
            raise ResourceError(f"WTime softT={soft:g}s is longer than T={hard:g}s")
        if group is not None and not (isinstance(group, str) and group):
            raise ResourceError(f"WTime group must be a non-empty string, got {group!r}")
        object.__setattr__(self, "T", hard)
        object.__setattr__(self, "softT", soft)
        object.__setattr__(self, "group", group)

    def __repr__(self) -> str:
        args = []
        if self.T is not None:
            args.append(f"T={format_duration(self.T)!r}")
        if self.softT is not None and self.softT != self.T:
            args.append(f"softT={format_duration(self.softT)!r}")
        if self.group is not None:
            args.append(f"group={self.group!r}")
        return f"WTime({', '.join(args)})"


@dataclass(frozen=True)
class Token(Part):
    """A tag: a step carrying ``Token("x")`` runs only where ``x`` is offered (``--token x``).

    Tokens are matched, never used up.

    >>> (Token("gcs") & Token("big-disk")).tokens == {"gcs", "big-disk"}
    True
    """

    token: str

    def __post_init__(self) -> None:
        if not (isinstance(self.token, str) and self.token):
            raise ResourceError(f"Token name must be a non-empty string, got {self.token!r}")


@dataclass(frozen=True)
class Custom(Part):
    """A named, counted resource, as in Snakemake's ``resources:`` (offered with ``--resources NAME=N``).

    >>> (Custom("gpu_mem_gb", 40) & Custom("uplink", 1)).custom["uplink"]
    1
    """

    name: str
    n: int

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name.isidentifier()):
            raise ResourceError(f"custom resource name must be an identifier, got {self.name!r}")
        _count(self.n, f"resources.{self.name}")


@dataclass(frozen=True, init=False)
class Gpus(Part):
    """GPUs: ``Gpus(2)`` or ``Gpus(2, "H100")``; allocated, ``.ids`` holds the device indices.

    ``gpu_type=None`` takes any type. A type matches a device whose name contains it,
    ignoring case (``"h100"`` matches ``"NVIDIA H100 80GB HBM3"``).

    >>> Gpus([1, 3]).n
    2
    """

    n: int
    gpu_type: str | None
    ids: tuple[int, ...] | None

    def __init__(self, n: int | Sequence[int], gpu_type: str | None = None) -> None:
        if isinstance(n, Sequence):
            ids: tuple[int, ...] | None = _ids(n, "GPU index")
            count = _count(len(n), "number of GPU indices", minimum=1)
        else:
            ids, count = None, _count(n, "Gpus(n)", minimum=1)
        if gpu_type is not None and not (isinstance(gpu_type, str) and gpu_type):
            raise ResourceError(f"gpu_type must be a non-empty string or None, got {gpu_type!r}")
        object.__setattr__(self, "n", count)
        object.__setattr__(self, "gpu_type", gpu_type)
        object.__setattr__(self, "ids", ids)

    def __repr__(self) -> str:
        first = list(self.ids) if self.ids is not None else self.n
        return f"Gpus({first}{'' if self.gpu_type is None else f', {self.gpu_type!r}'})"


@dataclass(frozen=True, init=False)
class Slices(Part):
    """TPU slices: ``n`` slices of ``tpu_type`` (or, all of one type, of an alternative).

    Allocated, ``.names`` holds the slice names and ``tpu_type`` the type chosen.

    >>> Slices("v4-8", 2, alternatives=["v5p-8"]).tpu_types
    ('v4-8', 'v5p-8')
    """

    tpu_type: str
    n: int
    alternatives: tuple[str, ...]
    names: tuple[str, ...] | None
    among: frozenset[str] | None
    """The slices it may be given (e.g. only those not preemptible); None: any."""

    def __init__(
        self,
        tpu_type: str,
        n: int = 1,
        *,
        alternatives: Sequence[str] = (),
        names: Sequence[str] | None = None,
        among: Iterable[str] | None = None,
    ) -> None:
        _check_alternatives(tpu_type, tuple(alternatives))
        if names is not None:
            names = tuple(names)
            if len(set(names)) != len(names) or not all(isinstance(s, str) and s for s in names):
                raise ResourceError(f"slice names must be distinct non-empty strings, got {list(names)}")
            n = len(names)
        object.__setattr__(self, "tpu_type", tpu_type)
        object.__setattr__(self, "n", _count(n, "slice_count", minimum=1))
        object.__setattr__(self, "alternatives", tuple(alternatives))
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "among", frozenset(among) if among is not None else None)

    @property
    def tpu_types(self) -> tuple[str, ...]:
        """The canonical type then its alternatives."""
        return (self.tpu_type, *self.alternatives)

    def __repr__(self) -> str:
        extra = f", alternatives={list(self.alternatives)}" if self.alternatives else ""
        if self.names is not None:
            extra += f", names={list(self.names)}"
        if self.among is not None:
            extra += f", among={sorted(self.among)}"
        return f"Slices({self.tpu_type!r}, {self.n}{extra})"


def _check_alternatives(canonical: str, alternatives: tuple[str, ...]) -> TpuTopology:
    """Refuse alternatives whose VM shape differs: a VM is the unit a TPU job takes whole."""
    top = tpu_topology(canonical)
    for alt in alternatives:
        other = tpu_topology(alt)
        if (other.vm_count, other.chips_per_vm) != (top.vm_count, top.chips_per_vm):
            raise ResourceError(
                f"TPU types {canonical!r} and {alt!r} cannot be alternatives: {canonical} is "
                f"{_shape(top)}, {alt} is {_shape(other)} (alternatives must share both)"
            )
    if len({canonical, *alternatives}) != 1 + len(alternatives):
        raise ResourceError(f"TPU type list repeats a type: {[canonical, *alternatives]}")
    return top


def _shape(top: TpuTopology) -> str:
    return f"{top.vm_count} VM{'s' if top.vm_count != 1 else ''} x {top.chips_per_vm} chips"


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
        object.__setattr__(self, "tokens", _token_set(self.tokens))
        object.__setattr__(self, "custom", _custom_map(self.custom))
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
        _count(self.count, "gpu count", minimum=1)


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
        _count(self.slice_count, "slice_count", minimum=1)

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

        _count(self.cpu, "cpu")
        for name in ("ram", "disk"):
            value = getattr(self, name)
            if value is not None:
                fix(name, parse_memory(value))
        _count(self.replicas, "replicas", minimum=1)
        fix("device_alternatives", tuple(self.device_alternatives))
        self._check_device()
        fix("env_vars", FrozenMap(self.env_vars))
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env_vars.items()):
            raise ResourceError(f"env_vars must map strings to strings, got {dict(self.env_vars)!r}")
        fix("custom", _custom_map(self.custom))
        fix("tokens", _token_set(self.tokens))
        if self.walltime is not None and not isinstance(self.walltime, WTime):
            fix("walltime", WTime(T=self.walltime))

    def _check_device(self) -> None:
        if not isinstance(self.device, (CpuConfig, GpuConfig, TpuConfig)):
            raise ResourceError(f"device must be CpuConfig, GpuConfig or TpuConfig, got {self.device!r}")
        if isinstance(self.device, TpuConfig):
            _check_alternatives(self.device.tpu_type, self.device_alternatives)
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
        return ResourceConfig(cpu=cpu, ram=_bytes(ram), disk=_bytes(disk), device=CpuConfig(), **kw)

    @staticmethod
    def with_gpu(
        gpu_type: str = "auto", count: int = 1, cpu: int = 1, ram: int | str | None = None, **kw: Any
    ) -> ResourceConfig:
        """A GPU step: ``count`` GPUs of ``gpu_type`` (``"auto"``: any).

        >>> ResourceConfig.with_gpu("H100", count=8).device
        GpuConfig(gpu_type='H100', count=8)
        """
        return ResourceConfig(cpu=cpu, ram=_bytes(ram), device=GpuConfig(gpu_type, count), **kw)

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
            ram=_bytes(ram),
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
