"""A forced rerun killed while it moves the earlier output aside: one earlier output, one folder, all named.

The reproduction: a finished step with 20,000 files, a forced rerun SIGKILLed while those
files are being moved into ``.marinbuild/aside-*``, then a run that fails. Before, the rest
of the files went to a second aside folder and the failure named only that one.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import sys
from pathlib import Path

from .helpers import marinbuild, plan_json, start_marinbuild, write_marinfile

FILES = 20_000

MANY = """
from marinbuild import step
step("a", cmd="if [ -e {fail} ]; then exit 3; fi; {python} {make}")
"""

MAKE = """
import os
out = os.environ["MARINBUILD_OUTPUT"]
for i in range({files}):
    open(os.path.join(out, f"f{{i}}"), "w").close()
"""


def _aside_folders(out: Path) -> list[Path]:
    return sorted(p for p in (out / ".marinbuild").iterdir() if p.name.startswith("aside-"))


def _kill_during_the_set_aside(project: Path, out: Path) -> bool:
    """Start a forced rerun and SIGKILL it once its aside folder holds some files but not all."""
    runner = start_marinbuild("run", "--force", "a", cwd=project)
    try:
        while runner.poll() is None:
            folders = _aside_folders(out)
            if folders and any(folders[-1].iterdir()):
                os.kill(runner.pid, signal.SIGKILL)
                break
    finally:
        runner.kill()
        runner.communicate(timeout=60)
    left = [p for p in out.iterdir() if p.name.startswith("f")]
    return bool(left) and bool(_aside_folders(out))


def test_an_interrupted_set_aside_goes_on_in_its_own_folder_and_a_failure_names_every_one(project: Path) -> None:
    fail = project / "fail"
    make = project.parent / "make.py"
    make.write_text(MAKE.format(files=FILES))
    write_marinfile(project, MANY.format(fail=fail, python=sys.executable, make=make))
    out = Path(plan_json(project)["a"]["output_path"])
    for _ in range(10):  # a loaded machine may finish the moves before the kill lands: again
        assert marinbuild("run", "-F", cwd=project, timeout=300).returncode == 0
        for folder in _aside_folders(out):  # a rerun that succeeded removed its own; any other goes
            shutil.rmtree(folder)
        fail.touch()
        if _kill_during_the_set_aside(project, out):
            break
        fail.unlink()
    else:
        raise AssertionError("the set-aside was never caught halfway")

    result = marinbuild("run", cwd=project, timeout=300)
    text = result.stdout + result.stderr
    assert result.returncode == 1, text
    (kept,) = {m.group(1) for m in re.finditer(r"its earlier output is kept in (.+?)(?:$|\n)", text)}
    named = [Path(p) for p in re.split(r", | and ", kept)]
    holding = [p for p in _aside_folders(out) if any(p.iterdir())]
    assert sorted(named) == holding, text
    assert sum(len(os.listdir(p)) for p in named) == FILES
    assert len(holding) == 1  # the interrupted move went on where it had begun
