"""Unit tests of marinbuild.steps: declaring steps, placeholders, and the one scan of a config."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from marinbuild.errors import StepDefinitionError, UserError
from marinbuild.steps import (
    Step,
    collect_declared,
    declaring,
    mirrored,
    output_path_of,
    scan_config,
    step,
    this_output_path,
    versioned,
)


def _fn(cfg: object) -> None:
    pass


def test_a_step_is_a_function_or_a_command() -> None:
    assert step("f", _fn, {}).kind == "fn"
    assert step("c", cmd="true").kind == "cmd"
    with pytest.raises(StepDefinitionError, match="exactly one of fn= or cmd="):
        step("both", _fn, cmd="true")
    with pytest.raises(StepDefinitionError, match="exactly one"):
        step("neither")
    with pytest.raises(StepDefinitionError, match="fn must be callable"):
        step("x", 3)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["a", "sweep/lr=0.1", "x-1.2_b", "deep/er/name"])
def test_good_names(name: str) -> None:
    assert step(name, cmd="true").name == name


@pytest.mark.parametrize(
    ("name", "problem"),
    [("", "non-empty"), ("/abs", "relative"), ("a/../b", "'..'"), ("a//b", "empty parts"), ("a b", "spaces"),
     ("a*", "glob"), ("a\0b", "control characters"), (3, "non-empty string"), ("a\\b", "backslash"),
     ("x" * 300, "too long"), ("d/" + "y" * 239, "too long")],
)
def test_bad_names(name: Any, problem: str) -> None:
    with pytest.raises(StepDefinitionError, match=problem):
        step(name, cmd="true")


def test_env_is_sorted_pairs_and_checked() -> None:
    assert step("s", cmd="true", env={"B": "2", "A": 1}).env == (("A", "1"), ("B", "2"))  # type: ignore[dict-item]
    for bad in ({"A=B": "1"}, {"": "1"}, {"A": "x\0"}):
        with pytest.raises(StepDefinitionError, match="not a valid variable"):
            step("s", cmd="true", env=bad)


def test_command_template_checks() -> None:
    with pytest.raises(StepDefinitionError, match="NUL byte"):
        step("s", cmd="echo \0")
    with pytest.raises(StepDefinitionError, match="string template"):
        step("s", cmd=["echo"])  # type: ignore[arg-type]


def test_progress_timeout_and_groups() -> None:
    assert step("s", cmd="true", progress_timeout="15m").progress_timeout == 900.0
    with pytest.raises(StepDefinitionError, match="progress_timeout"):
        step("s", cmd="true", progress_timeout=0)
    with pytest.raises(StepDefinitionError, match="progress_timeout"):
        step("s", cmd="true", progress_timeout="soon")
    assert step("s", cmd="true", pip_dependency_groups="jax").pip_dependency_groups == ("jax",)
    with pytest.raises(StepDefinitionError, match="pip_dependency_groups"):
        step("s", cmd="true", pip_dependency_groups=["", "x"])


def test_steps_compare_by_object() -> None:
    a, b = step("a", cmd="true"), step("a", cmd="true")
    assert a != b and a == a and len({a, b}) == 2
    assert repr(a) == "Step('a')"


def test_collect_declared_gathers_in_order() -> None:
    assert not declaring()
    with collect_declared() as found:
        assert declaring()
        a = step("a", cmd="true")
        b = step("b", cmd="true")
    assert found == [a, b]
    assert not declaring()
    step("outside", cmd="true")
    assert found == [a, b]


def test_placeholders() -> None:
    a = step("a", cmd="true")
    assert output_path_of(a, "x").sub == "x"
    with pytest.raises(StepDefinitionError, match="needs a Step"):
        output_path_of("a")  # type: ignore[arg-type]
    assert this_output_path("f").sub == "f"
    assert versioned([1]).value == [1]


def test_mirrored() -> None:
    m = mirrored(pathlib.Path("/data/x"), budget_gb=2)
    assert (m.source, m.versioned, m.budget_gb) == ("/data/x", False, 2)
    assert mirrored(versioned("gs://b/x")).versioned
    with pytest.raises(UserError):
        mirrored("")
    with pytest.raises(UserError, match="budget_gb"):
        mirrored("gs://b/x", budget_gb=-1)


def test_scan_finds_references_and_versioned_values_in_order() -> None:
    a, b = step("a", cmd="true"), step("b", cmd="true")
    scan = scan_config({"x": [a, versioned(2)], "y": output_path_of(b, "f"), "v": versioned({"in": a}), "n": 1})
    assert scan.refs == (("x.0", a, None), ("y", b, "f"), ("v.in", a, None))
    assert [p for p, _ in scan.marked] == ["x.1", "v"]
    assert scan_config(3).refs == () and scan_config({"n": 1}).marked == ()


def test_a_set_holding_references_is_refused() -> None:
    a = step("a", cmd="true")
    with pytest.raises(StepDefinitionError, match="is a set holding step references"):
        scan_config({"s": {a}})


def test_a_circular_config_is_one_clear_error() -> None:
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(StepDefinitionError, match="nested too deeply"):
        scan_config({"x": loop, "v": versioned(1)})


def test_step_subclass_is_still_a_step() -> None:
    class Special(Step):
        pass

    s = Special("special")
    assert scan_config({"s": s}).refs == (("s", s, None),)
