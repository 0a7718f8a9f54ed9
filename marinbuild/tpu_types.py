"""The TPU topology table: how many VMs (hosts) and chips a TPU type has.

Two naming rules exist. ``v4-N`` and ``v5p-N`` count TensorCores: a chip has two, a VM
holds four chips, so ``chips = N/2`` and ``vm_count = N/8``. ``v5litepod-N`` (v5e) and
``v6e-N`` count chips: up to 8 chips fit on one VM, above that a VM holds four.

>>> tpu_topology("v4-32").vm_count
4
>>> tpu_topology("v6e-8").chips_per_vm
8
"""

from __future__ import annotations

from dataclasses import dataclass

from marinbuild.errors import ResourceError

__all__ = ["TpuTopology", "known_tpu_types", "tpu_topology"]


@dataclass(frozen=True)
class TpuTopology:
    """One TPU slice shape: ``vm_count`` hosts with ``chips_per_vm`` chips each."""

    name: str
    generation: str
    chips: int
    vm_count: int
    chips_per_vm: int


_CORE_COUNTED = {
    "v4": (8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    "v5p": (8, 16, 32, 64, 128, 256, 384, 512, 1024, 2048, 4096, 6144, 8192, 12288),
}
_CHIP_COUNTED = {
    "v5litepod": (1, 4, 8, 16, 32, 64, 128, 256),
    "v6e": (1, 4, 8, 16, 32, 64, 128, 256),
}


def _build_table() -> dict[str, TpuTopology]:
    table: dict[str, TpuTopology] = {}
    for gen, sizes in _CORE_COUNTED.items():
        for n in sizes:
            chips = n // 2
            table[f"{gen}-{n}"] = TpuTopology(f"{gen}-{n}", gen, chips, chips // 4, 4)
    for gen, sizes in _CHIP_COUNTED.items():
        for n in sizes:
            if n <= 8:
                table[f"{gen}-{n}"] = TpuTopology(f"{gen}-{n}", gen, n, 1, n)
            else:
                table[f"{gen}-{n}"] = TpuTopology(f"{gen}-{n}", gen, n, n // 4, 4)
    return table


_TABLE = _build_table()


def known_tpu_types() -> list[str]:
    """Every TPU type name in the table, grouped by generation, smallest first."""
    return list(_TABLE)


def tpu_topology(name: str) -> TpuTopology:
    """The topology of TPU type ``name``; an unknown name is a :class:`ResourceError`.

    >>> tpu_topology("v5litepod-16").vm_count
    4
    """
    try:
        return _TABLE[name]
    except KeyError:
        gens = ", ".join(
            f"{g}-{{{','.join(str(n) for n in sizes)}}}"
            for g, sizes in {**_CORE_COUNTED, **_CHIP_COUNTED}.items()
        )
        raise ResourceError(f"unknown TPU type {name!r}; known types: {gens}") from None
