"""The exported surface of ``marinbuild`` is a contract: changes to it are deliberate."""

from __future__ import annotations

import subprocess
import sys

import marinbuild

from .helpers import cli_env

EXPECTED = {
    "Cores", "CpuConfig", "Custom", "GpuConfig", "Gpus", "MarinbuildError", "Memory", "Node",
    "ResourceConfig", "Slices", "Step", "Token", "TpuConfig", "UserError", "WTime", "ZERO",
    "mirrored", "output_path_of", "step", "this_output_path", "tpu_topology", "versioned",
    "main", "plan", "run", "Plan", "RunSummary", "StepOutcome", "StepResult",
    "status", "clean", "StatusReport", "StepStatus", "CleanResult",
}


def test_exported_names():
    assert set(marinbuild.__all__) == EXPECTED
    for name in EXPECTED:
        assert getattr(marinbuild, name) is not None


def test_library_does_not_import_terminal_or_cli_libraries():
    code = (
        "import sys, marinbuild, marinbuild.execution.scheduler, marinbuild.backends.local.backend, marinbuild.project\n"
        "print(sorted(m for m in ('rich', 'typer', 'click') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], env=cli_env(), capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_python_dash_m_and_help():
    out = subprocess.run([sys.executable, "-m", "marinbuild", "--help"], env=cli_env(), capture_output=True, text=True)
    assert out.returncode == 0
    for command in ("run", "plan", "status", "why", "clean"):
        assert command in out.stdout


def test_version_flag():
    out = subprocess.run([sys.executable, "-m", "marinbuild", "--version"], env=cli_env(), capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == f"marinbuild {marinbuild.__version__}"
