"""Preparing one attempt of a step, in stages, right before it runs.

The stages: the step's dependencies are checked once more (each must still hold the
``SUCCESS`` it was planned on, with no other runner's lease on it: a dependency being redone
elsewhere makes the step wait, see docs/leases.md); the output folder is made ready
(:mod:`marinbuild.execution.output_folder`); the inputs are resolved once into a
:class:`StepInputs` (mirrored inputs copied, the config resolved, the command rendered) that
both the :class:`~marinbuild.backends.base.Job` and ``info.json`` take; then the records that
claim the step are written: a ``RUNNING`` status and the info as it starts, their versions
kept by a :class:`~marinbuild.store.fenced.StepFence` so that only this claim can commit
(:mod:`marinbuild.execution.attempt_commit`). Every status names the step and its identity.

A store that refuses a write fails the step with one line naming the path.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from marinbuild.accounting import held_by
from marinbuild.backends.base import HELD_EXTRA, Job
from marinbuild.backends.environments import DECLARED_ENV_EXTRA, ENV_EXTRA
from marinbuild.config_walk import (
    LEAF_TYPES,
    MAPPING,
    MAX_INT_BITS,
    RECORD,
    SET,
    children,
    describe_leaf,
    is_namedtuple,
)
from marinbuild.drift import code_record
from marinbuild.execution.attempt_handover import DEPS_EXTRA, EARLIER_OUTPUTS, OUTSIDE_BEFORE, STEP_FENCE, STRICT_EXTRA
from marinbuild.execution.dependency_check import check_dependencies
from marinbuild.execution.output_folder import ready_output_folder
from marinbuild.execution.run_context import RunContext, runner_name
from marinbuild.execution.storage_problems import stored
from marinbuild.execution.stray_writes import take_snapshot
from marinbuild.graph import StepNode
from marinbuild.pyenv.spec import EnvSpec, environment_of
from marinbuild.redact import redact_env
from marinbuild.resolve import render_command, resolve_config
from marinbuild.resources import ResourceConfig
from marinbuild.steps import Step, find_mirrored
from marinbuild.store.attempt_ledger import read_attempts
from marinbuild.store.fenced import StepFence
from marinbuild.store.markers import RUNNING, info_path, info_text, status_path, write_status
from marinbuild.store.mirror import ensure_mirrored
from marinbuild.store.step_logs import LOG_NOTE_EXTRA, begin_step_log
from marinbuild.store.storage import Storage, overlapped

__all__ = ["StepInputs", "env_vars_of", "prepare", "step_environment", "to_jsonable"]


@dataclass(frozen=True)
class StepInputs:
    """What a step runs with, resolved once: the job and ``info.json`` both take it from here."""

    config: Any
    """The config with every placeholder resolved (dependency outputs, mirrored copies)."""
    command: str | None
    """The shell command rendered from the template, for a ``cmd`` step."""
    env: dict[str, str]
    environment: EnvSpec | None
    held: dict[str, Any]
    """What the step holds of the machine (:func:`marinbuild.accounting.held_by`)."""


def prepare(ctx: RunContext, node: StepNode, extra_env: Mapping[str, str], cores: tuple[int, ...] = (),
            timeout: float | None = None) -> tuple[Job, dict[str, Any]]:
    """Check the dependencies, write the RUNNING marker and build the job; returns the job and the info to record.

    In stages: the dependencies, the output folder, the inputs (one :class:`StepInputs`),
    then the records that claim the step. Raises :class:`DependencyBusy` when a dependency
    is being redone elsewhere (the step waits), and another
    :class:`~marinbuild.errors.MarinbuildError` naming the path when the step cannot start
    (it fails alone).
    """
    seen = check_dependencies(ctx, node)
    note, earlier = ready_output_folder(ctx, node)
    inputs = _resolved_inputs(ctx, node, extra_env, cores)
    log_file = begin_step_log(ctx.storage, node.output_path)  # this run's attempts start a new log; the last run's is kept
    info = _started_info(ctx, node, inputs, seen, earlier)
    previous = _claim(ctx, node, info)
    s = node.step
    job = Job(
        name=s.name,
        output_path=node.output_path,
        log_file=log_file,
        workdir=ctx.workdir,
        env=inputs.env,
        fn=s.fn,
        config=inputs.config,
        command=inputs.command,
        cores=cores,
        timeout=timeout,
        extra={**_extra(s, inputs.environment), HELD_EXTRA: inputs.held,
               **({LOG_NOTE_EXTRA: note} if note is not None else {}),
               DEPS_EXTRA: node.deps, **({STRICT_EXTRA: True} if s.strict_outputs else {})},
        previous_attempts=previous,
        lost_attempt=node.output_path in ctx.lost_attempts,
        progress_timeout=s.progress_timeout,
    )
    return job, info


def _resolved_inputs(ctx: RunContext, node: StepNode, extra_env: Mapping[str, str], cores: tuple[int, ...] = ()) -> StepInputs:
    """The step's config, command, environment variables, Python environment and holdings, resolved."""
    s, out = node.step, node.output_path
    mirrors = {m.source: ensure_mirrored(m, ctx.storage) for m in find_mirrored(s.config)}
    config = resolve_config(s.config, out, ctx.outputs, mirrors)
    command = render_command(s.cmd, config, out, s.name) if s.cmd is not None else None
    return StepInputs(
        config=config,
        command=command,
        env=step_environment(s, out, extra_env),
        environment=environment_of(s.name, s.pip_dependency_groups, ctx.marinfile),
        held=held_by(s.resources, cores),
    )


def _started_info(ctx: RunContext, node: StepNode, inputs: StepInputs, seen: dict[str, float], earlier: list[str]) -> dict[str, Any]:
    """``info.json`` as the step starts, from the same inputs as its job."""
    s, out = node.step, node.output_path
    info: dict[str, Any] = {
        "name": s.name,
        "identity": node.identity,
        "identity_payload": node.payload,
        "output_path": out,
        "config": to_jsonable(inputs.config),
        "dependencies": {d: ctx.outputs[d] for d in node.deps},
        "dependency_status_times": seen,
        "kind": s.kind,
        "function": _describe_fn(s.fn) if s.fn is not None else None,
        "command": inputs.command,
        "description": s.description,
        "environment": inputs.environment.to_json() if inputs.environment is not None else None,
        "env_vars": redact_env(env_vars_of(s)),
        "held": inputs.held,
        **code_record(s),  # what plan and why compare to tell drift (drift.py)
        "start_time": time.time(),
        **ctx.provenance,
    }
    if earlier:
        info[EARLIER_OUTPUTS] = earlier
    if ctx.prefix:
        ctx.step_spans[s.name] = [time.monotonic(), math.inf]
        info[OUTSIDE_BEFORE] = take_snapshot(ctx.storage, ctx.prefix, out, [ctx.outputs[d] for d in node.deps], ctx.layout.seen)
    return info


_HANDED_OVER = frozenset({EARLIER_OUTPUTS, OUTSIDE_BEFORE})
"""Info keys the start hands to the commit, never written: the snapshot's repr made a running
step's info.json as large as its dependencies' listings."""


def _claim(ctx: RunContext, node: StepNode, info: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """Write the RUNNING status and the info as it stands; returns what the attempt ledger holds of earlier runs.

    Each is written whatever is there and its version kept: the final info and status are
    written only over these very versions (store/fenced.py), so that a runner that lost the
    step meanwhile cannot commit. The attempt ledger is read meanwhile.
    """
    storage, out = ctx.storage, node.output_path
    fence = StepFence(storage)
    started = info_text({k: v for k, v in info.items() if k not in _HANDED_OVER})
    info[STEP_FENCE] = fence
    return _while_reading_attempts(storage, out, lambda: stored(
        f"write {status_path(out)}",
        lambda: overlapped(
            storage,
            lambda: write_status(storage, out, RUNNING, put=fence.claim, owner=runner_name(), name=node.step.name,
                                 identity=node.identity),
            lambda: fence.claim(info_path(out), started),
        ),
    ))


def _while_reading_attempts(storage: Storage, output: str, write: Callable[[], Any]) -> tuple[dict[str, Any], ...]:
    """Run ``write`` while the step's attempt ledger is read; the attempts it holds.

    On a remote store the two requests are in flight together, one round trip instead of two.
    """
    _, attempts = overlapped(storage, write, lambda: read_attempts(storage, output))
    return attempts


def _extra(s: Step, environment: EnvSpec | None) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if environment is not None:
        extra[ENV_EXTRA] = environment
    declared = frozenset(env_vars_of(s)) | {k for k, _ in s.env}
    if declared:
        extra[DECLARED_ENV_EXTRA] = declared
    return extra


def env_vars_of(s: Step) -> Mapping[str, str]:
    """The step's ``ResourceConfig.env_vars`` (none for other ways of giving resources)."""
    return s.resources.env_vars if isinstance(s.resources, ResourceConfig) else {}


def step_environment(s: Step, out: str, extra_env: Mapping[str, str]) -> dict[str, str]:
    """The variables a step gets on top of the runner's environment, in order of precedence.

    Lowest first: what admission derives (thread counts, device lists), the step's
    ``env_vars`` and ``env=``, then marinbuild's own ``MARINBUILD_*`` variables, which win
    over everything (a step cannot be told a wrong output path or attempt number).
    """
    env = {**extra_env, **env_vars_of(s), **dict(s.env)}
    env.update((k, v) for k, v in extra_env.items() if k.startswith("MARINBUILD_"))
    env.update(MARINBUILD_OUTPUT=out, MARINBUILD_STEP=s.name, MARINBUILD_ATTEMPT="1")
    return env


def to_jsonable(value: Any) -> Any:
    """A JSON-friendly rendering of a resolved config, for humans (not for identity).

    Walked as every config is (:mod:`marinbuild.config_walk`): a dataclass or a
    NamedTuple by its fields, a set sorted when it can be, an enum by its value, a path
    as text; anything else that JSON cannot hold by its ``repr``.
    """
    found = children(value)
    if found is None:
        leaf = describe_leaf(value)
        if type(leaf) is int and leaf.bit_length() > MAX_INT_BITS:  # no JSON can hold it as a number
            return f"(an integer of {leaf.bit_length()} bits)"
        if leaf is None or type(leaf) in LEAF_TYPES:
            return leaf
        try:
            json.dumps(leaf)
            return leaf
        except (TypeError, ValueError):
            return repr(value)
    shape, items = found
    if shape in (MAPPING, RECORD):
        return {str(k): to_jsonable(v) for k, v in items}
    if is_namedtuple(value):
        return {k: to_jsonable(v) for k, v in zip(type(value)._fields, value, strict=True)}
    rendered = [to_jsonable(v) for _, v in items]
    if shape == SET:
        try:
            return sorted(rendered)
        except TypeError:
            return rendered
    return rendered


def _describe_fn(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
