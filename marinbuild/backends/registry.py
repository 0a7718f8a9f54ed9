"""The kinds of backend a run may use, by name: the built-in ones and any registered later.

``--backend`` takes the name of a kind whose :attr:`~marinbuild.backends.kinds.BackendKind.choice`
is true; the others (TPU slices over SSH) join every run whose cluster file configures them.
A kind from outside marinbuild is added with :func:`register` before the run starts::

    from marinbuild.backends.registry import register
    register(MyKind())        # then marinbuild.run(..., backend="mine")

The built-in kinds' modules are light (what they run is imported when a run uses them), so
listing the kinds for ``--help`` costs next to nothing.
"""

from __future__ import annotations

import importlib

from marinbuild.backends.kinds import BackendKind
from marinbuild.errors import UserError

__all__ = ["chosen_kind", "companion_kinds", "kind_names", "kind_options", "kinds", "register"]

_BUILT_IN = (
    "marinbuild.backends.local.kind",
    "marinbuild.backends.ray.kind",
    "marinbuild.backends.slurm.kind",
    "marinbuild.backends.tpu.kind",
)
"""Modules each defining ``KIND``, in the order ``--backend`` lists them."""

_registered: dict[str, BackendKind] = {}
_built_in_loaded: list[bool] = []


def _load() -> dict[str, BackendKind]:
    if not _built_in_loaded:
        built_in = {kind.name: kind for kind in (importlib.import_module(m).KIND for m in _BUILT_IN)}
        merged = {**built_in, **_registered}  # built-in ones first; one registered earlier wins its name
        _registered.clear()
        _registered.update(merged)
        _built_in_loaded.append(True)
    return _registered


def register(kind: BackendKind) -> None:
    """Add ``kind`` (or replace the one of its name) for the runs that follow."""
    if not kind.name:
        raise ValueError("a backend kind needs a name")
    _load()[kind.name] = kind


def kinds() -> tuple[BackendKind, ...]:
    """Every kind known now, built-in ones first."""
    return tuple(_load().values())


def kind_names() -> tuple[str, ...]:
    """The names ``--backend`` takes."""
    return tuple(k.name for k in kinds() if k.choice)


def kind_options() -> dict[str, object]:
    """The run options the kinds declare, by name, with their defaults."""
    out: dict[str, object] = {}
    for kind in kinds():
        out.update(kind.options)
    return out


def chosen_kind(name: str) -> BackendKind:
    """The kind ``--backend NAME`` chooses; a one-line UserError naming the choices otherwise."""
    found = _load().get(name.lower())
    if found is None or not found.choice:
        choices = " or ".join(repr(n) for n in kind_names())
        raise UserError(f"--backend must be {choices}, not {name!r}")
    return found


def companion_kinds() -> tuple[BackendKind, ...]:
    """The kinds that join a run beside the chosen one when its cluster file configures them."""
    return tuple(k for k in kinds() if not k.choice)
