"""``gs://`` as users meet it: the gcsfs a fresh install brings, with its default settings.

gcsfs's default filesystem (``ExtendedGcsFileSystem``) asks the storage control API what
kind of bucket each one is; the test server answers as GCS does for a flat bucket. No
environment variable of the tests may change which filesystem class marinbuild gets.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING

from tests.helpers import REPO, marinbuild, write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

_MARINBUILDS = (
    "import sys; from marinbuild.store.storage import Storage; cls = type(Storage.for_prefix(sys.argv[1]).fs); "
    "print(cls.__module__ + '.' + cls.__qualname__)"
)
_FSSPECS = "import fsspec; cls = fsspec.get_filesystem_class('gs'); print(cls.__module__ + '.' + cls.__qualname__)"


def _class_in(env: dict[str, str], code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True,
                         timeout=120, check=True)
    return out.stdout.strip()


def test_no_test_variable_changes_the_filesystem_class(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    assert not [k for k in (*gcs_emulator.env, *os.environ) if k.startswith("GCSFS_")]
    bare = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": os.environ.get("HOME", "/root")}
    as_users_have_it = _class_in(bare, _FSSPECS)  # what url_to_fs makes for gs:// with nothing of the tests' set
    in_the_tests = _class_in({**bare, **gcs_emulator.env}, _MARINBUILDS, gcs_prefix)
    assert as_users_have_it == in_the_tests == "gcsfs.extended_gcsfs.ExtendedGcsFileSystem"


def test_the_installed_gcsfs_is_in_the_range_of_the_gcs_extra() -> None:
    from importlib.metadata import version

    from packaging.requirements import Requirement

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    gcs = next(Requirement(r) for r in extras["gcs"] if Requirement(r).name == "gcsfs")
    test = next(Requirement(r) for r in extras["test"] if Requirement(r).name == "gcsfs")
    assert gcs.specifier == test.specifier  # the tests prove the range users install
    assert gcs.specifier.contains(version("gcsfs")), (version("gcsfs"), str(gcs.specifier))


MARINFILE = """
from marinbuild import step, versioned

a = step("a", cmd="echo a", config={"v": versioned(1)})
b = step("b", cmd="echo b {a}", config={"a": a, "v": versioned(1)})
"""


def test_plan_run_status_show_and_clean_on_gs_with_gcsfs_defaults(gcs_emulator: Emulator, gcs_prefix: str,
                                                                   project: Path) -> None:
    write_marinfile(project, MARINFILE)
    env = {**gcs_emulator.env, "MARIN_PREFIX": gcs_prefix}
    plan = marinbuild("plan", "--json", cwd=project, env=env)
    assert plan.returncode == 0, plan.stderr
    assert {r["action"] for r in json.loads(plan.stdout)} == {"run"}
    run = marinbuild("run", "b", cwd=project, env=env)
    assert run.returncode == 0, run.stderr
    status = marinbuild("status", "--json", cwd=project, env=env)
    assert {r["status"] for r in json.loads(status.stdout)} == {"SUCCESS"}
    show = marinbuild("show", cwd=project, env=env)
    assert show.returncode == 0 and "SUCCESS" in show.stdout, show.stderr
    clean = marinbuild("clean", "b", "--yes", cwd=project, env=env)
    assert clean.returncode == 0, clean.stderr
    after = marinbuild("status", "--json", cwd=project, env=env)
    assert [r["status"] for r in json.loads(after.stdout) if r["name"] == "b"] == ["NONE"]
    for result in (plan, run, status, show, clean, after):
        # gcsfs says this when its bucket-type lookup fails (and then asks again on every call).
        assert "Could not determine bucket type" not in result.stderr
