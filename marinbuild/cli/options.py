"""The options and arguments several commands share, and what a target on the command line names."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.errors import UserError

if TYPE_CHECKING:
    from marinbuild.execution.session import Machine
    from marinbuild.project import Project

__all__ = [
    "ClusterOpt",
    "CoresOpt",
    "FileOpt",
    "ForceAllOpt",
    "ForceOpt",
    "MemOpt",
    "PrefixOpt",
    "QuietOpt",
    "ResourcesOpt",
    "TargetsArg",
    "TokenOpt",
    "VerboseOpt",
    "complete_steps",
    "machine_of",
    "metrics_of",
    "step_targets",
]

FileOpt = Annotated[str, typer.Option("-f", "--file", help="The Marinfile to load.")]
PrefixOpt = Annotated[
    str | None,
    typer.Option("--prefix", envvar="MARIN_PREFIX", help="Where outputs live (any fsspec URL); default ./marinbuild-out."),
]


def complete_steps(ctx: typer.Context, incomplete: str) -> list[str]:
    """Shell completion of a target: the step names of the Marinfile (``-f`` or ``Marinfile.py``)
    that begin with what is typed. Whatever goes wrong while loading it completes nothing."""
    import contextlib
    import io

    file = ctx.params.get("file") or "Marinfile.py"
    try:
        # What the Marinfile prints while it loads must not land among the completions.
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            from marinbuild.marinfile import load_marinfile

            names = [s.name for s in load_marinfile(file).steps]
    except (Exception, SystemExit):
        return []
    return [n for n in names if n.startswith(incomplete)]


TargetsArg = Annotated[list[str] | None, typer.Argument(help="Step names or globs; none means every declared step.",
                                                        autocompletion=complete_steps)]
VerboseOpt = Annotated[bool, typer.Option("-v", "--verbose", help="Tracebacks and more detail.")]
QuietOpt = Annotated[bool, typer.Option("-q", "--quiet", help="Only failures and the summary.")]
ForceOpt = Annotated[list[str] | None, typer.Option("--force", "-R", help="Rerun this step (and what depends on it); repeatable.",
                                                   autocompletion=complete_steps)]
ForceAllOpt = Annotated[bool, typer.Option("--force-all", "-F", "-B", help="Rerun every step the targets need (-B as in make).")]
CoresOpt = Annotated[int | None, typer.Option("--cores", help="Cores this run may use (default: detected).")]
MemOpt = Annotated[str | None, typer.Option("--mem", help="Memory this run may use, e.g. 16g (g = GiB; default: detected minus headroom).")]
ResourcesOpt = Annotated[list[str] | None, typer.Option("--resources", help="A custom counted resource NAME=N steps may ask for; repeatable.")]
TokenOpt = Annotated[list[str] | None, typer.Option("--token", help="A token this run offers; repeatable.")]
ClusterOpt = Annotated[str | None, typer.Option("--cluster", help="TPU cluster file (TOML); default: the Marinfile's DEFAULT_CLUSTER.")]


def machine_of(cores: int | None, mem: str | None, resources: list[str] | None, tokens: list[str] | None) -> Machine:
    """What ``--cores``, ``--mem``, ``--resources`` and ``--token`` say this run may use."""
    from marinbuild.execution.session import Machine

    return Machine(cores=cores, mem=mem, resources=tuple(resources or ()), tokens=tuple(tokens or ()))


def step_targets(project: Project, targets: Sequence[str] | None) -> list[str]:
    """The targets as step names or globs: an output path (``marinbuild-out/data-1f0e…``, or a
    file inside one) stands for the step writing it; anything else is left for ``select``."""
    wanted = list(targets or [])
    nodes = project.graph.nodes
    looks_like_path = [t for t in wanted if t not in nodes and ("/" in t or os.sep in t) and not any(c in t for c in "*?[")]
    if not looks_like_path:
        return wanted
    by_output = {node.output_path.rstrip("/"): name for name, node in nodes.items()}
    out: list[str] = []
    for t in wanted:
        if t in looks_like_path:
            path = project.storage.user_path(t)
            while path and path not in by_output and os.path.dirname(path) != path:
                path = os.path.dirname(path)  # a file inside an output names its step too
            t = by_output.get(path, t)
        out.append(t)
    return out


def metrics_of(project: Project) -> str | None:
    """The metrics file the Marinfile names (``METRICS = "metrics.json"``), if any."""
    named = project.marinfile.default("METRICS")
    if named is None:
        return None
    if not isinstance(named, str) or not named or named.startswith("/") or ".." in named.split("/"):
        raise UserError(f"METRICS in the Marinfile must name a file inside each output, like 'metrics.json', not {named!r}")
    return named
