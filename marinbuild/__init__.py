"""marinbuild: a build tool for ML experiments.

A ``Marinfile.py`` declares steps; marinbuild hashes each step's versioned config and its
dependencies' identities to decide what is stale, and runs what is, in parallel::

    from marinbuild import step, versioned

    data = step("data", cmd="seq {n} > {output}/numbers.txt", config={"n": versioned(100)})
    total = step("total", cmd="paste -sd+ {numbers} | bc > {output}/sum.txt",
                 config={"numbers": output_path_of(data, "numbers.txt")})
"""

import importlib
from typing import TYPE_CHECKING, Any

# Each public name is imported where it lives on first use. `import marinbuild` runs before any
# submodule's import, the command line's included: kept empty, it lets the command line catch a
# Ctrl-C while its modules load (see __main__.py) and lets `import marinbuild.steps` cost only that.
_HOMES = {
    "clean": "marinbuild.api",
    "main": "marinbuild.api",
    "plan": "marinbuild.api",
    "run": "marinbuild.api",
    "status": "marinbuild.api",
    "CleanResult": "marinbuild.cleanup",
    "StatusReport": "marinbuild.report.status",
    "StepStatus": "marinbuild.report.status",
    "MarinbuildError": "marinbuild.errors",
    "UserError": "marinbuild.errors",
    "RunSummary": "marinbuild.execution.run_results",
    "StepOutcome": "marinbuild.execution.run_results",
    "StepResult": "marinbuild.execution.run_results",
    "Plan": "marinbuild.planner",
    "ZERO": "marinbuild.resources",
    "Cores": "marinbuild.resource_parts",
    "CpuConfig": "marinbuild.resources",
    "Custom": "marinbuild.resource_parts",
    "GpuConfig": "marinbuild.resources",
    "Gpus": "marinbuild.resource_parts",
    "Memory": "marinbuild.resource_parts",
    "Node": "marinbuild.resources",
    "ResourceConfig": "marinbuild.resources",
    "Slices": "marinbuild.resource_parts",
    "Token": "marinbuild.resource_parts",
    "TpuConfig": "marinbuild.resources",
    "WTime": "marinbuild.resource_parts",
    "Step": "marinbuild.steps",
    "mirrored": "marinbuild.steps",
    "output_path_of": "marinbuild.steps",
    "step": "marinbuild.steps",
    "this_output_path": "marinbuild.steps",
    "versioned": "marinbuild.steps",
    "tpu_topology": "marinbuild.tpu_types",
}

if TYPE_CHECKING:
    from marinbuild.api import clean, main, plan, run, status
    from marinbuild.cleanup import CleanResult
    from marinbuild.errors import MarinbuildError, UserError
    from marinbuild.execution.run_results import RunSummary, StepOutcome, StepResult
    from marinbuild.planner import Plan
    from marinbuild.report.status import StatusReport, StepStatus
    from marinbuild.resource_parts import Cores, Custom, Gpus, Memory, Slices, Token, WTime
    from marinbuild.resources import ZERO, CpuConfig, GpuConfig, Node, ResourceConfig, TpuConfig
    from marinbuild.steps import Step, mirrored, output_path_of, step, this_output_path, versioned
    from marinbuild.tpu_types import tpu_topology

__all__ = [
    "ZERO",
    "CleanResult",
    "Cores",
    "CpuConfig",
    "Custom",
    "GpuConfig",
    "Gpus",
    "MarinbuildError",
    "Memory",
    "Node",
    "Plan",
    "ResourceConfig",
    "RunSummary",
    "Slices",
    "StatusReport",
    "Step",
    "StepOutcome",
    "StepResult",
    "StepStatus",
    "Token",
    "TpuConfig",
    "UserError",
    "WTime",
    "clean",
    "main",
    "mirrored",
    "output_path_of",
    "plan",
    "run",
    "status",
    "step",
    "this_output_path",
    "tpu_topology",
    "versioned",
]

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``marinbuild.step`` and the other public names, imported from their modules when first asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'marinbuild' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value  # asked once: later lookups are plain attribute reads
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})
