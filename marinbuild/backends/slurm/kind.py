"""Slurm as a kind of backend: ``--backend slurm`` submits every step (but TPU steps) as Slurm jobs.

The cluster file's ``[slurm]`` table (:mod:`marinbuild.backends.slurm.settings`) and each step's
``slurm={...}`` say how; an unknown key of either is refused at plan time. Steps on Slurm take
nothing of this machine's pools. Before every run the jobs an earlier runner of this prefix
left (it was SIGKILLed) are cancelled when no live runner holds their step's lease, as
``marinbuild slurm down`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from marinbuild.backends.kinds import BackendKind, PlacedKind, PlanInput

if TYPE_CHECKING:
    from marinbuild.backends.base import Backend, WireInput
    from marinbuild.backends.slurm.commands import JobState
    from marinbuild.backends.slurm.settings import SlurmSettings
    from marinbuild.graph import StepNode
    from marinbuild.resources import Request, ResourceConfig
    from marinbuild.store.storage import Storage

__all__ = ["KIND", "LeftJob", "SlurmKind", "SlurmPlaced", "cancel_unheld", "find_left", "step_settings"]


def step_settings(table: SlurmSettings, step: Any) -> SlurmSettings:
    """The settings of one step: its own ``slurm={...}`` over the table."""
    own = dict(step.slurm)
    return table.over(own, f"step {step.name!r}: slurm=") if own else table


class SlurmPlaced(PlacedKind):
    """The steps run as Slurm jobs: every step but TPU ones (those stay on SSH)."""

    name = "slurm"
    remote = True
    preemption_unknown = "marinbuild cannot tell which Slurm partitions may preempt a job"

    def __init__(self, table: SlurmSettings, settings: Mapping[str, SlurmSettings] | None = None) -> None:
        self.table = table
        self.settings = dict(settings or {})

    def takes(self, name: str, request: Request) -> bool:
        return request.slices is None

    def check_step(self, name: str, rc: ResourceConfig, request: Request) -> Request:
        if not rc.preemptible:
            return super().check_step(name, rc, request)
        return request  # replicas=N: N nodes, the step once on each

    def before_run(self, project: Any, echo: Callable[[str], None]) -> None:
        from marinbuild.errors import MarinbuildError

        try:
            cancel_unheld(find_left(project.graph.prefix, project.storage), say=lambda line: echo(f"marinbuild: {line}"))
        except MarinbuildError as e:
            echo(f"marinbuild: warning: jobs left by an earlier run not checked: {e}")

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        from marinbuild.backends.slurm.backend import SlurmBackend
        from marinbuild.resources import ResourceConfig

        project = wire.project
        graph = project.graph
        table, settings = self.table, self.settings

        def replicas(name: str) -> int:
            rc = graph.nodes[name].step.resources
            return rc.replicas if isinstance(rc, ResourceConfig) else 1

        polls = [s.poll_interval for s in settings.values()] or [table.poll_interval]
        slurm = SlurmBackend(
            prefix=graph.prefix, workdir=project.workdir, marinfile=project.marinfile.path, requests=wire.requests,
            replicas=replicas, settings_of=lambda name: settings.get(name, table), lease=wire.lease,
            poll_interval=min(polls),
        )
        requests = wire.requests
        return lambda node: slurm if requests[node.name].slices is None else fallback(node)


class SlurmKind(BackendKind):
    name = "slurm"
    help = "Slurm jobs, the cluster file's [slurm] table"
    cluster_keys = frozenset({"slurm"})

    def plan(self, given: PlanInput) -> PlacedKind | None:
        from marinbuild.backends.slurm.settings import SlurmSettings, parse_slurm  # only when chosen

        raw = (given.cluster or {}).get("slurm")
        table = parse_slurm(raw, given.cluster_source) if raw is not None else SlurmSettings()
        graph = given.project.graph
        # Every step's own settings are checked now: an unknown key is refused before anything runs.
        settings = {n: step_settings(table, graph.nodes[n].step) for n in given.to_run}
        return SlurmPlaced(table, settings)


KIND = SlurmKind()


@dataclass(frozen=True)
class LeftJob:
    """A job marinbuild submitted for a step under a prefix, and who holds that step now."""

    job: JobState
    holder: str | None
    """The live runner holding the step's lease; None: nobody (its runner was killed)."""


def find_left(prefix: str, storage: Storage | None = None) -> list[LeftJob]:
    """The jobs Slurm still runs or queues for steps under ``prefix`` (one squeue), with their holders."""
    from marinbuild.backends.slurm import commands
    from marinbuild.store.lease import owner_alive, read_leases
    from marinbuild.store.storage import Storage

    root = prefix.rstrip("/") + "/"
    jobs = [j for j in commands.query().values()
            if not j.ended and (out := j.output_path) is not None and (out + "/").startswith(root)]
    if not jobs:
        return []
    store = storage or Storage.for_prefix(prefix)
    leases = read_leases(store, [j.output_path for j in jobs if j.output_path is not None])
    found = []
    for j in jobs:
        record = leases.get(j.output_path or "")
        alive = record is not None and owner_alive(record.owner) is not False
        found.append(LeftJob(j, record.describe() if record is not None and alive else None))
    return found


def cancel_unheld(left: list[LeftJob], *, say: Callable[[str], None] = lambda line: None, held_too: bool = False) -> list[int]:
    """``scancel`` (one call) the jobs no live runner holds (``held_too``: all of ``left``), and wait
    until they have stopped; their ids."""
    from marinbuild.backends.slurm import commands

    doomed = [j for j in left if held_too or j.holder is None]
    commands.cancel([j.job.job_id for j in doomed])
    for j in doomed:
        why = "no live runner holds it" if j.holder is None else f"held by {j.holder}, cancelled as asked"
        say(f"cancelled Slurm job {j.job.job_id} ({j.job.name}, {j.job.state}; {why})")
    # scancel only asks: the job's processes stop after Slurm's KillWait. The step must not start
    # again (this run may take it over at once) while they still run.
    for job_id in commands.wait_stopped([j.job.job_id for j in doomed]):
        say(f"warning: Slurm job {job_id} is still stopping after {commands.STOP_WAIT_S:g} s (see squeue)")
    return [j.job.job_id for j in doomed]
