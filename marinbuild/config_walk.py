"""The one walk over step configs: what a config may hold, how each part is entered and rebuilt.

Scanning (references and versioned values), identity encoding, resolution, mirrored
inputs, the info JSON and a shell step's template keys all look inside configs through
this module, so they agree on what a config is:

* **containers**, entered: dicts (keys kept), lists, tuples, ``NamedTuple`` s (rebuilt
  with their own type), sets and frozensets, and dataclass instances, whose *fields* only
  are entered (a ``ClassVar`` is not a field; neither is an ``InitVar``, whose value
  lives on in the fields ``__post_init__`` set from it);
* **placeholders** (``versioned(...)``, step references, ``this_output_path()``,
  ``mirrored(...)``: any class with a true ``__marinbuild_placeholder__``), never entered
  here: each user of the walk decides what one means;
* everything else is a **leaf**: ``None``, bools, numbers, strings, enum members, paths,
  and any other object.

Rebuilding never calls a dataclass's ``__init__`` again: the copy keeps every field that
did not change, and ``__post_init__`` is not rerun with an ``InitVar``'s class default in
place of the value that was passed.

>>> from typing import NamedTuple
>>> class Pair(NamedTuple):
...     left: object
...     right: object
>>> transform({"p": Pair(1, [2, 3])}, lambda v: v * 10 if type(v) is int else KEEP)
{'p': Pair(left=10, right=[20, 30])}
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import pathlib
from collections.abc import Callable, Iterator
from typing import Any

__all__ = [
    "KEEP",
    "LEAF_TYPES",
    "MAPPING",
    "MAX_INT_BITS",
    "RECORD",
    "SEQUENCE",
    "SET",
    "children",
    "describe_leaf",
    "field_names",
    "is_dataclass_instance",
    "is_namedtuple",
    "is_placeholder",
    "join_path",
    "named_values",
    "rebuild",
    "transform",
    "walk",
]

LEAF_TYPES = frozenset((str, int, float, bool, type(None)))
"""Exact types that are always leaves: tested first, since nearly every value is one."""

MAX_INT_BITS = 13_288
"""Bits of the largest integer a config may hold as a number: 4,000 decimal digits, below
Python's limit on turning an integer into text (4,300), past which no JSON can be written."""

MAPPING = "mapping"
SEQUENCE = "sequence"
SET = "set"
RECORD = "record"


class _Keep:
    def __repr__(self) -> str:
        return "KEEP"


KEEP: Any = _Keep()
"""Returned by a :func:`transform` callback: keep walking this value (or keep the leaf)."""


def is_placeholder(value: Any) -> bool:
    """True for the values a config uses to say something to marinbuild (never entered)."""
    return getattr(type(value), "__marinbuild_placeholder__", False) is True


def is_dataclass_instance(value: Any) -> bool:
    """True for a dataclass instance (not the class itself)."""
    return hasattr(type(value), "__dataclass_fields__") and not isinstance(value, type)


@functools.cache
def _fields_of_type(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def field_names(value: Any) -> tuple[str, ...]:
    """A dataclass instance's fields, in order: no ``ClassVar``, no ``InitVar``.

    >>> import dataclasses
    >>> Point = dataclasses.make_dataclass("Point", ["x", "y"])
    >>> field_names(Point(1, 2))
    ('x', 'y')
    """
    cls: Any = type(value)
    return _fields_of_type(cls)


def is_namedtuple(value: Any) -> bool:
    """True for an instance of a ``typing.NamedTuple`` or ``collections.namedtuple`` class."""
    return isinstance(value, tuple) and hasattr(type(value), "_fields") and hasattr(type(value), "_make")


def children(value: Any) -> tuple[str, list[tuple[Any, Any]]] | None:
    """A container's shape and its ``(key, child)`` pairs in order; None for a leaf or a placeholder.

    Keys are dict keys, list and tuple (and set iteration) indices, or field names.

    >>> children([7, "x"])
    ('sequence', [(0, 7), (1, 'x')])
    """
    t = type(value)
    if t is dict:
        return MAPPING, list(value.items())
    if t is list or t is tuple:
        return SEQUENCE, list(enumerate(value))
    if t in LEAF_TYPES or is_placeholder(value):
        return None
    if isinstance(value, dict):
        return MAPPING, list(value.items())
    if isinstance(value, (list, tuple)):
        return SEQUENCE, list(enumerate(value))
    if isinstance(value, (set, frozenset)):
        return SET, list(enumerate(value))
    if is_dataclass_instance(value):
        return RECORD, [(f, getattr(value, f)) for f in field_names(value)]
    return None


def rebuild(value: Any, shape: str, items: list[tuple[Any, Any]], new: list[Any]) -> Any:
    """``value`` with the children :func:`children` gave as ``items`` replaced by ``new``, in its own type.

    Returns ``value`` itself when no child changed.
    """
    if all(a is b for (_, a), b in zip(items, new, strict=True)):
        return value
    t = type(value)
    if shape == MAPPING:
        if t is dict:
            return dict(zip((k for k, _ in items), new, strict=True))
        out = copy.copy(value)  # an OrderedDict or defaultdict stays one (with its factory)
        for (k, _), v in zip(items, new, strict=True):
            out[k] = v
        return out
    if shape == SEQUENCE:
        if t is list:
            return new
        if t is tuple:
            return tuple(new)
        if is_namedtuple(value):
            return t._make(new)
        if isinstance(value, list):
            out = copy.copy(value)
            out[:] = new
            return out
        return t(new)
    if shape == SET:
        return t(new)
    if shape == RECORD:
        # A copy with the changed fields set, not a new __init__: __post_init__ already ran
        # with the values passed (InitVars included), and frozen or not, the fields are set as is.
        out = copy.copy(value)
        for (name, old), v in zip(items, new, strict=True):
            if v is not old:
                object.__setattr__(out, name, v)
        return out
    raise ValueError(f"unknown shape {shape!r}")


def transform(value: Any, visit: Callable[[Any], Any]) -> Any:
    """A copy of ``value`` in which ``visit`` replaced what it chose, containers rebuilt in their own type.

    ``visit`` is called on every value, outermost first; it returns the replacement, or
    :data:`KEEP` to walk into a container (or keep a leaf or placeholder unchanged).
    """
    done = visit(value)
    if done is not KEEP:
        return done
    found = children(value)
    if found is None:
        return value
    shape, items = found
    return rebuild(value, shape, items, [transform(child, visit) for _, child in items])


def walk(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every value inside ``value`` with its dotted path, outermost first; placeholders are not entered.

    >>> [p for p, _ in walk({"a": [1, {"b": 2}]})]
    ['', 'a', 'a.0', 'a.1', 'a.1.b']
    """
    stack = [(path, value)]
    while stack:
        p, v = stack.pop()
        yield p, v
        found = children(v)
        if found is not None:
            stack.extend((join_path(p, str(k)), c) for k, c in reversed(found[1]))


def named_values(config: Any) -> dict[str, Any] | None:
    """The top-level values a shell template may name: a dict's, a dataclass's or a NamedTuple's.

    ``None`` has none; any other config gives None (it has no names).

    >>> named_values({"n": 1})
    {'n': 1}
    """
    if config is None:
        return {}
    if isinstance(config, dict):
        return {str(k): v for k, v in config.items()}
    if is_namedtuple(config):
        return dict(zip(type(config)._fields, config, strict=True))
    if is_dataclass_instance(config) and not is_placeholder(config):
        return {f: getattr(config, f) for f in field_names(config)}
    return None


def join_path(path: str, key: str) -> str:
    """``a.b`` + ``c`` → ``a.b.c``: the dotted paths that name config fields."""
    return f"{path}.{key}" if path else key


def describe_leaf(value: Any) -> Any:
    """A leaf as plain data when it has an exact form: an enum member's value, a path's text."""
    if isinstance(value, enum.Enum):
        return describe_leaf(value.value)
    if isinstance(value, pathlib.PurePath):
        return str(value)
    return value
