"""marinbuild: a build tool for ML experiments.

A ``Marinfile.py`` declares steps; marinbuild hashes each step's versioned config and its
dependencies' identities to decide what is stale, and runs what is, in parallel::

    from marinbuild import step, versioned

    data = step("data", cmd="seq {n} > {output}/numbers.txt", config={"n": versioned(100)})
    total = step("total", cmd="paste -sd+ {numbers} | bc > {output}/sum.txt",
                 config={"numbers": output_path_of(data, "numbers.txt")})
"""

from marinbuild.api import main, plan, run
from marinbuild.errors import MarinbuildError, UserError
from marinbuild.execution.session import RunSummary, StepOutcome, StepResult
from marinbuild.planner import Plan
from marinbuild.resources import (
    ZERO,
    Cores,
    CpuConfig,
    Custom,
    GpuConfig,
    Gpus,
    Memory,
    Node,
    ResourceConfig,
    Slices,
    Token,
    TpuConfig,
    WTime,
)
from marinbuild.steps import Step, mirrored, output_path_of, step, this_output_path, versioned
from marinbuild.tpu_types import tpu_topology

__all__ = [
    "ZERO",
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
    "Step",
    "StepOutcome",
    "StepResult",
    "Token",
    "TpuConfig",
    "UserError",
    "WTime",
    "main",
    "mirrored",
    "output_path_of",
    "plan",
    "run",
    "step",
    "this_output_path",
    "tpu_topology",
    "versioned",
]

__version__ = "0.1.0"
