"""Unit tests of marinbuild.config_walk: the one walk over configs (enter, rebuild, name)."""

from __future__ import annotations

import collections
import dataclasses
import enum
import json
import pathlib
from dataclasses import InitVar, dataclass, field
from typing import Any, ClassVar, NamedTuple

import pytest

from marinbuild import mirrored, output_path_of, step, this_output_path, versioned
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
from marinbuild.errors import IdentityError, StepDefinitionError
from marinbuild.execution.attempt_start import to_jsonable
from marinbuild.graph import build_graph
from marinbuild.resolve import render_command, resolve_config
from marinbuild.steps import VersionedValue, find_mirrored, scan_config
from tests.helpers import marinbuild, marinbuild_in_process, write_marinfile


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


# -- The one config walker: what it enters, how it rebuilds, and every user of it agreeing.


class Pair(NamedTuple):
    src: Any
    n: Any


@dataclass(frozen=True)
class WithClassVar:
    KIND: ClassVar[str] = "train"
    data: Any = None
    lr: Any = 0.1


@dataclass
class Scaled:
    """``scale`` is passed once; ``__post_init__`` keeps its effect in ``size``."""

    base: Any
    size: int = 0
    scale: InitVar[int] = 1
    runs: list[int] = field(default_factory=list)

    def __post_init__(self, scale: int) -> None:
        self.size = 10 * scale
        self.runs.append(scale)


def test_children_name_each_shape_and_their_keys():
    assert children({"a": 1}) == (MAPPING, [("a", 1)])
    assert children(Pair(1, 2)) == (SEQUENCE, [(0, 1), (1, 2)])
    assert children(frozenset({3})) == (SET, [(0, 3)])
    assert children(WithClassVar(data=1)) == (RECORD, [("data", 1), ("lr", 0.1)])  # no ClassVar
    assert children(Scaled(base=1, scale=2)) == (RECORD, [("base", 1), ("size", 20), ("runs", [2])])  # no InitVar
    for leaf in (1, "s", None, Color.RED, pathlib.Path("/x"), versioned(1), object()):
        assert children(leaf) is None


def test_transform_rebuilds_every_container_in_its_own_type():
    doubled = transform(
        {
            "pair": Pair(1, [2, (3,)]),
            "dd": collections.defaultdict(list, {"k": 4}),
            "od": collections.OrderedDict([("z", 5), ("a", 6)]),
            "fs": frozenset({7}),
            "s": {8},
            "dc": WithClassVar(data=9),
        },
        lambda v: v * 2 if type(v) is int else KEEP,
    )
    assert doubled["pair"] == Pair(2, [4, (6,)]) and type(doubled["pair"]) is Pair
    assert type(doubled["dd"]) is collections.defaultdict and doubled["dd"]["k"] == 8
    assert doubled["dd"]["missing"] == []  # the factory came along
    assert list(doubled["od"].items()) == [("z", 10), ("a", 12)] and type(doubled["od"]) is collections.OrderedDict
    assert doubled["fs"] == frozenset({14}) and doubled["s"] == {16}
    assert doubled["dc"] == WithClassVar(data=18, lr=0.1) and doubled["dc"].KIND == "train"


def test_transform_keeps_what_did_not_change_and_never_reruns_post_init():
    unchanged = {"a": [1, "x"]}
    assert transform(unchanged, lambda v: KEEP) is unchanged
    cfg = Scaled(base=versioned(1), scale=3)
    resolved = transform(cfg, lambda v: v.value if isinstance(v, VersionedValue) else KEEP)
    assert resolved.base == 1 and resolved.size == 30  # the value passed, not the class default 1
    assert resolved.runs == [3]  # __post_init__ ran once, when the config was made
    assert cfg.base == versioned(1)  # the original is untouched


def test_walk_yields_dotted_paths_and_does_not_enter_placeholders():
    a = step("w/a", cmd="true")
    paths = [p for p, _ in walk({"x": Pair(a, versioned([1, 2])), "d": WithClassVar()})]
    assert paths == ["", "x", "x.0", "x.1", "d", "d.data", "d.lr"]


def test_named_values_are_what_a_template_may_name():
    assert named_values(WithClassVar(data=1)) == {"data": 1, "lr": 0.1}
    assert named_values(Pair(1, 2)) == {"src": 1, "n": 2}
    assert named_values(None) == {} and named_values([1]) is None


def test_scan_finds_references_in_namedtuples_but_not_in_class_variables():
    a, b = step("s/a", cmd="true"), step("s/b", cmd="true")

    @dataclass
    class Holder:
        HIDDEN: ClassVar[Any] = b
        ref: Any = None

    scan = scan_config({"p": Pair(a, versioned(3)), "h": Holder(ref=output_path_of(a, "f"))})
    assert scan.refs == (("p.0", a, None), ("h.ref", a, "f"))
    assert [p for p, _ in scan.marked] == ["p.1"]


def test_a_set_of_plain_values_is_fine_but_a_set_holding_references_is_refused():
    a = step("set/a", cmd="true")
    assert scan_config({"tags": {"x", "y"}}).refs == ()
    s = step("set/b", cmd="true", config={"deps": {a}})
    with pytest.raises(StepDefinitionError, match=r"step 'set/b': config field 'deps' is a set holding step references"):
        build_graph([s], "/p")


def identity_of(config: Any, name: str = "id/s") -> str:
    return build_graph([step(name, fn=print, config=config)], "/p").nodes[name].identity


def test_identity_ignores_class_variables_and_init_var_defaults():
    @dataclass(frozen=True)
    class A:
        KIND: ClassVar[str] = "a"
        lr: Any = None

    @dataclass(frozen=True)
    class B:  # the same fields, another ClassVar
        KIND: ClassVar[str] = "b"
        lr: Any = None

    assert identity_of({"c": versioned(A(lr=1))}) == identity_of({"c": versioned(B(lr=1))})
    assert identity_of({"c": versioned(Scaled(base=1, scale=2))}) != identity_of({"c": versioned(Scaled(base=1, scale=3))})


def test_identity_of_a_namedtuple_follows_its_versioned_values():
    up = step("id/up", cmd="true")
    assert identity_of({"p": Pair(up, versioned(1))}) != identity_of({"p": Pair(up, versioned(2))})
    assert identity_of({"p": Pair(up, 1)}) == identity_of({"p": Pair(up, 2)})


def test_identity_refuses_an_unknown_type_naming_the_step_and_the_dotted_path():
    class Opaque:
        def __str__(self) -> str:
            return "looks stable"

    with pytest.raises(IdentityError) as e:
        identity_of({"outer": versioned({"inner": [1, Opaque()]})}, name="id/opaque")
    assert "step 'id/opaque'" in str(e.value) and "'outer.inner.1'" in str(e.value) and "Opaque" in str(e.value)


def test_resolution_rebuilds_namedtuples_and_dataclasses_with_values_in_place():
    up = step("r/up", cmd="true")
    cfg = {"p": Pair(up, versioned(5)), "d": WithClassVar(data=output_path_of(up, "f"), lr=versioned(0.5)),
           "me": this_output_path("x"), "tags": frozenset({"a"})}
    resolved = resolve_config(cfg, "/o/me", {"r/up": "/o/up"})
    assert resolved["p"] == Pair("/o/up", 5) and type(resolved["p"]) is Pair
    assert resolved["d"] == WithClassVar(data="/o/up/f", lr=0.5)
    assert resolved["me"] == "/o/me/x" and resolved["tags"] == frozenset({"a"})


def test_mirrored_inputs_are_found_inside_namedtuples_and_versioned_values():
    m1, m2 = mirrored("memory://a/x"), mirrored(versioned("memory://a/y"))
    assert find_mirrored({"p": Pair(m1, versioned({"m": m2})), "again": m1}) == [m1, m2]


def test_info_json_renders_configs_by_their_fields():
    rendered = to_jsonable({"p": Pair("/o", {2, 1}), "d": WithClassVar(data=pathlib.Path("/d")), "c": Color.RED})
    assert rendered == {"p": {"src": "/o", "n": [1, 2]}, "d": {"data": "/d", "lr": 0.1}, "c": "red"}
    json.dumps(rendered)


def test_a_template_may_name_namedtuple_fields_and_dataclass_fields_but_not_class_variables():
    assert render_command("echo {src} {n}", Pair("/a b", 3), "/o") == "echo '/a b' 3"
    build_graph([step("t/nt", cmd="echo {src} {n} > {output}/x", config=Pair("a", 1))], "/p")
    bad = step("t/cv", cmd="echo {KIND} > {output}/x", config=WithClassVar())
    with pytest.raises(StepDefinitionError, match=r"names \{KIND\}, which is not in its config \(has: data, lr, output\)"):
        build_graph([bad], "/p")


MARINFILE = '''
import json
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

from marinbuild import output_path_of, step, this_output_path, versioned


@dataclass(frozen=True)
class Train:
    KIND: ClassVar[str] = "train"
    data: Any
    lr: Any
    out: Any = None


class Pair(NamedTuple):
    src: Any
    n: Any
    out: Any = None


def train(cfg):
    with open(cfg.data) as f:
        numbers = f.read().split()
    record = {"type": type(cfg).__name__, "kind": cfg.KIND, "lr": cfg.lr, "numbers": numbers, "data": cfg.data}
    with open(cfg.out + "/result.json", "w") as f:
        json.dump(record, f)


def consume(cfg):
    with open(cfg.src + "/n.txt") as f:
        numbers = f.read().split()
    record = {"type": type(cfg).__name__, "n": cfg.n, "numbers": numbers, "src": cfg.src}
    with open(cfg.out + "/result.json", "w") as f:
        json.dump(record, f)


data = step("cw/data", cmd="seq {n} > {output}/n.txt", config={"n": versioned(N)})
step("cw/dc-fn", fn=train,
     config=Train(data=output_path_of(data, "n.txt"), lr=versioned(0.5), out=this_output_path()))
step("cw/dc-cmd", cmd="cat {data} > {output}/copy.txt && echo {lr} >> {output}/copy.txt",
     config=Train(data=output_path_of(data, "n.txt"), lr=versioned(0.25)))
step("cw/nt-fn", fn=consume, config=Pair(src=data, n=versioned(7), out=this_output_path()))
step("cw/nt-cmd", cmd="cat {src}/n.txt > {output}/copy.txt && echo {n} >> {output}/copy.txt",
     config=Pair(src=data, n=versioned(9)))
'''


def _outputs(project: pathlib.Path) -> dict[str, pathlib.Path]:
    found = {}
    for folder in (project / "out").glob("cw/*"):
        found["cw/" + folder.name.rsplit("-", 1)[0]] = folder
    return found


def test_classvar_dataclass_and_namedtuple_configs_run_in_shell_and_function_steps(tmp_path):
    write_marinfile(tmp_path, MARINFILE.replace("versioned(N)", "versioned(3)"))
    planned = marinbuild_in_process("plan", "--prefix", "out", cwd=tmp_path)
    assert planned.returncode == 0, planned.stderr
    result = marinbuild("run", "--prefix", "out", "-q", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = _outputs(tmp_path)
    data = str(out["cw/data"])
    dc = json.loads((out["cw/dc-fn"] / "result.json").read_text())
    assert dc == {"type": "Train", "kind": "train", "lr": 0.5, "numbers": ["1", "2", "3"], "data": data + "/n.txt"}
    nt = json.loads((out["cw/nt-fn"] / "result.json").read_text())
    assert nt == {"type": "Pair", "n": 7, "numbers": ["1", "2", "3"], "src": data}
    assert (out["cw/dc-cmd"] / "copy.txt").read_text() == "1\n2\n3\n0.25\n"
    assert (out["cw/nt-cmd"] / "copy.txt").read_text() == "1\n2\n3\n9\n"
    again = marinbuild("run", "--prefix", "out", "-q", cwd=tmp_path)
    assert again.returncode == 0 and len(list((tmp_path / "out" / "cw").iterdir())) == 5  # nothing reran

    # A versioned value upstream changes: every step holding a reference to it reruns.
    write_marinfile(tmp_path, MARINFILE.replace("versioned(N)", "versioned(4)"))
    changed = marinbuild("run", "--prefix", "out", "-q", cwd=tmp_path)
    assert changed.returncode == 0, changed.stderr
    assert len(list((tmp_path / "out" / "cw").iterdir())) == 10
