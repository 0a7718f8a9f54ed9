"""The options and arguments several commands share, and what a target on the command line names."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from marinbuild.errors import UserError
from marinbuild.project import step_targets  # what a target on the command line names

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


def metrics_of(project: Project) -> str | None:
    """The metrics file the Marinfile names (``METRICS = "metrics.json"``), if any."""
    named = project.marinfile.default("METRICS")
    if named is None:
        return None
    if not isinstance(named, str) or not named or named.startswith("/") or ".." in named.split("/"):
        raise UserError(f"METRICS in the Marinfile must name a file inside each output, like 'metrics.json', not {named!r}")
    return named
