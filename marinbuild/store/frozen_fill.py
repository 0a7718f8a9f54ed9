"""Frozen dataclass instances built on hot paths, by handing the instance its dict whole.

A frozen dataclass's ``__init__`` sets its fields one ``object.__setattr__`` call at a time;
giving the instance a dict built for it costs a quarter of that, which counts where it happens
once per step on every command (``step()``, the graph's nodes) and once per marker of a no-op
run. The dict is a literal at the call site: passed as keyword arguments, the same fields
cost twice as much, in building the call. The caller gives every field (there are no
defaults here, and no ``__post_init__`` runs); ``tests/unit/store/test_frozen_fill.py``
checks that each caller builds what the class's own constructor builds, field for field.

The instance holds a dict, where one its ``__init__`` builds keeps its values inline (Python
3.11): two and a half times the memory for a class of two fields. Classes made once per step
that had no dict before (a config's scan, a run's result) keep their constructor.
"""

from __future__ import annotations

from typing import Any, TypeVar

__all__ = ["frozen_filled"]

T = TypeVar("T")

_new = object.__new__
_set = object.__setattr__  # a frozen dataclass refuses its own


def frozen_filled(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of the frozen dataclass ``cls`` whose ``__dict__`` is ``fields``, without its ``__init__``.

    ``fields`` becomes the instance's own: a dict made for it, holding every field.

    >>> import dataclasses
    >>> Pair = dataclasses.make_dataclass("Pair", ["a", "b"], frozen=True)
    >>> frozen_filled(Pair, {"a": 1, "b": "y"})
    Pair(a=1, b='y')
    """
    instance = _new(cls)
    _set(instance, "__dict__", fields)
    return instance
