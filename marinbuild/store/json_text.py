"""JSON text a person may have edited by hand: its value, or None, never an exception.

Markers, leases, ledgers and notes are files anyone can open in an editor. What a hand edit
or a write cut short leaves must read as "nothing usable here", as a missing file does:
not JSON at all, or JSON nested deeper than the parser's stack (a ``RecursionError``, which
is not a ``ValueError``).
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["loads_or_none", "number_or_none"]


def loads_or_none(text: str | bytes | None) -> Any:
    """The value ``text`` holds; None for no text, text that is not JSON, or JSON nested too deeply.

    >>> loads_or_none('{"a": 1}'), loads_or_none("{"), loads_or_none("[" * 100_000 + "]" * 100_000)
    ({'a': 1}, None, None)
    """
    if not text:
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def number_or_none(value: Any) -> float | None:
    """A JSON number as a float; None for anything else (``true`` included).

    An integer too large for a float (thousands of digits, from a hand edit) is infinity of
    its sign, where ``float()`` would raise.

    >>> number_or_none(3), number_or_none(True), number_or_none(-(10**400)), number_or_none("1")
    (3.0, None, -inf, None)
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf
