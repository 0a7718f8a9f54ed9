"""Nothing outside the prefix is touched through a link: real runs over symlinked output folders.

Each test is a reproduction: a folder beside the prefix (``victim``) full of files, and a
symlink in the place of an output folder, its ``.marinbuild`` folder or a marker. ``run``
(fresh output, forced rerun, plain run) refuses that step in one line and leaves the
victim as it was; ``clean`` follows the same rule.
"""

from __future__ import annotations

import os
from pathlib import Path

from marinbuild.removal import containment_problem
from marinbuild.store.links import link_problem

from .helpers import marinbuild, snapshot, write_marinfile

TWO = """
from marinbuild import step
step("a", cmd="echo new > {output}/data")
step("b", cmd="echo b > {output}/data")
"""


def _victim(project: Path) -> tuple[Path, dict[str, str]]:
    victim = project.parent / "victim"
    victim.mkdir()
    for i in range(5):
        (victim / f"precious-{i}").write_text(f"keep {i}\n")
    (victim / "sub").mkdir()
    (victim / "sub" / "deep").write_text("keep too\n")
    return victim, snapshot(victim)


def _finished(project: Path) -> Path:
    write_marinfile(project, TWO)
    result = marinbuild("run", cwd=project)
    assert result.returncode == 0, result.stderr
    (out,) = (project / "marinbuild-out").glob("a-*")
    return out


def _refused(result, out: Path, what: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    text = result.stdout + result.stderr
    lines = [line for line in text.splitlines() if "never writes through a link" in line]
    assert len({line.split(" ", 1)[1].lstrip() for line in lines}) == 1, text  # one line (the summary repeats it)
    assert f"refusing to write under {out}: {what}" in lines[0], lines[0]
    assert "Traceback" not in result.stderr


def test_a_fresh_output_whose_marker_folder_links_outside_empties_nothing(project: Path) -> None:
    out = _finished(project)
    victim, before = _victim(project)
    os.rename(out / ".marinbuild", project.parent / "moved-markers")
    (out / ".marinbuild").symlink_to(victim)

    result = marinbuild("run", "--fresh-output", "-F", cwd=project)
    _refused(result, out, "its .marinbuild folder is a symlink")
    assert snapshot(victim) == before
    assert (out / "data").read_text() == "new\n"  # the folder itself is left as it was
    # The other step is not held back by the refusal.
    assert "b" in result.stdout + result.stderr


def test_a_forced_rerun_of_an_output_folder_that_is_a_link_moves_nothing_aside(project: Path) -> None:
    out = _finished(project)
    victim, _ = _victim(project)
    for entry in out.iterdir():
        os.rename(entry, victim / entry.name)
    before = snapshot(victim)
    out.rmdir()
    out.symlink_to(victim)

    for args in (("run", "--force", "a"), ("run", "--fresh-output", "-F")):
        result = marinbuild(*args, cwd=project)
        _refused(result, out, "it is reached through a symlink")
        assert snapshot(victim) == before, args
        assert not [p for p in victim.iterdir() if p.name.startswith(".") and p.name != ".marinbuild"]


def test_a_marker_that_is_a_link_is_refused_before_the_lease_is_taken(project: Path) -> None:
    out = _finished(project)
    victim, before = _victim(project)
    target = victim / "precious-0"
    status = out / ".marinbuild" / "status"
    status.unlink()
    status.symlink_to(target)

    result = marinbuild("run", "--force", "a", cwd=project)
    _refused(result, out, "its marker .marinbuild/status is a symlink")
    assert snapshot(victim) == before
    assert not (out / ".marinbuild" / "lease").exists()

    log_dir = out / "logs"
    status.unlink()
    for log in log_dir.iterdir():
        log.unlink()
    (log_dir / "step.log").symlink_to(target)
    result = marinbuild("run", "--force", "a", cwd=project)
    _refused(result, out, "its marker logs/step.log is a symlink")
    assert snapshot(victim) == before


def test_clean_and_run_refuse_the_same_links(project: Path) -> None:
    out = _finished(project)
    victim, before = _victim(project)
    os.rename(out / ".marinbuild", project.parent / "moved-markers")
    (out / ".marinbuild").symlink_to(victim)
    prefix = str(project / "marinbuild-out")
    assert containment_problem(str(out), prefix) == link_problem(str(out), prefix) == "its .marinbuild folder is a symlink"

    result = marinbuild("clean", "a", "--yes", cwd=project)
    assert f"leaving {out} alone: its .marinbuild folder is a symlink" in result.stderr, result.stderr
    assert snapshot(victim) == before and out.is_dir()
    result = marinbuild("clean", "a", "--yes", "--force", cwd=project)
    assert snapshot(victim) == before and out.is_dir()
