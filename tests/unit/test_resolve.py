"""Unit tests of marinbuild.resolve: placeholders to values, quoted command templates."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import pytest

from marinbuild.errors import StepDefinitionError, UserError
from marinbuild.resolve import check_template, render_command, resolve_config, template_problem
from marinbuild.steps import Mirrored, output_path_of, step, this_output_path, versioned


def _fn(cfg: object) -> None:
    pass


class Pair(NamedTuple):
    left: object
    right: object


@dataclass(frozen=True)
class Box:
    inner: object
    label: str = "x"


def test_placeholders_become_values() -> None:
    a = step("a", _fn, {})
    config = {
        "dep": a,
        "sub": output_path_of(a, "data/x.txt"),
        "me": this_output_path(),
        "mine": this_output_path("f"),
        "n": versioned([1, versioned(2)]),
        "plain": 7,
    }
    resolved = resolve_config(config, "/o/me", {"a": "/o/a"})
    assert resolved == {
        "dep": "/o/a", "sub": "/o/a/data/x.txt", "me": "/o/me", "mine": "/o/me/f", "n": [1, 2], "plain": 7,
    }
    assert config["dep"] is a  # the original config is left alone


def test_containers_keep_their_types() -> None:
    a = step("a", _fn, {})
    resolved = resolve_config({"p": Pair(a, (a, 1)), "b": Box(a)}, "/o/me", {"a": "/o/a"})
    assert resolved["p"] == Pair("/o/a", ("/o/a", 1))
    assert type(resolved["p"]) is Pair
    assert resolved["b"] == Box("/o/a")


def test_mirrored_input_becomes_its_copy() -> None:
    m = Mirrored("gs://src/data")
    assert resolve_config({"m": m}, "/o", {}, {"gs://src/data": "/cache/data"}) == {"m": "/cache/data"}


def test_render_quotes_every_value() -> None:
    command = render_command("echo {msg} {files} > {output}/x", {"msg": "a b; rm -rf /", "files": ["1", "two 2"]}, "/out dir")
    assert command == "echo 'a b; rm -rf /' 1 'two 2' > '/out dir'/x"


def test_render_indexes_and_formats() -> None:
    assert render_command("t --lr {opt[lr]:.0e}", {"opt": {"lr": 0.0003}}, "/o") == "t --lr 3e-04"
    assert render_command("t {left} {right[0]}", Pair("l", ["r s"]), "/o") == "t l 'r s'"


def test_render_names_step_when_a_field_cannot_be_filled() -> None:
    with pytest.raises(UserError, match="step 's': command template"):
        render_command("t {opt[missing]}", {"opt": {}}, "/o", "s")


def test_render_refuses_nul_and_names_the_field() -> None:
    with pytest.raises(UserError, match=r"NUL byte.*'bad'"):
        render_command("t {bad}", {"bad": "a\0b"}, "/o", "s")


@pytest.mark.parametrize(
    ("template", "problem"),
    [
        ("t {n!r}", "conversions"),
        ("t {n.attr}", "attribute access"),
        ("t {0}", "must be named"),
        ("t {}", "must be named"),
        ("t {n:{w}}", "nested fields"),
        ("t {", "bad command template"),
        ("t {m}", "which is not in its config (has: n, output)"),
    ],
)
def test_template_problems(template: str, problem: str) -> None:
    found = template_problem(template, {"n"})
    assert found is not None and problem in found


def test_template_without_names_may_only_use_output() -> None:
    assert template_problem("t {output}", None) is None
    found = template_problem("t {x}", None)
    assert found is not None and "must be a dict" in found


def test_check_template_names_the_step() -> None:
    check_template(step("fn", _fn, [1]))  # function steps have no template
    check_template(step("ok", cmd="t {n} {output}", config={"n": 1}))
    with pytest.raises(StepDefinitionError, match="step 'bad': command template names"):
        check_template(step("bad", cmd="t {zzz}", config={"n": 1}))
    with pytest.raises(StepDefinitionError, match=r"step 'lst'.*must be a dict"):
        check_template(step("lst", cmd="t", config=[1]))
