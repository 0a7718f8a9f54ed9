"""The one rule against writing through a link (marinbuild.store.links), on real folders and links."""

from __future__ import annotations

import os
from pathlib import Path

from marinbuild.store.links import link_problem


def _output(tmp_path: Path) -> tuple[Path, Path]:
    prefix = tmp_path / "prefix"
    out = prefix / "a-0123456789abcdef"
    (out / ".marinbuild").mkdir(parents=True)
    (out / ".marinbuild" / "status").write_text("{}")
    (out / "logs").mkdir()
    (out / "logs" / "step.log").write_text("")
    return prefix, out


def test_a_plain_output_and_one_not_made_yet_are_fine(tmp_path):
    prefix, out = _output(tmp_path)
    assert link_problem(str(out), str(prefix)) is None
    assert link_problem(str(prefix / "b-0123456789abcdef"), str(prefix)) is None
    assert link_problem("gs://bucket/a-0123456789abcdef", "gs://bucket") is None


def test_each_link_is_named(tmp_path):
    prefix, out = _output(tmp_path)
    victim = tmp_path / "victim"
    victim.mkdir()
    cases = [
        (out / ".marinbuild" / "lease", "its marker .marinbuild/lease is a symlink"),
        (out / "attempts.json", "its marker attempts.json is a symlink"),
        (out / "logs" / "step.1.log", "its marker logs/step.1.log is a symlink"),
    ]
    for link, why in cases:
        link.symlink_to(victim / "x")
        assert link_problem(str(out), str(prefix)) == why
        link.unlink()
    os.rename(out / "logs", tmp_path / "logs")
    (out / "logs").symlink_to(victim)
    assert link_problem(str(out), str(prefix)) == "its logs folder is a symlink"


def test_a_folder_on_the_way_from_the_prefix_that_is_a_link_is_refused_but_the_prefix_may_be_one(tmp_path):
    prefix, out = _output(tmp_path)
    real = tmp_path / "elsewhere"
    real.mkdir()
    (prefix / "sub").symlink_to(real)
    assert link_problem(str(prefix / "sub" / "a-0123456789abcdef"), str(prefix)) == "it is reached through a symlink"
    spelled = tmp_path / "spelled"
    spelled.symlink_to(prefix)
    assert link_problem(str(spelled / out.name), str(spelled)) is None


def test_a_marker_that_is_a_fifo_is_not_a_regular_file(tmp_path):
    prefix, out = _output(tmp_path)
    os.mkfifo(out / ".marinbuild" / "info.json")
    assert link_problem(str(out), str(prefix)) == "its marker .marinbuild/info.json is not a regular file (a FIFO)"


def test_the_walk_on_the_way_from_the_prefix_agrees_with_comparing_real_paths(tmp_path):
    """Every layout of two folders on the way (plain, a link, a link to a link, absent), the output
    itself plain, a link or absent: refused exactly where realpath says the path leaves the prefix."""
    import itertools

    def by_realpath(path: Path, prefix: Path) -> bool:
        rel = os.path.relpath(path, prefix)
        return os.path.islink(path) or os.path.realpath(path) != os.path.join(os.path.realpath(prefix), rel)

    kinds = ("dir", "link", "absent")
    for n, (first, second, last) in enumerate(itertools.product(kinds, kinds, kinds)):
        root = tmp_path / f"case{n}"
        prefix, elsewhere = root / "prefix", root / "elsewhere"
        (elsewhere / "b").mkdir(parents=True)
        prefix.mkdir()
        a = prefix / "a"
        if first == "dir":
            a.mkdir()
        elif first == "link":
            a.symlink_to(elsewhere)
        if first != "absent":
            b = a / "b"
            if second == "dir" and not b.exists():
                b.mkdir()
            elif second == "link" and not os.path.lexists(b):
                b.symlink_to(elsewhere / "b")
            out = b / "s-0123456789abcdef"
            if os.path.isdir(b) and last == "dir":
                out.mkdir(exist_ok=True)
            elif os.path.isdir(b) and last == "link" and not os.path.lexists(out):
                out.symlink_to(elsewhere)
        out = prefix / "a" / "b" / "s-0123456789abcdef"
        refused = link_problem(str(out), str(prefix)) == "it is reached through a symlink"
        assert refused == by_realpath(out, prefix), (first, second, last)
