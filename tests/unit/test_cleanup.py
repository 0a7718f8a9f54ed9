"""Unit tests of marinbuild.cleanup: ``clean`` as calls that choose, then remove, and say what they did."""

from __future__ import annotations

from pathlib import Path

import pytest

from marinbuild.cleanup import choose_outputs, clean_project, remove_outputs
from marinbuild.errors import UserError
from marinbuild.project import project_of_steps
from marinbuild.steps import step, versioned
from marinbuild.store.markers import SUCCESS, write_status
from marinbuild.store.storage import Storage


def _built(tmp_path: Path):
    steps = [step("c/a", cmd="true", config={"n": versioned(1)}), step("c/b", cmd="true")]
    project = project_of_steps(steps, str(tmp_path))
    for name in ("c/a", "c/b"):
        node = project.graph.nodes[name]
        write_status(project.storage, node.output_path, SUCCESS, name=name, identity=node.identity)
        project.storage.write_atomic(Storage.join(node.output_path, "data"), "x")
    return project


def test_a_dry_clean_lists_what_it_would_remove_and_removes_nothing(tmp_path: Path) -> None:
    project = _built(tmp_path)
    paths = tuple(project.graph.nodes[n].output_path for n in ("c/a", "c/b"))
    dry = clean_project(project, dry=True)
    assert dry.removed == () and sorted(dry.would_remove) == sorted(paths)
    assert all(Path(p, "data").exists() for p in paths)
    done = clean_project(project, ["c/a"])
    assert done.removed == (paths[0],) and done.would_remove == () and done.skipped == ()
    assert not Path(paths[0]).exists() and Path(paths[1], "data").exists()


def test_outside_prefix_wants_steps_named_exactly(tmp_path: Path) -> None:
    project = _built(tmp_path)
    with pytest.raises(UserError, match="--outside-prefix removes the outputs of steps named exactly"):
        choose_outputs(project, ["c/*"], outside_prefix=True)
    with pytest.raises(UserError, match="no glob, no --orphans"):
        choose_outputs(project, ["c/a"], orphans=True, outside_prefix=True)


def test_remove_outputs_tells_each_removed_and_each_left_alone(tmp_path: Path) -> None:
    project = _built(tmp_path)
    a = project.graph.nodes["c/a"].output_path
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    told: list[str] = []
    left: list[str] = []
    result = remove_outputs(project.storage, [a, str(link)], on_removed=told.append,
                            on_left=lambda s: left.append(s.path))
    assert told == [a] and result.removed == (a,)
    assert left == [str(link)] and [s.path for s in result.skipped] == [str(link)]
    assert result.skipped[0].line().startswith(f"leaving {link} alone: ")
