"""The step API: names, placeholders, command templates."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from marinbuild import output_path_of, step, this_output_path, versioned
from marinbuild.errors import StepDefinitionError
from marinbuild.graph import build_graph
from marinbuild.resolve import render_command, resolve_config
from marinbuild.steps import collect_declared

from .helpers import marinbuild, write_marinfile


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
