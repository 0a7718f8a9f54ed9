"""The parts of the request language: ``Cores``, ``Memory``, ``WTime``, ``Token``, ``Custom``, ``Gpus``, ``Slices``.

Each is one kind of resource; ``a & b`` combines parts into a :class:`~marinbuild.resources.Request`,
which :mod:`marinbuild.resources` defines with the declaration form (``ResourceConfig``) and
the conversions between them. Memory: a number is GiB (``Memory(8)``), a string follows
:func:`marinbuild.units.parse_memory`; inside, everything is bytes.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from marinbuild.errors import ResourceError
from marinbuild.tpu_types import TpuTopology, tpu_topology
from marinbuild.units import format_bytes, format_duration, parse_duration, parse_memory

if TYPE_CHECKING:
    from marinbuild.resources import Request

__all__ = ["Cores", "Custom", "FrozenMap", "Gpus", "Memory", "Part", "Slices", "Token", "WTime"]

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


def checked_count(value: object, what: str, minimum: int = 0) -> int:
    """``value`` as a whole number ≥ ``minimum``, refusing bools and fractions."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ResourceError(f"{what} must be a whole number, got {value!r}")
    if value < minimum:
        raise ResourceError(f"{what} must be ≥ {minimum}, got {value}")
    return value


def checked_ids(values: Iterable[object], what: str) -> tuple[int, ...]:
    ids = tuple(checked_count(v, what) for v in values)
    if len(set(ids)) != len(ids):
        raise ResourceError(f"{what} repeats an id: {list(ids)}")
    return ids


def bytes_of(size: int | str | None) -> int | None:
    return None if size is None else parse_memory(size)


def custom_map(custom: Mapping[str, int]) -> FrozenMap[str, int]:
    """Checked counts, sorted by name so that reprs and messages read the same every run."""
    return FrozenMap(sorted((k, Custom(k, v).n) for k, v in dict(custom).items()))


def token_set(tokens: Iterable[str] | str) -> frozenset[str]:
    """Checked token names; a lone string is one token, not a set of letters."""
    names = [tokens] if isinstance(tokens, str) else list(tokens)
    return frozenset(Token(t).token for t in names)


# ---------------------------------------------------------------------------------------
# The request language: parts, combined with & into a Request.


class Part:
    """One kind of resource (``Cores``, ``Memory``, ...); ``a & b`` makes a :class:`Request`."""

    def __and__(self, other: Part | Request) -> Request:
        from marinbuild.resources import Request  # the combination is defined beside the declaration form

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
            ids = checked_ids(N, "core id")
            object.__setattr__(self, "N", len(ids))
            object.__setattr__(self, "ids", ids)
        else:
            object.__setattr__(self, "N", checked_count(N, "Cores(N)"))
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
        return cls(f"{checked_count(nbytes, 'memory bytes')}")

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
        checked_count(self.n, f"resources.{self.name}")


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
            ids: tuple[int, ...] | None = checked_ids(n, "GPU index")
            count = checked_count(len(n), "number of GPU indices", minimum=1)
        else:
            ids, count = None, checked_count(n, "Gpus(n)", minimum=1)
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
        checked_alternatives(tpu_type, tuple(alternatives))
        if names is not None:
            names = tuple(names)
            if len(set(names)) != len(names) or not all(isinstance(s, str) and s for s in names):
                raise ResourceError(f"slice names must be distinct non-empty strings, got {list(names)}")
            n = len(names)
        object.__setattr__(self, "tpu_type", tpu_type)
        object.__setattr__(self, "n", checked_count(n, "slice_count", minimum=1))
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


def checked_alternatives(canonical: str, alternatives: tuple[str, ...]) -> TpuTopology:
    """Refuse alternatives whose VM shape differs: a VM is the unit a TPU job takes whole."""
    top = tpu_topology(canonical)
    for alt in alternatives:
        other = tpu_topology(alt)
        if (other.vm_count, other.chips_per_vm) != (top.vm_count, top.chips_per_vm):
            raise ResourceError(
                f"TPU types {canonical!r} and {alt!r} cannot be alternatives: {canonical} is "
                f"{shape_text(top)}, {alt} is {shape_text(other)} (alternatives must share both)"
            )
    if len({canonical, *alternatives}) != 1 + len(alternatives):
        raise ResourceError(f"TPU type list repeats a type: {[canonical, *alternatives]}")
    return top


def shape_text(top: TpuTopology) -> str:
    return f"{top.vm_count} VM{'s' if top.vm_count != 1 else ''} x {top.chips_per_vm} chips"
