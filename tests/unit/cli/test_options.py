"""Options shared by the commands: completing step names, targets given as output paths."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from marinbuild.cli.options import complete_steps, step_targets
from marinbuild.project import open_project

MARINFILE = """
from marinbuild import step, versioned
print("loading")
d = step("data", cmd="true", config={"n": versioned(1)})
step("train/a", cmd="true", config={"d": d})
step("train/b", cmd="true", config={"d": d})
"""


def _ctx(file: str) -> typer.Context:
    import click

    ctx = typer.Context(click.Command("run"))
    ctx.params["file"] = file
    return ctx


def test_completion_offers_the_step_names_that_begin_with_what_is_typed(tmp_path: Path, capsys) -> None:
    (tmp_path / "Marinfile.py").write_text(MARINFILE)
    file = str(tmp_path / "Marinfile.py")
    assert complete_steps(_ctx(file), "train/") == ["train/a", "train/b"]
    assert complete_steps(_ctx(file), "") == ["data", "train/a", "train/b"]
    assert capsys.readouterr().out == ""  # what the Marinfile printed is not a completion
    (tmp_path / "Bad.py").write_text("raise RuntimeError('no')\n")
    assert complete_steps(_ctx(str(tmp_path / "Bad.py")), "") == []
    assert complete_steps(_ctx(str(tmp_path / "missing.py")), "") == []


def test_an_output_path_or_a_file_inside_one_names_its_step(tmp_path: Path) -> None:
    (tmp_path / "Marinfile.py").write_text(MARINFILE)
    project = open_project(str(tmp_path / "Marinfile.py"), str(tmp_path / "out"))
    out = project.graph.nodes["train/a"].output_path
    assert step_targets(project, [out, os.path.join(out, "model.bin"), "train/*"]) == ["train/a", "train/a", "train/*"]
