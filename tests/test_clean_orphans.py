"""``clean --orphans`` knows this Marinfile's own past steps: renamed sweep points are its orphans, nobody else's.

Two real projects share one prefix, each with a sweep under ``train/``; one drops a point
from its sweep and renames a step. (Each sweep reads its own data, so the two projects'
points are distinct outputs: a step of the same identity would be one shared output.) Its ``clean --orphans`` removes exactly its own old
outputs; the other project's outputs, same step names included, stay until
``--any-orphans``.
"""

from __future__ import annotations

from pathlib import Path

from .helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

SWEEP = """
from marinbuild import step, versioned

points = [step(f"train/lr{{lr}}", cmd="echo {{lr}} > {{output}}/w", config={{"lr": versioned(lr), "data": versioned({data!r})}})
          for lr in {lrs}]
step("{final}", cmd="cat {{points}} > {{output}}/all", config={{"points": points}})
"""


def _project(root: Path, name: str, lrs: tuple[float, ...], final: str = "eval") -> Path:
    folder = root / name
    folder.mkdir()
    write_marinfile(folder, SWEEP.format(lrs=lrs, final=final, data=name).replace(
        "cat {points}", "for p in {points}; do cat $p/w; done"))
    return folder


def _outputs(folder: Path, prefix: Path) -> set[str]:
    return {row["output_path"] for row in plan_json(folder, "--prefix", str(prefix)).values()}


def _ok(folder: Path, *args: str) -> str:
    # clean reads its answer in this process; the runs stay fresh processes.
    result = (marinbuild_in_process if args[0] == "clean" else marinbuild)(*args, cwd=folder)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_renamed_sweep_points_are_orphans_of_their_own_marinfile_only(tmp_path: Path) -> None:
    prefix = tmp_path / "shared"
    mine = _project(tmp_path, "mine", (0.001, 0.003))
    theirs = _project(tmp_path, "theirs", (0.003, 0.01))
    _ok(mine, "run", "-q", "--prefix", str(prefix))
    _ok(theirs, "run", "-q", "--prefix", str(prefix))
    old_mine = _outputs(mine, prefix)
    their_outputs = _outputs(theirs, prefix)

    # The sweep drops 0.003 and the final step is renamed: neither name is declared any more.
    write_marinfile(mine, SWEEP.format(lrs=(0.001,), final="evaluate", data="mine").replace(
        "cat {points}", "for p in {points}; do cat $p/w; done"))
    _ok(mine, "run", "-q", "--prefix", str(prefix))
    current = _outputs(mine, prefix)
    gone = old_mine - current
    assert {Path(p).name.rsplit("-", 1)[0] for p in gone} == {"lr0.003", "eval"}

    listed = _ok(mine, "clean", "--orphans", "-n", "--prefix", str(prefix))
    for path in gone:
        assert path in listed
    for path in their_outputs:
        assert path not in listed.replace("leaving " + path, "")  # named at most as left alone

    _ok(mine, "clean", "--orphans", "--yes", "--prefix", str(prefix))
    assert not any(Path(p).exists() for p in gone)
    assert all(Path(p).exists() for p in current | their_outputs)

    # Other Marinfiles' outputs go only with --any-orphans.
    _ok(mine, "clean", "--any-orphans", "--yes", "--prefix", str(prefix))
    assert all(Path(p).exists() for p in current)
    assert not any(Path(p).exists() for p in their_outputs)
