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


def test_a_command_line_naming_its_command_loads_that_command_alone(tmp_path):
    # Every other command's module, and click's options for it, would be start-up time of a no-op.
    probe = ("import sys\nfrom marinbuild.cli.app import command_line\n"
             "try:\n    command_line(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             "print(sorted(m for m in sys.modules if m.startswith('marinbuild.cli.') and m[15:] in "
             f"{sorted(COMMAND_MODULES)!r}))\n")
    for argv, loaded in ((["status", "--help"], ["marinbuild.cli.status"]),
                         (["--help"], sorted(f"marinbuild.cli.{name}" for name in COMMAND_MODULES))):
        done = subprocess.run([sys.executable, "-c", probe, *argv], cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        assert done.stdout.strip().splitlines()[-1] == repr(loaded), done.stdout + done.stderr


def test_an_app_built_for_one_command_has_that_command_and_the_version():
    from marinbuild.cli.app import build_app

    built = build_app({"status"})
    assert [c.name for c in built.registered_commands] == ["status"] and built.registered_groups == []
    done = subprocess.run([sys.executable, "-m", "marinbuild", "--version"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith("marinbuild ")
