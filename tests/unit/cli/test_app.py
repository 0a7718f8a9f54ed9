"""Unit tests of marinbuild.cli.app: one module per command, registered by name, and the entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from marinbuild.cli import app as app_module
from marinbuild.cli.app import COMMANDS, _bare_jobs, app

CLI = Path(app_module.__file__).parent
COMMAND_MODULES = {"run", "plan", "status", "why", "clean", "logs", "show", "list", "report", "env", "tpu", "slurm"}


def test_every_command_is_registered_from_its_own_module():
    registered = {c.name: c.callback for c in app.registered_commands}
    for name, callback in registered.items():
        assert callback is not None and callback.__module__ == f"marinbuild.cli.{name}", name
    groups = {g.name: g.typer_instance for g in app.registered_groups}
    assert set(registered) | set(groups) == COMMAND_MODULES == set(COMMANDS)


def test_command_modules_never_import_the_app():
    for module in sorted(CLI.glob("*.py")):
        if module.name == "app.py":
            continue
        for node in ast.walk(ast.parse(module.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            assert "marinbuild.cli.app" not in names, module.name


def test_app_defines_no_command_itself():
    tree = ast.parse((CLI / "app.py").read_text())
    commands = [
        f.name for f in tree.body if isinstance(f, ast.FunctionDef)
        and any("command" in ast.unparse(d) for d in f.decorator_list)
    ]
    assert commands == []


def test_a_bare_j_means_every_core_and_a_number_stays():
    assert _bare_jobs(["run", "-j"]) == ["run", "--jobs=0"]
    assert _bare_jobs(["run", "--jobs", "3"]) == ["run", "--jobs", "3"]
    assert _bare_jobs(["run", "--", "-j"]) == ["run", "--", "-j"]


def test_a_usage_error_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run([sys.executable, "-m", "marinbuild", "run", "--bogus"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("marinbuild run: error: No such option: --bogus") and line.endswith("(see --help)")
