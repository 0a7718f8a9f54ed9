"""The hot paths that fill a frozen dataclass's dict at once build what its own constructor builds.

``step()``, the graph's nodes and the plain-marker parser skip ``__init__``
(:mod:`marinbuild.store.frozen_fill`); a field added to the class and forgotten there, or a
check the general path makes and the fast one does not, fails here.
"""

from __future__ import annotations

import dataclasses
import json
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

    pair = frozen_filled(Pair, a=1, b="y")
    assert pair == Pair(1, "y") and type(pair) is Pair
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


PLAIN_MARKERS = [
    {"status": SUCCESS, "time": 1.5},
    {"status": SUCCESS, "time": 1.5, "duration": 2.25, "owner": "h:1", "name": "train", "identity": "abc",
     "drift": "0123abcd", "retries": "f1.3_h0.2", "inputs": {"b": 2.0, "a": 1.0}},
    {"status": "FAILED", "time": 3.0, "error": "exited 1", "starting_over": True},
    {"status": "RUNNING", "time": 0.0, "inputs": {}},
]


@pytest.mark.parametrize("raw", PLAIN_MARKERS, ids=range(len(PLAIN_MARKERS)))
def test_a_plain_marker_parsed_fast_is_the_record_the_general_path_makes(raw: dict[str, Any]) -> None:
    fast = _plain_record(raw, raw["status"])
    assert fast is not None, "a marker as runners write it takes the fast path"
    _as_its_constructor_builds(fast)
    general = _general_record(raw, raw["status"])
    for f in dataclasses.fields(StatusRecord):
        assert getattr(fast, f.name) == getattr(general, f.name), f.name
    assert parse_status(json.dumps(raw), "/o/.marinbuild/status") == general


@pytest.mark.parametrize("raw", [
    {"status": SUCCESS, "time": 1},  # an int: the general path makes it a float
    {"status": SUCCESS, "time": 1.0, "owner": "a\x1b[31m"},
    {"status": SUCCESS, "time": 1.0, "drift": "not hex"},
    {"status": SUCCESS, "time": 1.0, "starting_over": False},
])
def test_a_marker_that_is_not_plain_is_left_to_the_general_path(raw: dict[str, Any]) -> None:
    assert _plain_record(raw, raw["status"]) is None
