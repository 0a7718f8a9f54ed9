"""Unit tests of marinbuild.steps: declaring steps, placeholders, and the one scan of a config."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import Any

import pytest

from marinbuild import output_path_of, step, this_output_path, versioned
from marinbuild.errors import StepDefinitionError, UserError
from marinbuild.graph import build_graph
from marinbuild.resolve import render_command, resolve_config
from marinbuild.steps import Step, collect_declared, declaring, mirrored, scan_config
from tests.helpers import marinbuild, write_marinfile


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


# -- The step API: names, placeholders, command templates.


@pytest.mark.parametrize("name", ["", "/abs", "a/../b", "..", "a//b", "has space", "glob*"])
def test_bad_names_are_refused(name):
    with pytest.raises(StepDefinitionError):
        step(name, cmd="true")


def test_step_needs_exactly_one_of_fn_and_cmd():
    with pytest.raises(StepDefinitionError):
        step("x")
    with pytest.raises(StepDefinitionError):
        step("x", fn=print, cmd="true")


def test_declared_steps_are_collected_in_order():
    with collect_declared() as declared:
        a = step("a", cmd="true")
        b = step("b", cmd="true", config={"a": a})
    assert declared == [a, b]


@dataclass(frozen=True)
class Inner:
    path: object
    n: object


def test_placeholders_resolve_through_nesting():
    a = step("a", cmd="true")
    cfg = {"x": [Inner(path=output_path_of(a, "f.txt"), n=versioned(3))], "me": this_output_path("m"), "t": (a,)}
    resolved = resolve_config(cfg, "/out/me", {"a": "/out/a"})
    assert resolved == {"x": [Inner(path="/out/a/f.txt", n=3)], "me": "/out/me/m", "t": ("/out/a",)}


def test_command_values_are_shell_quoted_and_lists_expanded():
    cmd = render_command("run {args} --name {name} --out {output}", {"args": ["a b", "$(x)"], "name": "it's"}, "/o p")
    assert cmd == "run 'a b' '$(x)' --name 'it'\"'\"'s' --out '/o p'"


def test_command_template_missing_key_is_a_definition_error():
    s = step("s", cmd="echo {missing}", config={"present": 1})
    with pytest.raises(StepDefinitionError, match="missing"):
        build_graph([s], "/p")


def test_references_make_dependencies_and_unreferenced_steps_are_reached():
    hidden = step("hidden", cmd="true")
    top = step("top", fn=print, config={"in": [hidden]})
    g = build_graph([top], "/p")
    assert set(g.nodes) == {"hidden", "top"}
    assert g.nodes["top"].deps == ("hidden",)
    assert g.order.index("hidden") < g.order.index("top")


def test_identical_steps_merge_and_different_ones_with_one_name_are_refused():
    a1 = step("a", cmd="true", config={"n": versioned(1)})
    a2 = step("a", cmd="true", config={"n": versioned(1)})
    g = build_graph([a1, a2, step("b", cmd="true", config={"x": a2})], "/p")
    assert len(g.nodes) == 2
    a3 = step("a", cmd="true", config={"n": versioned(2)})
    with pytest.raises(StepDefinitionError, match="two different steps"):
        build_graph([a1, a3], "/p")


def test_step_fills_every_field_like_the_dataclass_constructor():
    from dataclasses import fields

    from marinbuild.steps import Step

    made = step("s", cmd="echo {n} > {output}/x", config={"n": 1}, env={"B": "2", "A": "1"}, fresh_output=True)
    direct = Step(name="s", cmd="echo {n} > {output}/x", config={"n": 1}, env=(("A", "1"), ("B", "2")), fresh_output=True)
    assert set(vars(made)) == {f.name for f in fields(Step)}
    assert vars(made) == vars(direct)
    with pytest.raises(AttributeError):
        made.name = "other"  # type: ignore[misc]


def test_config_scan_finds_references_and_versioned_values_in_config_order():
    from marinbuild.steps import scan_config

    a, b, c = (step(n, cmd="true") for n in "abc")
    cfg = {
        "first": [a, {"inner": output_path_of(b, "f")}],
        "v": versioned({"ref": c, "n": 1}),
        "dc": Inner(path=c, n=versioned(2)),
        "plain": {"k": 1, "s": "x"},
    }
    scan = scan_config(cfg)
    assert scan.refs == (("first.0", a, None), ("first.1.inner", b, "f"), ("v.ref", c, None), ("dc.path", c, None))
    assert [path for path, _ in scan.marked] == ["v", "dc.n"]
    assert scan_config({"n": 1, "s": [1, "x"]}).refs == () and scan_config(None).marked == ()


def test_a_config_nested_beyond_walking_is_one_clear_error():
    deep: list = []
    for _ in range(100_000):
        deep = [deep, step("leaf", cmd="true")]
    s = step("s", cmd="true", config={"deep": deep})
    with pytest.raises(StepDefinitionError, match="nested too deeply"):
        build_graph([s], "/p")


def test_a_nul_byte_in_a_shell_steps_config_fails_that_step_alone(tmp_path):
    write_marinfile(tmp_path, """
        from marinbuild import step
        step("bad", cmd="echo {v} > {output}/x", config={"v": "a\\0b"})
        step("fine", cmd="echo ok > {output}/x")
    """)
    result = marinbuild("run", "-k", "--prefix", "out", cwd=tmp_path)
    assert result.returncode == 1
    assert "bad: step 'bad': the command holds a NUL byte (config field 'v')" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    import marinbuild as library

    after = library.plan(file=str(tmp_path / "Marinfile.py"), prefix=str(tmp_path / "out"))
    assert after.decisions["fine"].action.value == "skip"  # it ran and succeeded
    assert after.decisions["bad"].reason.startswith("failed before: step 'bad': the command holds a NUL byte")


@pytest.mark.parametrize(
    "marinfile, expected",
    [
        ('step("bad\\0name", cmd="true")', "must not contain control characters"),
        ('step("s", cmd="echo {v!r}", config={"v": "x"})', "{v!r}: conversions (!r, !s, !a) would bypass shell quoting"),
        ('step("s", cmd="echo {v._value}", config={"v": "x"})', "{v._value}: attribute access is not allowed"),
        ('step("s", cmd="true", override_output_path="../outside")', "must stay inside the prefix (no '..')"),
        ('step("a", cmd="true", override_output_path="same")\nstep("b", cmd="true", override_output_path="same")',
         "steps 'a' and 'b' both write to"),
    ],
)
def test_bad_steps_fail_the_plan_with_one_line_and_write_nothing(tmp_path, marinfile, expected):
    write_marinfile(tmp_path, "from marinbuild import step\n" + marinfile + "\n")
    for command in ("plan", "run"):
        result = marinbuild(command, "--prefix", "out", cwd=tmp_path)
        assert result.returncode == 2, result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "outside").exists()
