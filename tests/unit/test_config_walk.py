"""Unit tests of marinbuild.config_walk: the one walk over configs (enter, rebuild, name)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import pathlib
from typing import ClassVar, NamedTuple

from marinbuild.config_walk import (
    KEEP,
    MAPPING,
    RECORD,
    SEQUENCE,
    SET,
    children,
    describe_leaf,
    field_names,
    is_namedtuple,
    is_placeholder,
    join_path,
    named_values,
    transform,
    walk,
)
from marinbuild.steps import this_output_path, versioned


class NT(NamedTuple):
    a: object
    b: object


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: object
    tag: ClassVar[str] = "not a field"


@dataclasses.dataclass
class WithInit:
    x: object
    scale: dataclasses.InitVar[int] = 1
    scaled: int = 0

    def __post_init__(self, scale: int) -> None:
        self.scaled = scale * 10


class Color(enum.Enum):
    RED = "red"


def test_children_by_shape() -> None:
    assert children({"k": 1}) == (MAPPING, [("k", 1)])
    assert children((1, 2)) == (SEQUENCE, [(0, 1), (1, 2)])
    assert children(NT(1, 2)) == (SEQUENCE, [(0, 1), (1, 2)])
    assert children(frozenset([3]))[0] == SET  # type: ignore[index]
    assert children(Frozen(5)) == (RECORD, [("x", 5)])
    for leaf in (1, "s", None, 2.5, True, Color.RED, pathlib.Path("/x"), object()):
        assert children(leaf) is None
    assert children(versioned([1])) is None  # a placeholder is never entered


def test_placeholders() -> None:
    assert is_placeholder(versioned(1)) and is_placeholder(this_output_path())
    assert not is_placeholder({"a": 1})


def test_field_names_skip_classvars_and_initvars() -> None:
    assert field_names(Frozen(1)) == ("x",)
    assert field_names(WithInit(1)) == ("x", "scaled")


def test_transform_rebuilds_in_the_containers_own_type() -> None:
    od = collections.OrderedDict(a=1)
    dd = collections.defaultdict(list, {"a": 1})
    value = {"nt": NT(1, [2]), "fz": Frozen(3), "od": od, "dd": dd, "set": {4}, "t": (5,)}
    out = transform(value, lambda v: v + 100 if type(v) is int else KEEP)
    assert out["nt"] == NT(101, [102]) and type(out["nt"]) is NT
    assert out["fz"] == Frozen(103)
    assert type(out["od"]) is collections.OrderedDict and out["od"] == {"a": 101}
    assert type(out["dd"]) is collections.defaultdict and out["dd"].default_factory is list
    assert out["set"] == {104} and out["t"] == (105,)
    assert value["nt"] == NT(1, [2])  # the original is untouched


def test_transform_keeps_unchanged_containers_as_they_are() -> None:
    value = {"a": [1, 2], "b": Frozen("x")}
    assert transform(value, lambda v: KEEP) is value


def test_rebuilding_a_dataclass_does_not_rerun_post_init() -> None:
    original = WithInit("x", scale=7)
    assert original.scaled == 70
    out = transform(original, lambda v: "y" if v == "x" else KEEP)
    assert out.x == "y" and out.scaled == 70


def test_walk_gives_dotted_paths_outermost_first() -> None:
    assert [p for p, _ in walk({"a": [1, {"b": 2}], "c": Frozen(3)})] == ["", "a", "a.0", "a.1", "a.1.b", "c", "c.x"]
    assert [p for p, _ in walk({"v": versioned({"inner": 1})})] == ["", "v"]


def test_named_values() -> None:
    assert named_values(None) == {}
    assert named_values({1: "a"}) == {"1": "a"}
    assert named_values(NT(1, 2)) == {"a": 1, "b": 2}
    assert named_values(Frozen(1)) == {"x": 1}
    assert named_values([1, 2]) is None
    assert is_namedtuple(NT(1, 2)) and not is_namedtuple((1, 2))


def test_describe_leaf_and_join_path() -> None:
    assert describe_leaf(Color.RED) == "red"
    assert describe_leaf(pathlib.PurePosixPath("/a/b")) == "/a/b"
    assert describe_leaf(3) == 3
    assert join_path("", "a") == "a" and join_path("a.b", "c") == "a.b.c"
