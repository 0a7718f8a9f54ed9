"""A prefix on a filesystem that is full: a run fails each step naming the cause instead of
waiting forever on its lease, and ``clean`` says so in one line instead of an internal error."""

from __future__ import annotations

import pytest

from .helpers import marinbuild, write_marinfile

pytest_plugins = ["tests.fixtures_mounts"]

MARINFILE = """
from marinbuild import step
a = step("a", cmd="echo a > {output}/out.txt")
b = step("b", cmd="echo b > {output}/out.txt")
"""


@pytest.fixture
def full_prefix(small_tmpfs, project):
    """A prefix whose two steps ran once, on a filesystem filled up afterwards."""
    write_marinfile(project, MARINFILE)
    prefix = small_tmpfs.path / "out"
    assert marinbuild("run", "--prefix", str(prefix), cwd=project).returncode == 0
    small_tmpfs.fill()
    return prefix


def test_a_run_on_a_full_store_fails_its_steps_naming_the_cause(project, full_prefix):
    # Before, each step waited forever ("wait ... lease ... cannot be used (OSError: [Errno 28] ...)");
    # the timeout only bounds the test.
    result = marinbuild("run", "-F", "-k", "--prefix", str(full_prefix), cwd=project, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    failed = [line for line in result.stdout.splitlines() if line.startswith("FAILED ")]
    assert len(failed) == 2, result.stdout
    for line in failed:
        assert "cannot be created: No space left on device (the store is full)" in line, line
    assert "wait" not in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_clean_on_a_full_store_is_one_line_and_force_removes(project, full_prefix):
    result = marinbuild("clean", "--yes", "--prefix", str(full_prefix), cwd=project)
    assert result.returncode != 0
    assert "remove " not in result.stdout, result.stdout  # nothing said removed that is not
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("marinbuild: error: cannot take the lease of ") and "No space left on device" in line, line
    assert "internal error" not in line and "--force" in line
    assert len(list(full_prefix.glob("*-*"))) == 2  # nothing was removed
    forced = marinbuild("clean", "--yes", "--force", "--prefix", str(full_prefix), cwd=project)
    assert forced.returncode == 0, forced.stderr
    assert list(full_prefix.glob("*-*")) == []
