"""An absolute ``override_output_path`` outside the prefix is used verbatim, as Marin's executor
uses it (``test_shared_absolute_override_used_verbatim``: a dataset pinned in another bucket),
and ``clean`` never deletes it unless the step is named with ``--outside-prefix``."""

from __future__ import annotations

import json

import pytest

from marinbuild.errors import StepDefinitionError
from marinbuild.graph import build_graph
from marinbuild.steps import step, this_output_path

from .helpers import marinbuild, marinbuild_in_process, status_of, write_marinfile


def _noop(cfg: object) -> None:
    pass


@pytest.mark.parametrize("under", ["", "out"])
def test_shared_absolute_override_used_verbatim(tmp_path, under):
    prefix = str(tmp_path / under) if under else str(tmp_path)
    absolute = str(tmp_path / "elsewhere" / "pinned")
    train = step("train", _noop, {"output_path": this_output_path()}, override_output_path=absolute)
    assert build_graph([train], prefix).nodes["train"].output_path == absolute


@pytest.mark.parametrize("override", ["../elsewhere", "sub/../../elsewhere", "/elsewhere/../x", "/"])
def test_dot_dot_and_escapes_are_still_refused(tmp_path, override):
    s = step("s", _noop, {}, override_output_path=override)
    with pytest.raises(StepDefinitionError):
        build_graph([s], str(tmp_path / "out"))


MARINFILE = """
from marinbuild import step
tok = step("tok", cmd="echo tokens > {{output}}/data.txt", override_output_path={pinned!r})
train = step("train", cmd="cat {{tok}}/data.txt > {{output}}/model.txt", config={{"tok": tok}})
"""


@pytest.fixture
def shared(project, tmp_path):
    pinned = tmp_path / "shared-bucket" / "tokenized"
    write_marinfile(project, MARINFILE.format(pinned=str(pinned)))
    ran = marinbuild("run", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return pinned


def test_a_step_runs_into_its_pinned_folder_and_is_up_to_date_there(project, shared):
    assert (shared / "data.txt").read_text() == "tokens\n"
    assert status_of(str(shared))["status"] == "SUCCESS"
    rows = {r["name"]: r for r in json.loads(marinbuild_in_process("plan", "--json", cwd=project).stdout)}
    assert rows["tok"]["output_path"] == str(shared) and rows["tok"]["action"] == "skip"
    model = next((project / "marinbuild-out").glob("train-*/model.txt"))
    assert model.read_text() == "tokens\n"


def test_clean_leaves_an_output_outside_the_prefix_alone_unless_named_with_the_flag(project, shared):
    lookalike = shared.parent / "tok-0123456789abcdef" / ".marinbuild"  # orphan-shaped, outside the prefix
    lookalike.mkdir(parents=True)
    for args in (["clean", "--yes"], ["clean", "tok", "--yes"], ["clean", "--orphans", "--yes"],
                 ["clean", "--any-orphans", "--yes"]):
        result = marinbuild_in_process(*args, cwd=project)
        assert result.returncode == 0, result.stdout + result.stderr
        assert (shared / "data.txt").is_file() and lookalike.is_dir(), args
        assert "shared-bucket" not in result.stdout, (args, result.stdout)
        if "tok" in args or args == ["clean", "--yes"]:
            assert f"leaving {shared} alone: it is outside the prefix (name the step 'tok' with --outside-prefix" in result.stderr
    for args in (["clean", "--outside-prefix", "--yes"], ["clean", "t*", "--outside-prefix", "--yes"],
                 ["clean", "--orphans", "--outside-prefix", "--yes"]):
        refused = marinbuild_in_process(*args, cwd=project)
        assert refused.returncode == 2, args
        assert "--outside-prefix removes the outputs of steps named exactly" in refused.stderr
        assert (shared / "data.txt").is_file()
    removed = marinbuild_in_process("clean", "tok", "--outside-prefix", "--yes", cwd=project)
    assert removed.returncode == 0, removed.stderr
    assert f"remove {shared}" in removed.stdout and not shared.exists()
    assert lookalike.is_dir() and shared.parent.is_dir()  # only the step's own folder went
