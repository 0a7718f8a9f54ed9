"""Unit tests of marinbuild.identity: the canonical encoding, payloads, and what has no identity."""

from __future__ import annotations

import dataclasses
import enum
import json
import pathlib
from typing import Any

import pytest

from marinbuild.errors import IdentityError
from marinbuild.identity import canonical_json, code_digest, hash_payload, identity_payload, source_digest
from marinbuild.steps import mirrored, output_path_of, step, this_output_path, versioned


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
