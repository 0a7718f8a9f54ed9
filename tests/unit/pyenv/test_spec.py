"""Unit tests of marinbuild.pyenv.spec: a step's pip_dependency_groups made into requirements."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from marinbuild.errors import StepDefinitionError
from marinbuild.pyenv.spec import checked_requirement, environment_of, expand_groups, find_pyproject, load_extras

PYPROJECT = """
[project]
name = "My_Proj"
[project.optional-dependencies]
rl = ["numpy>=2", "gym==0.26"]
Eval_Tools = ["my-proj[rl]", "scipy"]
"""


@pytest.fixture
def pyproject(tmp_path: Path) -> str:
    path = tmp_path / "pyproject.toml"
    path.write_text(textwrap.dedent(PYPROJECT))
    (tmp_path / "sub" / "deeper").mkdir(parents=True)
    return str(path)


def test_find_pyproject_walks_up(pyproject: str, tmp_path: Path) -> None:
    assert find_pyproject(str(tmp_path / "sub" / "deeper")) == pyproject


def test_extras_and_project_name_are_normalized(pyproject: str) -> None:
    name, extras = load_extras(pyproject)
    assert name == "my-proj" and set(extras) == {"rl", "eval-tools"}
    assert load_extras(None) == (None, {})


def test_groups_expand_through_extras_of_the_project_itself(pyproject: str) -> None:
    assert expand_groups("s", ["eval_tools"], pyproject) == ("gym==0.26", "numpy>=2", "scipy")
    assert expand_groups("s", ["rl", "torch>=2"], pyproject) == ("gym==0.26", "numpy>=2", "torch>=2")


def test_an_unknown_bare_name_is_an_error_naming_the_extras(pyproject: str) -> None:
    with pytest.raises(StepDefinitionError, match=r"'torch' is not an extra of .*\(extras: eval-tools, rl\)"):
        expand_groups("s", ["torch"], pyproject)
    with pytest.raises(StepDefinitionError, match=r"no pyproject\.toml"):
        expand_groups("s", ["rl"], None)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [("-r /etc/passwd", "installer option"), ("numpy\n--index-url x", "line break"), ("numpy>=>2", "not a PEP 508")],
)
def test_entries_that_are_not_one_requirement(entry: str, problem: str) -> None:
    with pytest.raises(StepDefinitionError, match=problem):
        checked_requirement(entry, "step 's': ")


def test_environment_of_a_step(pyproject: str, tmp_path: Path) -> None:
    marinfile = str(tmp_path / "sub" / "Marinfile.py")
    assert environment_of("s", [], marinfile) is None
    env = environment_of("s", ["rl"], marinfile)
    assert env is not None and env.requirements == ("gym==0.26", "numpy>=2") and env.groups == ("rl",)
    assert env.short == env.key[:12] and env.python
    assert env.to_json()["requirements"] == ["gym==0.26", "numpy>=2"]
    assert environment_of("t", ["numpy>=2", "gym==0.26"], marinfile).key == env.key  # type: ignore[union-attr]
    assert environment_of("t", ["numpy>=3"], marinfile).key != env.key  # type: ignore[union-attr]


def test_a_broken_pyproject_is_one_clear_error(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[project\n")
    with pytest.raises(StepDefinitionError, match="cannot read"):
        expand_groups("s", ["rl"], str(tmp_path / "pyproject.toml"))
