"""Golden identities: a dozen representative configs and the hashes they must keep.

An identity names a step's output folder (``NAME-IDENTITY``): if the encoder changes by
accident, every user's outputs would be rerun. These hashes were computed once and are
pinned; a change here must be deliberate and announced, never a side effect.
"""

from __future__ import annotations

import enum
import pathlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import pytest

from marinbuild import mirrored, output_path_of, step, this_output_path, versioned
from marinbuild.graph import build_graph


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


@dataclass(frozen=True)
class Optim:
    lr: Any
    betas: Any = (0.9, 0.95)


@dataclass(frozen=True)
class TrainConfig:
    data: Any
    optim: Any
    steps: Any
    note: str = "not in identity"


class Pair(NamedTuple):
    left: Any
    right: Any


def _cases() -> dict[str, tuple[list[Any], str]]:
    """Name -> (steps to build, the step whose identity is pinned)."""
    raw = step("golden/raw", cmd="seq 10 > {output}/n.txt")
    tok = step("golden/tok", cmd="true", config={"n": versioned(1000), "seed": 3})
    c2 = step("golden/c2", cmd="true", config={"t": tok, "k": versioned(2)})
    cases: dict[str, tuple[list[Any], str]] = {
        "no_config": ([raw], "golden/raw"),
        "plain_values_only": ([step("golden/plain", cmd="true", config={"a": 1, "b": "x"})], "golden/plain"),
        "versioned_scalars": (
            [step("golden/scalars", fn=print, config={
                "i": versioned(7), "f": versioned(0.25), "s": versioned("héllo"), "b": versioned(True),
                "none": versioned(None), "neg": versioned(-3), "big": versioned(2**70),
            })],
            "golden/scalars",
        ),
        "nested_containers": (
            [step("golden/nested", fn=print, config={
                "outer": {"inner": [versioned([1, 2, {"k": "v"}]), versioned((3, 4))]},
                "d": versioned({"z": 1, "a": [0.5, None]}),
            })],
            "golden/nested",
        ),
        "dataclass": (
            [step("golden/dc", fn=print, config=TrainConfig(
                data=versioned("corpus-v2"), optim=Optim(lr=versioned(3e-4)), steps=versioned(1000)))],
            "golden/dc",
        ),
        "versioned_dataclass_whole": (
            [step("golden/dc_whole", fn=print, config={"optim": versioned(Optim(lr=0.1, betas=(0.8, 0.9)))})],
            "golden/dc_whole",
        ),
        "dependencies": (
            [raw, tok, step("golden/deps", fn=print, config={
                "raw": raw, "tok": output_path_of(tok, "vocab.json"), "list": [raw, output_path_of(tok)],
            })],
            "golden/deps",
        ),
        "enum_and_path": (
            [step("golden/enum", fn=print, config={
                "c": versioned(Color.RED), "n": versioned(Color.BLUE), "p": versioned(pathlib.PurePosixPath("a/b")),
            })],
            "golden/enum",
        ),
        "sets": (
            [step("golden/sets", fn=print, config={
                "s": versioned({"b", "a", "c"}), "f": versioned(frozenset({3, 1, 2})),
            })],
            "golden/sets",
        ),
        "mirrored": (
            [step("golden/mirror", fn=print, config={
                "vocab": mirrored(versioned("gs://bucket/vocab.json")), "unversioned": mirrored("gs://b/x"),
            })],
            "golden/mirror",
        ),
        "refs_inside_versioned": (
            [raw, step("golden/refv", fn=print, config={
                "v": versioned({"src": raw, "sub": output_path_of(raw, "n.txt"), "self": this_output_path("x")}),
            })],
            "golden/refv",
        ),
        "namedtuple": (
            [raw, step("golden/nt", fn=print, config={"pair": Pair(versioned(1), raw), "v": versioned(Pair(2, "b"))})],
            "golden/nt",
        ),
        "chain_of_three": ([tok, c2, step("golden/c3", fn=print, config={"up": c2})], "golden/c3"),
        "override_output_path": (
            [step("golden/override", cmd="true", config={"n": versioned(5)}, override_output_path="fixed/place")],
            "golden/override",
        ),
    }
    return cases


GOLDEN = {
    "no_config": "899a2d799241053f",
    "plain_values_only": "564064e0adb1c141",
    "versioned_scalars": "3164bdbe05fd095a",
    "nested_containers": "9de01e095c3bbc25",
    "dataclass": "8c4f3ed20ebabc12",
    "versioned_dataclass_whole": "eaa2cac0e36eb690",
    "dependencies": "2dc309c6c6ec144e",
    "enum_and_path": "13344a3fdc14026e",
    "sets": "869e90e9a563bbc9",
    "mirrored": "8209f974c94ab53b",
    "refs_inside_versioned": "a29790a32ec4ef33",
    "namedtuple": "25819bd2413bb4b5",
    "chain_of_three": "a5e9df9815ea4127",
    "override_output_path": "6761f357d9acb1c8",
}


def _identity(case: str) -> str:
    steps, name = _cases()[case]
    return build_graph(steps, "/golden-prefix").nodes[name].identity


@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_identity_matches_its_pinned_golden(case: str) -> None:
    assert _identity(case) == GOLDEN[case], f"the identity of {case!r} changed: every user's outputs would rerun"


def test_every_case_is_pinned_and_the_cases_differ() -> None:
    assert set(GOLDEN) == set(_cases())
    assert len(set(GOLDEN.values())) == len(GOLDEN)
