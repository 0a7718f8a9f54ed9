"""Retries by cause in a few characters, as a step's final status marker and its summary entry carry them.

``status`` says what each step's last run used of each retry budget. Reading that from each
step's ``attempts.json`` costs a request per step on ``gs://`` (2,000 for 2,000 up-to-date
steps, where the summary answers in two listings). The runner therefore writes the counts,
once, into what ``status`` reads anyway: the SUCCESS or FAILED marker, and the name of the
SUCCESS entry of the status summary (:mod:`marinbuild.store.index`). One part per cause,
joined by ``_``: the cause's letter, the retries used, ``.``, the budget::

    f1.3_p4.100_h0.2_i0.2_v2.3600.0

(``f`` failure, ``p`` preemption, ``h`` hang, ``i`` infra; ``v`` provisioning, whose budget
is ``provision_timeout`` in seconds). Letters, digits, ``.``, ``_``, ``e``, ``+`` and ``-``
only: the code fits in an object name. A marker written before markers held the code has
none, and ``status`` says its retries are unknown rather than reading a ledger per step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["decode_retries", "encode_retries", "valid_retries_code"]

_LETTERS = {"failure": "f", "preemption": "p", "hang": "h", "infra": "i", "provisioning": "v"}
_CAUSES = {letter: cause for cause, letter in _LETTERS.items()}
_TIMED = "provisioning"
"""The cause bounded by time: its budget is ``timeout_s``, its ``max`` null."""
_PART = r"[a-z][0-9]{1,9}\.[0-9][0-9.e+-]{0,23}"
_CODE = re.compile(rf"{_PART}(?:_{_PART}){{0,15}}")


def valid_retries_code(value: Any) -> str | None:
    """``value`` when it is a code as runners write it; None for anything else (a hand edit).

    >>> valid_retries_code("f1.3_h0.2"), valid_retries_code("f1@3"), valid_retries_code(3)
    ('f1.3_h0.2', None, None)
    """
    if type(value) is str and _CODE.fullmatch(value) is not None:
        return value
    return None


def encode_retries(retries: Mapping[str, Any] | None) -> str | None:
    """The code of a retry loop's summary (``{"failure": {"used": 1, "max": 3}, ...}``); None when unusable.

    >>> encode_retries({"failure": {"used": 1, "max": 3}, "hang": {"used": 0, "max": 2},
    ...                 "provisioning": {"used": 2, "max": None, "timeout_s": 3600.0}})
    'f1.3_h0.2_v2.3600.0'
    """
    if not retries:
        return None
    parts = []
    for cause, counts in retries.items():
        letter = _LETTERS.get(cause)
        if letter is None or not isinstance(counts, Mapping):
            continue  # a cause this version cannot name is left out, not guessed at
        used = counts.get("used")
        if not _is_count(used):
            return None
        if cause == _TIMED:
            limit = counts.get("timeout_s")
            if isinstance(limit, bool) or not isinstance(limit, (int, float)) or not 0 <= limit < math.inf:
                return None
            parts.append(f"{letter}{used}.{float(limit)!r}")
        else:
            budget = counts.get("max")
            if not _is_count(budget):
                return None
            parts.append(f"{letter}{used}.{budget}")
    return valid_retries_code("_".join(parts))


def decode_retries(code: str | None) -> dict[str, dict[str, Any]] | None:
    """The summary a code stands for (``status --json``'s ``retries``); None for no code or a bad one.

    >>> decode_retries("f1.3_v2.3600.0")
    {'failure': {'used': 1, 'max': 3}, 'provisioning': {'used': 2, 'max': None, 'timeout_s': 3600.0}}
    >>> decode_retries(None), decode_retries("f1.x")
    (None, None)
    """
    if valid_retries_code(code) is None:
        return None
    assert code is not None
    out: dict[str, dict[str, Any]] = {}
    for part in code.split("_"):
        cause = _CAUSES.get(part[0])
        if cause is None:
            continue  # written by a later version that knows more causes
        used, _, budget = part[1:].partition(".")
        try:
            if cause == _TIMED:
                limit = float(budget)
                if not math.isfinite(limit):
                    return None
                out[cause] = {"used": int(used), "max": None, "timeout_s": limit}
            else:
                out[cause] = {"used": int(used), "max": int(budget)}
        except ValueError:
            return None
    return out or None


def _is_count(value: Any) -> bool:
    return type(value) is int and 0 <= value < 10**9
