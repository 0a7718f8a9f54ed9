"""Frozen dataclass instances built on hot paths, by filling the instance dict at once.

A frozen dataclass's ``__init__`` sets its fields one ``object.__setattr__`` call at a time;
filling ``__dict__`` in one update costs a third of that, which counts where it happens once
per step on every command (``step()``, the graph's nodes) and once per marker of a no-op run.
The caller gives every field (there are no defaults here, and no ``__post_init__`` runs);
``tests/unit/store/test_frozen_fill.py`` checks that each caller builds what the class's own
constructor builds, field for field.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["frozen_filled"]

T = TypeVar("T")


def frozen_filled(cls: type[T], **fields: Any) -> T:
    """An instance of the frozen dataclass ``cls`` with exactly ``fields``, without its ``__init__``."""
    instance = object.__new__(cls)
    instance.__dict__.update(fields)
    return instance
