"""The hot paths that fill a frozen dataclass's dict at once build what its own constructor builds.

``step()``, the graph's nodes and the plain-marker parser skip ``__init__``
(:mod:`marinbuild.store.frozen_fill`); a field added to the class and forgotten there, or a
check the general path makes and the fast one does not, fails here. A status marker goes
through one door (``parse_status``): the fast parser takes it or leaves it, whole, to the
general one, and what comes out is the general path's record on every field either way
(absent optional keys, nulls, keys no runner writes, values of the wrong type).
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from typing import Any

import pytest

from marinbuild.graph import build_graph
from marinbuild.resources import Cores
from marinbuild.steps import step
from marinbuild.store.frozen_fill import frozen_filled
from marinbuild.store.markers import SUCCESS, StatusRecord, _general_record, _plain_record, parse_status


def _as_its_constructor_builds(fast: Any) -> None:
    cls = type(fast)
    fields = dataclasses.fields(cls)
    assert set(vars(fast)) == {f.name for f in fields}, "the fast path must fill every field, and only those"
    general = cls(**{f.name: getattr(fast, f.name) for f in fields if f.init})
    for f in fields:
        assert getattr(general, f.name) == getattr(fast, f.name), f.name
    if cls.__dataclass_params__.eq:  # type: ignore[attr-defined]  # a Step is equal to itself alone
        assert general == fast


def test_the_helper_fills_exactly_what_it_is_given() -> None:
    @dataclasses.dataclass(frozen=True)
    class Pair:
        a: int
        b: str = "x"

    given = {"a": 1, "b": "y"}
    pair = frozen_filled(Pair, given)
    assert pair == Pair(1, "y") and type(pair) is Pair and vars(pair) is given
    with pytest.raises(dataclasses.FrozenInstanceError):
        pair.a = 2  # type: ignore[misc]


def test_a_step_as_step_builds_it_is_the_step_its_class_builds() -> None:
    plain = step("plain", cmd="true")
    full = step(
        "full", fn=print, config={"lr": 0.1, "up": plain}, resources=Cores(2), description="all fields",
        env={"A": "1"}, max_retries_preemption=3, max_retries_failure=1, max_retries_hang=0,
        progress_timeout="15m", pip_dependency_groups=["train"], hash_code=True,
        slurm={"partition": "gpu"}, strict_outputs=True, resume_output=True,
    )
    for s in (plain, full):
        _as_its_constructor_builds(s)


def test_a_graph_node_is_the_node_its_class_builds() -> None:
    up = step("up", cmd="true")
    graph = build_graph([step("down", cmd="cat {x}", config={"x": up})], "/p")
    for node in graph.nodes.values():
        _as_its_constructor_builds(node)


FULL_MARKER: dict[str, Any] = {
    "status": SUCCESS, "time": 1.5, "error": "exited 1", "duration": 2.25, "owner": "h:1", "name": "train",
    "identity": "abc", "drift": "0123abcd", "retries": "f1.3_h0.2", "inputs": {"b": 2.0, "a": 1.0},
    "starting_over": True,
}
"""Every field a runner writes, each with a plain value."""

PLAIN_MARKERS = [
    {"status": SUCCESS, "time": 1.5},
    {"status": SUCCESS},  # no time: 0.0 on both paths
    FULL_MARKER,
    {"status": "FAILED", "time": 3.0, "error": "exited 1", "starting_over": True},
    {"status": "RUNNING", "time": 0.0, "inputs": {}},
    {"status": SUCCESS, "time": 1.5, "duration": None, "error": None, "drift": None, "retries": None,
     "inputs": None, "starting_over": None},  # a null is an absent field on both paths
    {"status": SUCCESS, "time": -0.0, "error": "", "name": "x" * 200},  # at the limits
    {"status": "S" * 40, "time": 1.0},
]
# Each optional field left out of the full marker in turn.
PLAIN_MARKERS += [{k: v for k, v in FULL_MARKER.items() if k != left_out} for left_out in FULL_MARKER if left_out != "status"]


def _same_fields(one: StatusRecord, other: StatusRecord) -> None:
    """Equal on every field, and of the same type (``3 == 3.0``, but a duration is a float)."""
    for f in dataclasses.fields(StatusRecord):
        mine, theirs = getattr(one, f.name), getattr(other, f.name)
        assert (mine, type(mine)) == (theirs, type(theirs)), f.name


def _agrees_with_the_general_path(raw: dict[str, Any]) -> None:
    """What a marker parses to is what the general path makes of it, field by field."""
    general = _general_record(raw, raw["status"])
    parsed = parse_status(json.dumps(raw), "/o/.marinbuild/status")
    _same_fields(parsed, general)
    assert parsed == general


@pytest.mark.parametrize("raw", PLAIN_MARKERS, ids=range(len(PLAIN_MARKERS)))
def test_a_plain_marker_parsed_fast_is_the_record_the_general_path_makes(raw: dict[str, Any]) -> None:
    fast = _plain_record(raw, raw["status"])
    assert fast is not None, "a marker as runners write it takes the fast path"
    _as_its_constructor_builds(fast)
    _same_fields(fast, _general_record(raw, raw["status"]))
    _agrees_with_the_general_path(raw)


NOT_PLAIN = [
    {"status": SUCCESS, "time": 1},  # an int: the general path makes it a float
    {"status": SUCCESS, "time": "1.0"},
    {"status": SUCCESS, "time": -1.0},
    {"status": SUCCESS, "time": math.inf},
    {"status": SUCCESS, "time": math.nan},
    {"status": SUCCESS, "time": True},
    {"status": SUCCESS, "time": 1.0, "duration": 3},
    {"status": SUCCESS, "time": 1.0, "duration": -2.0},
    {"status": SUCCESS, "time": 1.0, "duration": "2s"},
    {"status": SUCCESS, "time": 1.0, "owner": "a\x1b[31m"},
    {"status": SUCCESS, "time": 1.0, "name": 7},
    {"status": SUCCESS, "time": 1.0, "identity": ["abc"]},
    {"status": SUCCESS, "time": 1.0, "error": "x" * 201},
    {"status": SUCCESS, "time": 1.0, "error": {"why": "a dict"}},
    {"status": "S" * 41, "time": 1.0},
    {"status": "SUCC\nESS", "time": 1.0},
    {"status": SUCCESS, "time": 1.0, "drift": "not hex"},
    {"status": SUCCESS, "time": 1.0, "drift": ""},
    {"status": SUCCESS, "time": 1.0, "drift": 12},
    {"status": SUCCESS, "time": 1.0, "retries": "f1@3"},
    {"status": SUCCESS, "time": 1.0, "retries": 3},
    {"status": SUCCESS, "time": 1.0, "starting_over": False},
    {"status": SUCCESS, "time": 1.0, "starting_over": "yes"},
    {"status": SUCCESS, "time": 1.0, "inputs": [["a", 1.0]]},
    {"status": SUCCESS, "time": 1.0, "inputs": {"a": 1}},
    {"status": SUCCESS, "time": 1.0, "inputs": {"a": -1.0}},
    {"status": SUCCESS, "time": 1.0, "inputs": {"a": None}},
    {"status": SUCCESS, "time": 1.0, "extra": "a key no runner writes"},
    {**FULL_MARKER, "leased_by": "h:2"},  # a field that is never stored
]


@pytest.mark.parametrize("raw", NOT_PLAIN, ids=range(len(NOT_PLAIN)))
def test_a_marker_that_is_not_plain_is_left_to_the_general_path(raw: dict[str, Any]) -> None:
    assert _plain_record(raw, raw["status"]) is None
    _agrees_with_the_general_path(raw)


def test_every_mix_of_plain_and_odd_fields_parses_as_the_general_path_does() -> None:
    """Markers mixing plain values with odd ones field by field (a fixed seed): whichever path
    takes one, the record is the general path's on every field."""
    odd: dict[str, list[Any]] = {
        "time": [0.0, 7.25, 3, -1.0, "x", None], "duration": [1.5, 0, -1.0, None, "x"],
        "error": ["e", "", "x" * 250, 5, None, "a\x00b"], "owner": ["h:1", None, 1.5],
        "name": ["a", None, ["a"]], "identity": ["abc", None, "é"], "drift": ["ab12", "xyz", None, 3],
        "retries": ["f1.3", "f1@3", None], "inputs": [{"a": 1.0}, {}, {"a": 2}, [], None],
        "starting_over": [True, False, None],
    }
    rng = random.Random(20261202)
    took_the_fast_path = 0
    for _ in range(2000):
        raw: dict[str, Any] = {"status": rng.choice([SUCCESS, "FAILED", "RUNNING", "S" * 41])}
        for key, values in odd.items():
            if rng.random() < 0.7:
                raw[key] = rng.choice(values)
        if rng.random() < 0.05:
            raw["unknown"] = 1
        fast = _plain_record(raw, raw["status"])
        if fast is not None:
            took_the_fast_path += 1
            _as_its_constructor_builds(fast)
            _same_fields(fast, _general_record(raw, raw["status"]))
        _agrees_with_the_general_path(raw)
    assert 0 < took_the_fast_path < 2000, "the mix must take both paths"

