"""Unit tests of marinbuild.identity: the canonical encoding, payloads, and what has no identity."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
import subprocess
import sys
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from marinbuild import identity as identity_mod
from marinbuild import output_path_of, step, versioned
from marinbuild.errors import IdentityError
from marinbuild.graph import build_graph
from marinbuild.identity import canonical_json, code_digest, hash_payload, identity_payload, source_digest
from marinbuild.steps import mirrored, this_output_path
from tests.helpers import cli_env


def _fn(cfg: object) -> None:
    pass


def _reference(payload: Any) -> str:
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


PAYLOADS: list[Any] = [
    {},
    {"b": 1, "a": 2},
    {"nested": {"z": [1, 2.5, -0.0, 1e300, 1e-300], "a": None, "t": True, "f": False}},
    {"unicode": "é 日本 \u2028 \x00 \\ \"quote\"", "emoji": "\U0001f600"},
    {"big": 2**80, "neg": -(2**70), "float": 0.1 + 0.2},
    {"list": [[], {}, [[]], {"k": [{"deep": "x"}]}]},
    {"k" * 1000: "v" * 10000},
    {str(i): i for i in range(300)},
    [1, "two", None],
    "plain string",
    3.25,
]


@pytest.mark.parametrize("payload", PAYLOADS)
def test_the_fast_encoder_agrees_with_the_standard_one(payload: Any) -> None:
    # identity.py builds json's C encoder by hand (a private API); every shape must encode
    # exactly as json.dumps does, or identities would change.
    assert canonical_json(payload) == _reference(payload)


def test_non_finite_floats_are_refused_by_both_encoders() -> None:
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_hash_is_16_hex_digits_of_the_canonical_text() -> None:
    h = hash_payload({"a": 1})
    assert len(h) == 16 and int(h, 16) >= 0
    assert hash_payload({"a": 1, "b": 2}) == hash_payload({"b": 2, "a": 1})
    assert hash_payload({"a": 1}) != hash_payload({"a": 1.5})


class Mode(enum.Enum):
    FAST = "fast"


@dataclasses.dataclass
class Opt:
    lr: float
    mode: Mode = Mode.FAST


def test_payload_holds_versioned_values_and_dependencies() -> None:
    a = step("a", _fn, {})
    config = {
        "n": versioned(3),
        "plain": 7,
        "opt": versioned(Opt(0.1)),
        "dep": a,
        "file": output_path_of(a, "x.txt"),
        "set": versioned({3, 1, 2}),
        "path": versioned(pathlib.PurePosixPath("/data")),
        "me": versioned(this_output_path("sub")),
        "src": mirrored(versioned("gs://b/tok")),
    }
    payload = identity_payload("s", config, {a: "a-0000000000000001"})
    assert payload["name"] == "s"
    assert payload["versioned"] == {
        "n": 3,
        "opt": {"lr": 0.1, "mode": "fast"},
        "set": [1, 2, 3],
        "path": "/data",
        "me": {"__this_output_path__": "sub"},
        "src": {"__mirrored__": "gs://b/tok"},
    }
    assert payload["dependencies"] == {"dep": "a-0000000000000001", "file": "a-0000000000000001/x.txt"}
    assert "code" not in payload
    assert identity_payload("s", {}, {}, code="cmd:x")["code"] == "cmd:x"


def test_a_reference_inside_a_versioned_value_is_a_dependency() -> None:
    a = step("a", _fn, {})
    payload = identity_payload("s", {"v": versioned({"in": a})}, {a: "a-1"})
    assert payload["versioned"] == {"v": {"in": {"__output_path_of__": "a-1"}}}
    assert payload["dependencies"] == {"v.in": "a-1"}


@pytest.mark.parametrize(
    ("value", "what"),
    [(float("inf"), "non-finite float"), (object(), "a value of type object"), ({1: "a"}, "a dict key of type int"),
     ({1, "a"}, "a set of mixed"), ({float("nan")}, "non-finite float")],
)
def test_values_without_a_stable_encoding_are_refused(value: Any, what: str) -> None:
    with pytest.raises(IdentityError, match=what) as e:
        identity_payload("s", {"field": versioned(value)}, {})
    assert "step 's': versioned field 'field'" in str(e.value)


def test_source_digest_and_code_digest() -> None:
    digest = source_digest(_fn)
    assert digest is not None and source_digest(_fn) == digest
    assert source_digest(len) is None
    assert code_digest(step("s", cmd="echo hi")) == "cmd:echo hi"
    assert code_digest(step("f", _fn, {})) == f"fn:{digest}"
    with pytest.raises(IdentityError, match="needs the function's source"):
        code_digest(step("b", len, {}))


_SHAPES = [
    {},
    {"a": 1},
    {"b": [], "a": {}},
    {"z": {"y": {"x": [1, [2, [3, {"w": None}]]]}}},
    {"nums": [0, -1, 2**70, -(2**70), 1.5, -0.0, 1e300, 5e-324, 0.1 + 0.2, 3.0]},
    {"flags": [True, False, None]},
    {"text": ["", "é", "日本", "\u0000\x1f", '"quoted"', "back\\slash", "\n\t\r", "\u2028", "🙂"]},
    {"é": 1, "A": 2, "a": 3, "": 4, "10": 5, "9": 6},
    {"nested": [{"b": 1, "a": 2}, {"d": [], "c": {"f": 1, "e": 2}}]},
    {"tuple": (1, 2), "big": list(range(50))},
]


@pytest.mark.parametrize("payload", _SHAPES, ids=[str(i) for i in range(len(_SHAPES))])
def test_the_c_encoder_writes_what_the_standard_one_writes(payload) -> None:
    import json

    from marinbuild import identity

    standard = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    assert identity._C_CANONICAL is not None  # CPython: the fast path is what is tested
    assert identity.canonical_json(payload) == standard


@pytest.mark.parametrize("payload", [{"x": float("nan")}, {"x": float("inf")}, {"x": {1, 2}}, {1: "a", "b": 2}])
def test_the_c_encoder_refuses_what_the_standard_one_refuses(payload) -> None:
    import json

    from marinbuild import identity

    with pytest.raises((ValueError, TypeError)) as standard:
        json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    with pytest.raises(standard.type):
        identity.canonical_json(payload)


# -- Identity: what enters the hash, what does not, and that it is stable across processes.


@dataclass(frozen=True)
class Cfg:
    lr: object
    epochs: object
    note: str = "plain"


def pipeline(lr=0.1, a_n=1, note="plain", b_n=2):
    a = step("a", cmd="true", config={"n": versioned(a_n)})
    b = step("b", cmd="true", config={"n": versioned(b_n)})
    c = step("c", fn=print, config=Cfg(lr=versioned(lr), epochs=a, note=note))
    d = step("d", fn=print, config={"c": output_path_of(c, "model"), "b": b})
    return build_graph([a, b, c, d], "/prefix")


def ids(graph):
    return {n: node.identity for n, node in graph.nodes.items()}


def test_versioned_change_moves_that_step_and_downstream_only():
    base = ids(pipeline())
    changed = ids(pipeline(lr=0.2))
    assert changed["a"] == base["a"] and changed["b"] == base["b"]
    assert changed["c"] != base["c"] and changed["d"] != base["d"]
    upstream = ids(pipeline(a_n=5))
    assert upstream["b"] == base["b"]
    assert {n for n in base if upstream[n] != base[n]} == {"a", "c", "d"}


def test_plain_field_does_not_change_identity():
    assert ids(pipeline(note="other")) == ids(pipeline())


def test_changing_back_gives_the_same_identity():
    assert ids(pipeline(lr=0.1)) == ids(pipeline(lr=0.1))
    assert ids(pipeline(lr=0.3)) != ids(pipeline(lr=0.1))


def test_prefix_does_not_enter_identity():
    a = step("a", cmd="true", config={"n": versioned(1)})
    g1, g2 = build_graph([a], "/one"), build_graph([a], "gs://bucket/two")
    assert g1.nodes["a"].identity == g2.nodes["a"].identity
    assert g1.nodes["a"].output_path == f"/one/a-{g1.nodes['a'].identity}"
    assert g2.nodes["a"].output_path.startswith("gs://bucket/two/a-")


def test_override_output_path_keeps_downstream_identity():
    def build(override):
        a = step("a", cmd="true", config={"n": versioned(1)}, override_output_path=override)
        b = step("b", cmd="true", config={"a": a})
        return build_graph([b], "/p")

    plain, moved = build(None), build("/p/elsewhere/a")
    assert moved.nodes["a"].output_path == "/p/elsewhere/a"
    assert moved.nodes["b"].identity == plain.nodes["b"].identity


@pytest.mark.parametrize(
    "value, field",
    [
        (lambda x: x, "fn"),
        (object(), "fn"),
        ({1, "a"}, "fn"),
        ({"k": {1: 2}}, "fn"),
        (float("nan"), "fn"),
    ],
)
def test_unencodable_values_are_refused_with_step_and_field(value, field):
    s = step("bad", cmd="true", config={field: versioned(value)})
    with pytest.raises(IdentityError) as e:
        build_graph([s], "/p")
    assert "'bad'" in str(e.value) and f"'{field}" in str(e.value)


def test_nested_field_path_is_named():
    s = step("bad", cmd="true", config={"opt": versioned({"sched": [1, object()]})})
    with pytest.raises(IdentityError, match=r"opt\.sched\.1"):
        build_graph([s], "/p")


def test_sets_of_one_type_and_dataclasses_are_encoded():
    s = step("ok", fn=print, config=versioned({"tags": {"b", "a"}, "cfg": Cfg(lr=1, epochs=2)}))
    g = build_graph([s], "/p")
    assert g.nodes["ok"].payload["versioned"]["."]["tags"] == ["a", "b"]


SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from marinbuild.marinfile import load_marinfile
from marinbuild.graph import build_graph
mf = load_marinfile(sys.argv[2])
g = build_graph(mf.steps, sys.argv[3])
print(json.dumps({n: v.identity for n, v in g.nodes.items()}))
"""

MARINFILE = """
from dataclasses import dataclass
from marinbuild import step, versioned
@dataclass(frozen=True)
class C:
    x: object
    y: object
a = step("a", cmd="true", config={"s": versioned({"z": 1, "a": [1.5, "t", None, True]})})
b = step("b", fn=print, config=C(x=versioned(frozenset({"q", "p"})), y=a))
"""


def test_identity_is_stable_across_fresh_interpreters(tmp_path):
    from tests.helpers import REPO

    mf = tmp_path / "Marinfile.py"
    mf.write_text(MARINFILE)
    results = []
    for seed, cwd, prefix in (("1", tmp_path, "/x"), ("12345", "/", "gs://b/y")):
        env = cli_env({"PYTHONHASHSEED": seed})
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(REPO), str(mf), prefix],
            cwd=cwd, env=env, capture_output=True, text=True, check=True,
        )
        results.append(json.loads(out.stdout))
    assert results[0] == results[1]
    assert all(len(v) >= 8 for v in results[0].values())


def test_hashing_is_linear_in_chain_length(monkeypatch):
    calls = []
    real = identity_mod.identity_payload

    def counting(name, config, dep_ids, scan=None):
        calls.append(name)
        return real(name, config, dep_ids, scan)

    monkeypatch.setattr("marinbuild.graph.identity_payload", counting)
    prev = step("s0", cmd="true")
    for i in range(1, 2000):
        prev = step(f"s{i}", cmd="true", config={"dep": prev})
    g = build_graph([prev], "/p")
    assert len(calls) == 2000
    # A step's payload names only its direct dependency: upstream payloads are never re-walked.
    assert len(json.dumps(g.nodes["s1999"].payload)) < 200


class Level(enum.IntEnum):
    HIGH = 3


class Color(enum.StrEnum):
    RED = "red"


class Ratio(float, enum.Enum):
    HALF = 0.5


class Count(int):
    pass


class Pair(NamedTuple):
    left: Any
    right: Any


class Table(dict):  # type: ignore[type-arg]
    pass


def test_a_value_is_encoded_as_the_first_kind_its_type_is() -> None:
    # An IntEnum is an int and an enum (encoded by its value); a StrEnum is a string; a float enum
    # a float; subclasses of the plain containers are containers. Twice: the second time each type's
    # handler is the one it was given the first time.
    config = {
        "level": versioned(Level.HIGH), "color": versioned(Color.RED), "ratio": versioned(Ratio.HALF),
        "count": versioned(Count(7)), "flag": versioned(True), "pair": versioned(Pair(Level.HIGH, [Color.RED])),
        "table": versioned(Table(b=Ratio.HALF, a=OrderedDict(z=1))), "none": versioned(None),
    }
    expected = ('{"dependencies":{},"name":"s","versioned":{"color":"red","count":7,"flag":true,"level":3,'
                '"none":null,"pair":[3,["red"]],"ratio":0.5,"table":{"a":{"z":1},"b":0.5}}}')
    for _ in range(2):
        assert canonical_json(identity_payload("s", config, {})) == expected


@pytest.mark.parametrize(
    ("value", "what"),
    [(Count(10**5000), "an integer over 4,000 digits"), (Table({1: "a"}), "a dict key of type int"),
     (Pair(1, object()), "a value of type object"), (b"x", "a value of type bytes")],
    ids=["huge int subclass", "dict subclass", "namedtuple", "bytes"],
)
def test_a_subclass_is_refused_as_its_base_is(value: Any, what: str) -> None:
    for _ in range(2):
        with pytest.raises(IdentityError, match=what):
            identity_payload("s", {"field": versioned(value)}, {})
