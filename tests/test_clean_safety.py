"""``clean`` removes this Marinfile's step folders under the prefix, and nothing else.

Each test is a reproduction: real runners, real folders beside and inside the prefix,
symlinks, another project's outputs in a shared prefix, and the real command line.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from marinbuild.removal import containment_problem

from .helpers import (
    marinbuild,
    marinbuild_in_process,
    snapshot,
    start_marinbuild,
    status_of,
    wait_dead,
    wait_for_text,
    write_marinfile,
)

LEASE_ENV = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}

TRAIN = """
from marinbuild import step, versioned
step("train", cmd=(
    "echo $$ > {started}; echo first > {{output}}/ckpt; "
    "while [ ! -e {gate} ]; do sleep 0.05; done; echo second >> {{output}}/ckpt"
), config={{"v": versioned({version})}})
"""


def _train(project: Path, version: int = 1) -> Path:
    """A step that runs until the test opens its gate (``started.with_suffix('.gate')``)."""
    started = project.parent / "train.started"
    write_marinfile(project, TRAIN.format(started=started, gate=_gate(started), version=version))
    return started


def _gate(started: Path) -> Path:
    return started.with_suffix(".gate")


def test_clean_leaves_a_step_running_under_a_live_lease_alone(project: Path) -> None:
    started = _train(project)
    runner = start_marinbuild("run", cwd=project, env=LEASE_ENV)
    try:
        wait_for_text(started)
        (out,) = (project / "marinbuild-out").glob("train-*")
        status = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)
        assert status[0]["status"] == "RUNNING" and status[0]["lease"] is not None

        result = marinbuild_in_process("clean", "train", "--yes", cwd=project, env=LEASE_ENV)
        assert result.returncode == 0, result.stderr
        assert f"leaving {out} alone: it is running, leased by " in result.stderr
        assert (out / ".marinbuild" / "lease").exists() and (out / "ckpt").exists()

        # The first runner finishes undisturbed, and nobody else ran the step meanwhile.
        _gate(started).touch()
        stdout, stderr = runner.communicate(timeout=60)
        assert runner.returncode == 0, stdout + stderr
        assert (out / "ckpt").read_text() == "first\nsecond\n"
        assert status_of(str(out))["status"] == "SUCCESS"  # type: ignore[index]
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()

    # Finished, nothing holds it: now clean removes it, lease and all.
    result = marinbuild_in_process("clean", "train", "--yes", cwd=project)
    assert result.returncode == 0 and not out.exists(), result.stderr


def test_clean_force_removes_a_running_step(project: Path) -> None:
    started = _train(project)
    runner = start_marinbuild("run", cwd=project, env=LEASE_ENV)
    try:
        first_pid = int(wait_for_text(started))
        result = marinbuild_in_process("clean", "train", "--yes", "--force", cwd=project)
        assert result.returncode == 0 and "removed 1 output(s)" in result.stdout, result.stderr
        # The runner finds its lease gone and stops that attempt (it then starts the step afresh).
        assert wait_dead(first_pid, 30)
    finally:
        runner.send_signal(signal.SIGTERM)
        stdout, _ = runner.communicate(timeout=60)
    assert "lease lost" in stdout, stdout


def test_clean_takes_over_the_lease_of_a_runner_that_died(project: Path) -> None:
    started = _train(project)
    runner = start_marinbuild("run", cwd=project, env=LEASE_ENV)
    wait_for_text(started)
    (out,) = (project / "marinbuild-out").glob("train-*")
    runner.kill()
    runner.wait()
    result = marinbuild_in_process("clean", "train", "--yes", cwd=project)
    assert result.returncode == 0 and not out.exists(), result.stderr


@pytest.mark.parametrize(
    "path, prefix, problem",
    [
        ("/p/out/../outside", "/p/out", "outside the prefix"),
        ("/p/out/sub/..", "/p/out", "the prefix itself"),
        ("/p/out", "/p/out", "the prefix itself"),
        ("/p/outer/a-0123456789abcdef", "/p/out", "outside the prefix"),
        ("/p/out/a/../b-0123456789abcdef", "/p/out", None),
        ("gs://bucket/x/../../y", "gs://bucket/x", "outside the prefix"),
        ("gs://bucket/x/a-0123456789abcdef", "gs://bucket/x", None),
        ("memory://bucket/x/a", "gs://bucket/x", "outside the prefix"),
    ],
)
def test_containment_is_judged_on_normalized_paths(path: str, prefix: str, problem: str | None) -> None:
    found = containment_problem(path, prefix)
    assert (found is None) if problem is None else (found is not None and problem in found)


OVERRIDES = """
from marinbuild import step
step("c", cmd="true", override_output_path="sub/..")
step("d", cmd="true", override_output_path="../outside")
step("e", cmd="true", override_output_path="../marinbuild-out-sibling/e")
"""


def test_clean_never_reaches_outside_the_prefix_through_an_override(project: Path) -> None:
    prefix = project / "marinbuild-out"
    (prefix / "keep-0123456789abcdef" / ".marinbuild").mkdir(parents=True)
    (prefix / "keep-0123456789abcdef" / "data").write_text("other work")
    (project / "outside").mkdir()
    (project / "outside" / "precious").write_text("not ours")
    (project / "marinbuild-out-sibling" / "e").mkdir(parents=True)
    write_marinfile(project, OVERRIDES)
    before = snapshot(project.parent)
    result = marinbuild_in_process("clean", "c", "d", "e", "--yes", cwd=project)
    assert "internal error" not in result.stderr
    # Either the plan refuses the overrides, or clean leaves each of them alone by name.
    if result.returncode == 0:
        for path in ("marinbuild-out/sub/..", "marinbuild-out/../outside", "marinbuild-out/../marinbuild-out-sibling/e"):
            assert f"leaving {project / path} alone" in result.stderr, result.stderr
    else:
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert snapshot(project.parent) == before


def test_clean_does_not_remove_a_step_folder_that_is_a_symlink(project: Path, tmp_path: Path) -> None:
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='echo a > {output}/a.txt')\n")
    assert marinbuild("run", cwd=project).returncode == 0
    (out,) = (project / "marinbuild-out").glob("a-*")
    elsewhere = tmp_path / "elsewhere"
    out.rename(elsewhere)
    out.symlink_to(elsewhere)
    before = snapshot(elsewhere)
    result = marinbuild_in_process("clean", "a", "--yes", cwd=project)
    assert f"leaving {out} alone: it is reached through a symlink" in result.stderr, result.stderr
    assert snapshot(elsewhere) == before and out.is_symlink()


def _other_project(tmp_path: Path, prefix: Path, body: str) -> Path:
    other = tmp_path / "other"
    other.mkdir()
    write_marinfile(other, body)
    result = marinbuild("run", "--prefix", str(prefix), cwd=other)
    assert result.returncode == 0, result.stderr
    return other


STEP_X = """
from marinbuild import step, versioned
step("x", cmd="echo {{output}} > {{output}}/x.txt", config={{"v": versioned({v})}})
"""


def test_orphans_are_only_this_marinfiles_old_outputs(project: Path, tmp_path: Path) -> None:
    prefix = project / "marinbuild-out"
    # This project: x at version 1 (to become an orphan) and version 2 (current).
    write_marinfile(project, STEP_X.format(v=1))
    assert marinbuild("run", cwd=project).returncode == 0
    (old,) = prefix.glob("x-*")
    write_marinfile(project, STEP_X.format(v=2))
    assert marinbuild("run", cwd=project).returncode == 0
    (current,) = [p for p in prefix.glob("x-*") if p != old]
    # Another Marinfile in the same prefix: its own step y, and a step also named x.
    other = _other_project(tmp_path, prefix, STEP_X.format(v=3) + 'step("y", cmd="true")\n')
    theirs = {p for p in prefix.iterdir()} - {old, current}
    assert len(theirs) == 2
    # A symlink inside the prefix to a third project's outputs, and a deep folder.
    third = tmp_path / "third-out" / "x-0123456789abcdef"
    (third / ".marinbuild").mkdir(parents=True)
    (prefix / "link").symlink_to(third.parent)
    deep = prefix.joinpath(*[f"d{i}" for i in range(18)], "x-fedcba9876543210")
    (deep / ".marinbuild").mkdir(parents=True)
    before = {p: snapshot(p) for p in (third.parent, deep, *theirs)}

    dry = marinbuild_in_process("clean", "--orphans", "--dry", cwd=project)
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.strip().splitlines() == [f"would remove {old}"]
    (their_x,) = [p for p in theirs if p.name.startswith("x-")]
    assert f"leaving {their_x} alone: it was written from {other / 'Marinfile.py'}" in dry.stderr

    result = marinbuild_in_process("clean", "--orphans", "--yes", cwd=project)
    assert result.returncode == 0, result.stderr
    assert not old.exists() and current.exists()
    assert {p: snapshot(p) for p in before} == before  # theirs, the symlink's target, the deep folder

    # --any-orphans widens to every NAME-HASH output, but still follows no link and stays shallow.
    wide = marinbuild_in_process("clean", "--any-orphans", "--yes", cwd=project)
    assert wide.returncode == 0, wide.stderr
    assert not any(p.exists() for p in theirs) and current.exists()
    assert snapshot(third.parent) == before[third.parent] and snapshot(deep) == before[deep]


def test_orphans_running_under_a_live_lease_are_left_alone(project: Path, tmp_path: Path) -> None:
    prefix = project / "marinbuild-out"
    other = tmp_path / "other"
    other.mkdir()
    started = _train(other)
    runner = start_marinbuild("run", "--prefix", str(prefix), cwd=other, env=LEASE_ENV)
    try:
        wait_for_text(started)
        (theirs,) = prefix.glob("train-*")
        write_marinfile(project, "from marinbuild import step\nstep('mine', cmd='true')\n")
        result = marinbuild_in_process("clean", "--any-orphans", "--yes", cwd=project)
        assert result.returncode == 0, result.stderr
        assert f"leaving {theirs} alone: it is running, leased by " in result.stderr
        assert (theirs / ".marinbuild" / "lease").exists()
        _gate(started).touch()
        stdout, stderr = runner.communicate(timeout=60)
        assert runner.returncode == 0, stdout + stderr
        assert (theirs / "ckpt").read_text() == "first\nsecond\n"
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.wait()


@pytest.mark.parametrize("root", ["/", "file:///", "//", "/.."])
@pytest.mark.parametrize("command", [["run"], ["plan"], ["status"], ["clean", "--orphans", "--yes"], ["why", "a"]])
def test_a_filesystem_root_is_refused_as_a_prefix(project: Path, root: str, command: list[str]) -> None:
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='true')\n")
    before = set(os.listdir("/"))
    result = marinbuild_in_process(*command, "--prefix", root, cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "is a filesystem root" in lines[0], result.stderr
    assert set(os.listdir("/")) == before


def test_marin_prefix_set_to_the_root_is_refused(project: Path) -> None:
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='true')\n")
    result = marinbuild("run", cwd=project, env={"MARIN_PREFIX": "/"})
    assert result.returncode == 2 and "is a filesystem root" in result.stderr
    assert not any(name.startswith("a-") for name in os.listdir("/"))


def test_clean_of_a_target_leaves_a_folder_holding_another_identity_alone(project: Path) -> None:
    write_marinfile(project, 'from marinbuild import step\nstep("one", cmd="true", override_output_path="shared")\n')
    assert marinbuild("run", cwd=project).returncode == 0
    shared = project / "marinbuild-out" / "shared"
    write_marinfile(project, 'from marinbuild import step\nstep("two", cmd="true", override_output_path="shared")\n')
    before = snapshot(shared)
    result = marinbuild_in_process("clean", "two", "--yes", cwd=project)
    assert result.returncode == 0 and f"leaving {shared} alone: it holds the SUCCESS of one" in result.stderr
    assert snapshot(shared) == before
