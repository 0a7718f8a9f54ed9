"""Which run won: the direction each metric is better in, and the best row per metric.

Declared in the Marinfile (``BEST = {"eval_loss": "min", "accuracy": "max"}``) or on the command
line (``report --best eval_loss=min``); else guessed from the metric's name: a loss, an error or a
perplexity is better low, an accuracy, F1, AUC, score or reward high. A metric of neither kind names
no winner.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from marinbuild.errors import UserError

__all__ = ["DIRECTIONS", "best_rows", "direction_of", "parse_best", "read_best"]

DIRECTIONS = ("min", "max")
_LOW = ("loss", "error", "err", "perplexity", "ppl", "mse", "mae", "rmse", "wer", "cer")
_HIGH = ("accuracy", "acc", "f1", "auc", "score", "reward", "precision", "recall", "bleu")


def direction_of(metric: str, declared: Mapping[str, str]) -> str | None:
    """``min``, ``max`` or None (no winner) for ``metric``: as declared (its key, or its last dotted part),
    else by the words of its name.

    >>> [direction_of(m, {}) for m in ("eval_loss", "val/perplexity", "eval.acc", "mean_reward", "tokens_per_s")]
    ['min', 'min', 'max', 'max', None]
    >>> direction_of("eval.loss", {"loss": "max"})
    'max'
    """
    for key in (metric, metric.rsplit(".", 1)[-1]):
        if key in declared:
            return declared[key]
    words = [w for w in re.split(r"[^a-z0-9]+", metric.lower()) if w]
    if any(w in _LOW or w.endswith("loss") for w in words):
        return "min"
    if any(w in _HIGH or w.startswith("accuracy") for w in words):
        return "max"
    return None


def parse_best(items: Sequence[str]) -> dict[str, str]:
    """``--best eval_loss=min`` values (repeatable) as a mapping; bad input is one clear line."""
    out: dict[str, str] = {}
    for item in items:
        metric, sep, direction = item.partition("=")
        if not sep or not metric.strip() or direction.strip() not in DIRECTIONS:
            raise UserError(f"--best {item!r}: expected METRIC=min or METRIC=max, like eval_loss=min")
        out[metric.strip()] = direction.strip()
    return out


def read_best(value: Any) -> dict[str, str]:
    """The Marinfile's ``BEST`` (None: none declared), checked: a dict of metric names to ``min``/``max``."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k and v in DIRECTIONS for k, v in value.items()
    ):
        raise UserError(f'BEST in the Marinfile must map metric names to "min" or "max", like '
                        f'{{"eval_loss": "min"}}, not {value!r}')
    return dict(value)


def best_rows(values: Sequence[Any], direction: str | None) -> set[int]:
    """The indexes of the best finite numbers of ``values`` (ties all win); none without a direction.

    >>> sorted(best_rows([0.3, None, 0.1, float("nan"), 0.1], "min")), sorted(best_rows([1, 2], None))
    ([2, 4], [])
    """
    if direction is None:
        return set()
    numbers = {
        i: float(v) for i, v in enumerate(values)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and _finite_number(v)
    }
    if not numbers:
        return set()
    best = min(numbers.values()) if direction == "min" else max(numbers.values())
    return {i for i, v in numbers.items() if v == best}


def _finite_number(value: float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:
        return False
