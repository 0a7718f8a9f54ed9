"""Unit tests of marinbuild.cli.run: what `marinbuild run` prints for its printing options."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

MARINFILE = """
from marinbuild import step
hello = step("hello", cmd="echo hi from {name} > {output}/hi.txt; echo said hi", config={"name": "x"})
"""


def _run(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "marinbuild", "run", *args], cwd=folder, capture_output=True,
                          text=True, timeout=120, env={**_env(), "COLUMNS": "200"})


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("MARIN_PREFIX", None)
    return env


def _project(tmp_path: Path) -> Path:
    (tmp_path / "Marinfile.py").write_text(textwrap.dedent(MARINFILE))
    return tmp_path


def test_dry_prints_the_plan_and_writes_nothing(tmp_path):
    folder = _project(tmp_path)
    done = _run(folder, "--dry")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0].split() == ["step", "action", "reason", "resources", "output"]
    assert "hello" in done.stdout and not (folder / "marinbuild-out").exists()


def test_json_events_carry_output_and_commands_as_events(tmp_path):
    folder = _project(tmp_path)
    done = _run(folder, "--json", "--print-output", "-p")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = [e["event"] for e in events]
    assert "started" in kinds and "finished" in kinds
    assert {"event": "output", "step": "hello", "line": "said hi"} in [
        {k: e[k] for k in ("event", "step", "line")} for e in events if e["event"] == "output"
    ]
    commands = [e for e in events if e["event"] == "command"]
    assert commands and commands[0]["command"].startswith("echo hi from x")


def test_plain_lines_name_the_step_and_quiet_drops_them(tmp_path):
    folder = _project(tmp_path)
    done = _run(folder, "-p")
    assert done.returncode == 0, done.stderr
    assert "[hello] said hi" in done.stdout and "[hello] $ echo hi from x" in done.stdout
    again = _run(folder, "-q", "--force-all")
    assert again.returncode == 0 and "[hello]" not in again.stdout
    nothing = _run(folder)
    assert nothing.stdout.strip() == "nothing to do: 1 step up to date"


def test_the_command_line_the_library_and_run_parameters_name_the_same_options_each_passed_by_name() -> None:
    import ast
    import dataclasses
    import inspect

    import marinbuild.cli.run as cli_run
    from marinbuild import api
    from marinbuild.backends.registry import kind_options
    from marinbuild.execution.run_parameters import RunParameters

    # Options a kind of backend declares (--ray-address) travel in backend_options.
    fields = {f.name for f in dataclasses.fields(RunParameters)} - {"backend_options"} | set(kind_options())
    command = set(inspect.signature(cli_run.run_command).parameters)
    library = set(inspect.signature(api.run).parameters) - {"steps", "reporter"}
    assert command == fields and library == fields
    for module in (cli_run, api):
        calls = [n for n in ast.walk(ast.parse(inspect.getsource(module)))
                 if isinstance(n, ast.Call) and ast.unparse(n.func) == "RunParameters.of"]
        assert len(calls) == 1 and not calls[0].args
        assert {k.arg for k in calls[0].keywords} == fields  # no **locals(): every option named
