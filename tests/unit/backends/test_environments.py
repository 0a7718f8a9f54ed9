"""Unit tests of marinbuild.backends.environments: a step run inside its environment, locally, over SSH, on Ray."""

from __future__ import annotations

import json
import os
import queue
import subprocess
from pathlib import Path
from typing import Any

import pytest

from marinbuild.backends.base import Job
from marinbuild.backends.environments import (
    ENV_EXTRA,
    EnvFailure,
    WithEnvironments,
    env_variables,
    remote_prefix,
    runtime_env_of,
    spec_of,
)
from marinbuild.pyenv.builder import CACHE_ENV, env_key
from marinbuild.pyenv.spec import EnvSpec
from tests.fakes import ScriptedBackend


def _spec(requirements: tuple[str, ...] = ()) -> EnvSpec:
    return EnvSpec(groups=requirements, requirements=requirements, key=env_key(requirements), python="cpython")


def _job(tmp_path: Path, spec: EnvSpec | None, **kw: Any) -> Job:
    extra = {ENV_EXTRA: spec} if spec is not None else {}
    return Job(name="s", output_path=str(tmp_path / "o"), log_file=str(tmp_path / "o" / "logs" / "step.log"),
               workdir=str(tmp_path), env={"PATH": "/usr/bin"}, extra=extra, **kw)


def test_spec_of_and_env_variables(tmp_path: Path) -> None:
    spec = _spec()
    assert spec_of(_job(tmp_path, spec)) is spec and spec_of(_job(tmp_path, None)) is None
    assert env_variables(Path("/e"), "/usr/bin") == {"PATH": f"/e/bin{os.pathsep}/usr/bin", "VIRTUAL_ENV": "/e"}
    assert env_variables(Path("/e"), None)["PATH"] == "/e/bin"


def test_jobs_without_an_environment_pass_straight_through(tmp_path: Path) -> None:
    inner = ScriptedBackend()
    job = _job(tmp_path, None, command="true")
    WithEnvironments(inner, "/m/Marinfile.py", "/p", root=tmp_path / "cache").start(job, lambda o: None)
    assert inner.jobs == [job]


def test_a_shell_step_runs_with_its_environment_first_on_path(tmp_path: Path) -> None:
    inner, done = ScriptedBackend(), queue.Queue()  # type: ignore[var-annotated]
    WithEnvironments(inner, "/m/Marinfile.py", "/p", root=tmp_path / "cache").start(
        _job(tmp_path, _spec(), command="true"), done.put)
    assert done.get(timeout=60).ok
    [job] = inner.jobs
    env_dir = Path(job.env["VIRTUAL_ENV"])
    assert env_dir.parent == tmp_path / "cache" and job.env["PATH"].startswith(str(env_dir / "bin"))
    assert job.command == "true"


def test_a_function_step_runs_under_the_environments_interpreter(tmp_path: Path) -> None:
    backend = WithEnvironments(ScriptedBackend(), "/m/Marinfile.py", "/p")
    job = backend.job_in(_job(tmp_path, _spec(), fn=print), Path("/env"))
    assert job.fn is None and job.command is not None
    assert job.command.startswith("/env/bin/python -m marinbuild.backends.worker --file /m/Marinfile.py --step s")


def test_an_environment_that_cannot_be_built_fails_the_step_for_good(tmp_path: Path) -> None:
    inner, done = ScriptedBackend(), queue.Queue()  # type: ignore[var-annotated]
    missing = f"nothing @ file://{tmp_path}/nothing-1.0-py3-none-any.whl"
    job = _job(tmp_path, _spec((missing,)), command="true")
    WithEnvironments(inner, "/m/Marinfile.py", "/p", root=tmp_path / "cache").start(job, done.put)
    outcome = done.get(timeout=120)
    assert isinstance(outcome, EnvFailure) and not outcome.ok and outcome.fatal
    assert outcome.error is not None and outcome.error.startswith(f"environment {job.extra[ENV_EXTRA].short} could not be built")
    assert inner.jobs == []
    assert "could not be built" in Path(job.log_file).read_text()


def test_remote_prefix_builds_and_enters_the_environment_in_a_plain_shell(tmp_path: Path) -> None:
    script = remote_prefix(_spec()) + 'echo "$VIRTUAL_ENV"; command -v python\n'
    env = {**os.environ, CACHE_ENV: str(tmp_path / "remote-cache")}
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    venv, python = done.stdout.split()
    assert Path(venv).parent == tmp_path / "remote-cache" and python == f"{venv}/bin/python"


def test_runtime_env_of() -> None:
    assert runtime_env_of(_spec(("numpy>=2",))) == {"pip": {"packages": ["numpy>=2"], "pip_check": False}}
    assert json.dumps(runtime_env_of(_spec()))


@pytest.mark.parametrize("python", ["python3", "/opt/my python/bin/python"])
def test_remote_prefix_quotes_the_interpreter(python: str) -> None:
    text = remote_prefix(_spec(), python)
    assert text.startswith("MARINBUILD_ENV_DIR=$(") and ") || exit 3\n" in text
    assert ("MARINBUILD_ENV_DIR=$('/opt/my python/bin/python' -c" in text) == (" " in python)
