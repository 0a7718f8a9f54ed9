"""What preparing an attempt hands on to its commit, beside the job itself.

Preparing a step (:mod:`marinbuild.execution.attempt_start`) returns its job and the info
to record; the commit (:mod:`marinbuild.execution.attempt_commit`) takes both back once the
step has run. The info carries, under keys dropped before it is written, what only the
commit needs: the earlier outputs set aside, what lay outside the output before the step
ran, and the step's :class:`~marinbuild.store.fenced.StepFence`. The job's ``extra`` carries
what the commit (and a backend) reads of the step: its dependencies, its strict outputs.

A backend that announces its attempt's start rewrites the ``RUNNING`` status where the
step runs: :func:`status_left_to_the_attempt` tells the fence so before the step starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from marinbuild.backends.base import Job
from marinbuild.store.fenced import StepFence
from marinbuild.store.markers import status_path

__all__ = ["DEPS_EXTRA", "EARLIER_OUTPUTS", "OUTSIDE_BEFORE", "STEP_FENCE", "STRICT_EXTRA", "status_left_to_the_attempt"]

EARLIER_OUTPUTS = "earlier_output"
"""Info key (dropped before the info is written) listing the aside folders a success removes."""
OUTSIDE_BEFORE = "outside_before"
"""Info key (dropped before the info is written): what was seen outside the output before the step ran."""
STEP_FENCE = "_fence"
"""Info key (dropped before the info is written) holding the step's :class:`~marinbuild.store.fenced.StepFence`."""
DEPS_EXTRA = "dependencies"
"""A job's ``extra`` key: the names of the steps it depends on (whose outputs it must not write to)."""
STRICT_EXTRA = "strict_outputs"
"""A job's ``extra`` key: the step fails when it writes outside its output (``strict_outputs=True``)."""


def status_left_to_the_attempt(info: Mapping[str, Any], job: Job) -> None:
    """The step's attempt rewrites its ``RUNNING`` status where it runs (a backend that
    announces its start): the commit fences on the info JSON alone, not on the status version
    this runner wrote at its claim, which the attempt replaced."""
    fence: StepFence | None = info.get(STEP_FENCE)
    if fence is not None:
        fence.release(status_path(job.output_path))
