"""Another team's outputs on a read-only filesystem: the commands that only read work there,
``plan`` notes that ``run`` could not write, ``run`` and ``clean`` refuse in one line, and a
prefix that is a file stays an error everywhere.

The read-only filesystem is real (a tmpfs remounted read-only): root ignores permission bits,
not ``EROFS``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from .fixtures_mounts import tmpfs_at
from .helpers import marinbuild, marinbuild_in_process, snapshot, write_marinfile

MARINFILE = """
from marinbuild import step
a = step("a", cmd="echo a; echo a > {output}/out.txt")
b = step("b", cmd="cat {a}/out.txt > {output}/out.txt", config={"a": a})
c = step("c", cmd="echo never > {output}/out.txt")
"""


@pytest.fixture(scope="module")
def read_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A project and its prefix where ``a`` and ``b`` ran (``c`` did not), then made read-only.

    Made once for the module: nothing can change a read-only prefix, and each test that runs
    a command there checks that nothing did.
    """
    folder = tmp_path_factory.mktemp("read-only")
    project = folder / "project"
    project.mkdir()
    write_marinfile(project, MARINFILE)
    with tmpfs_at(folder / "small-fs") as fs:
        prefix = fs.path / "out"
        assert marinbuild("run", "a", "b", "--prefix", str(prefix), cwd=project).returncode == 0
        fs.remount_read_only()
        yield project, prefix


@pytest.mark.parametrize(
    "args",
    [["plan"], ["plan", "--json"], ["status"], ["status", "--json"], ["show"], ["show", "--csv"], ["why", "b"],
     ["logs", "a"], ["run", "-n"]],
)
def test_commands_that_only_read_work_on_a_read_only_prefix(read_only, args):
    project, read_only_prefix = read_only
    before = snapshot(read_only_prefix)
    result = marinbuild_in_process(*args, "--prefix", str(read_only_prefix), cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "not writable" not in result.stdout and "error" not in result.stderr
    assert snapshot(read_only_prefix) == before


def test_plan_and_status_tell_the_stored_state_and_plan_notes_that_run_could_not_write(read_only):
    project, read_only_prefix = read_only
    plan = marinbuild_in_process("plan", "--prefix", str(read_only_prefix), cwd=project)
    assert plan.returncode == 0, plan.stderr
    assert f"marinbuild: note: `run` could not write there: prefix '{read_only_prefix}' is on a read-only filesystem" in plan.stderr
    rows = json.loads(marinbuild_in_process("plan", "--json", "--prefix", str(read_only_prefix), cwd=project).stdout)
    assert {r["name"]: r["action"] for r in rows} == {"a": "skip", "b": "skip", "c": "run"}
    status = json.loads(marinbuild_in_process("status", "--json", "--prefix", str(read_only_prefix),
                                              cwd=project).stdout)
    assert {r["name"]: r["status"] for r in status} == {"a": "SUCCESS", "b": "SUCCESS", "c": "NONE"}
    report = marinbuild_in_process("report", "-o", str(project / "report.html"), "--prefix", str(read_only_prefix),
                                   cwd=project)
    assert report.returncode == 0, report.stderr
    assert (project / "report.html").is_file()


@pytest.mark.parametrize("args", [["run"], ["run", "a"], ["clean", "--yes"], ["clean", "--yes", "--force", "a"]])
def test_run_and_clean_refuse_a_read_only_prefix_in_one_line(read_only, args):
    project, read_only_prefix = read_only
    before = snapshot(read_only_prefix)
    result = marinbuild_in_process(*args, "--prefix", str(read_only_prefix), cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == f"marinbuild: error: prefix '{read_only_prefix}' is on a read-only filesystem (in {read_only_prefix})"
    assert snapshot(read_only_prefix) == before


@pytest.mark.parametrize("command", ["plan", "status", "show", "report", "why", "run", "clean"])
def test_a_prefix_that_is_a_file_is_an_error_everywhere(project, command):
    write_marinfile(project, MARINFILE)
    (project / "a-file").write_text("not a folder")
    args = {"why": ["why", "a"], "report": ["report", "-o", str(project / "r.html")], "clean": ["clean", "--yes"]}
    result = marinbuild_in_process(*args.get(command, [command]), "--prefix", str(project / "a-file"), cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line == f"marinbuild: error: prefix '{project / 'a-file'}' is not a folder; give a folder for the outputs"
