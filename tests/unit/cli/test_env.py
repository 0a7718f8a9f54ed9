"""Unit tests of marinbuild.cli.env: building environments ahead of time, listing and pruning the cache."""

from __future__ import annotations

from pathlib import Path

from tests.helpers import marinbuild_in_process, write_marinfile

PYPROJECT = """
[project]
name = "demo"
version = "0"
[project.optional-dependencies]
nothing = []
"""

MARINFILE = """
from marinbuild import step
step("plain", cmd="true")
step("boxed", cmd="true", pip_dependency_groups=["nothing"])
"""


def test_build_list_and_prune(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    write_marinfile(tmp_path, MARINFILE)
    cache = tmp_path / "cache"
    env = {"MARINBUILD_ENV_CACHE": str(cache)}

    def cli(*args: str) -> list[str]:
        done = marinbuild_in_process("env", *args, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.splitlines()

    assert cli("list") == [f"no environments in {cache}"]
    assert cli("build", "plain") == ["no step of these targets asks for pip_dependency_groups"]
    [built] = cli("build")
    key = built.split()[0]
    assert built.startswith(f"{key}  built in ") and built.endswith(str(cache / key))
    assert cli("build", "boxed") == [f"{key}  cached  {cache / key}"]
    [listed] = cli("list")
    assert listed.startswith(key) and listed.endswith("(nothing beyond the runner's packages)")
    assert cli("prune") == ["nothing to remove"]  # the Marinfile still uses it
    assert cli("prune", "--all", "--dry") == [f"would remove {cache / key}"]
    assert (cache / key).is_dir()
    assert cli("prune", "--all") == [f"removed {cache / key}"]
    assert not (cache / key).exists()
