"""Unit tests of marinbuild.report.winner: directions declared or guessed, the best rows, bad input."""

from __future__ import annotations

import math

import pytest

from marinbuild.errors import UserError
from marinbuild.report.winner import best_rows, direction_of, parse_best, read_best


def test_directions_by_name_and_as_declared() -> None:
    assert direction_of("val_loss", {}) == "min" and direction_of("test.error", {}) == "min"
    assert direction_of("f1", {}) == "max" and direction_of("auc", {}) == "max" and direction_of("score", {}) == "max"
    assert direction_of("throughput", {}) is None
    assert direction_of("throughput", {"throughput": "max"}) == "max"


def test_best_rows_ignore_what_is_not_a_finite_number() -> None:
    assert best_rows([0.5, math.nan, None, "x", 0.2, math.inf], "min") == {4}
    assert best_rows([0.5, 0.7, 0.7], "max") == {1, 2}
    assert best_rows([None, "x"], "max") == set()


def test_bad_best_is_one_line() -> None:
    assert parse_best(["eval_loss=min", " acc = max "]) == {"eval_loss": "min", "acc": "max"}
    for bad in ("eval_loss", "=min", "loss=lowest"):
        with pytest.raises(UserError, match="expected METRIC=min or METRIC=max"):
            parse_best([bad])
    assert read_best(None) == {} and read_best({"a": "max"}) == {"a": "max"}
    with pytest.raises(UserError, match="BEST in the Marinfile"):
        read_best({"a": "up"})
