"""``marinbuild env``: build the steps' Python environments ahead of time, list the cache, prune it."""

from __future__ import annotations

import time
from typing import Annotated

import typer

from marinbuild.cli.exits import handles_errors
from marinbuild.cli.options import FileOpt, PrefixOpt, TargetsArg, VerboseOpt
from marinbuild.cli.printing import out
from marinbuild.errors import MarinbuildError

__all__ = ["EnvBuildFailed", "env_app"]

env_app = typer.Typer(
    help="The steps' Python environments (pip_dependency_groups): build, list, prune.",
    no_args_is_help=True,
)


class EnvBuildFailed(MarinbuildError):
    """An environment could not be built (exit 1)."""


def _environments(file: str, prefix: str | None, targets: list[str] | None) -> dict[str, list[str]]:
    """Key -> requirements of every environment the targets (and what they need) use, and the steps."""
    from marinbuild.cli.startup import opened_project
    from marinbuild.planner import closure, select
    from marinbuild.pyenv.spec import environment_of

    project = opened_project(file, prefix)
    graph = project.graph
    needed = closure(graph, select(graph, targets or []))
    found: dict[str, list[str]] = {}
    for name in graph.order:
        if name not in needed:
            continue
        spec = environment_of(name, graph.nodes[name].step.pip_dependency_groups, project.marinfile.path)
        if spec is not None:
            found.setdefault(spec.key, list(spec.requirements))
    return found


@env_app.command("build")
@handles_errors
def env_build(
    targets: TargetsArg = None,
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    verbose: VerboseOpt = False,
) -> None:
    """Build the environments the targets need (every declared step's when none are named)."""
    from marinbuild.pyenv.builder import EnvBuildError, cache_root, ensure, is_ready

    envs = _environments(file, prefix, targets)
    if not envs:
        out.print("no step of these targets asks for pip_dependency_groups")
        return
    root = cache_root()
    failed = 0
    for key, requirements in envs.items():
        if is_ready(root / key):
            out.print(f"{key}  cached  {root / key}", markup=False)
            continue
        started = time.monotonic()
        try:
            path = ensure(requirements, root=root, key=key)
        except EnvBuildError as e:
            failed += 1
            out.print(f"{key}  FAILED  {e}", markup=False)
            for line in e.tail.splitlines():
                out.print(f"    {line}", markup=False)
            continue
        out.print(f"{key}  built in {time.monotonic() - started:.1f} s  {path}", markup=False)
    if failed:
        raise EnvBuildFailed(f"{failed} environment(s) could not be built")


@env_app.command("list")
@handles_errors
def env_list(
    verbose: VerboseOpt = False,
) -> None:
    """The cached environments: key, size, last use and what they hold (most recently used first)."""
    from marinbuild.pyenv.builder import cache_root
    from marinbuild.pyenv.inventory import cached_envs
    from marinbuild.units import format_bytes

    envs = cached_envs()
    if not envs:
        out.print(f"no environments in {cache_root()}", markup=False)
        return
    for env in envs:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(env.last_use))
        held = ", ".join(env.requirements) or "(nothing beyond the runner's packages)"
        out.print(f"{env.key}  {format_bytes(env.size):>10}  {used}  {env.python}  {held}", markup=False)


@env_app.command("prune")
@handles_errors
def env_prune(
    file: FileOpt = "Marinfile.py",
    prefix: PrefixOpt = None,
    everything: Annotated[bool, typer.Option("--all", help="Remove every environment, used or not.")] = False,
    dry: Annotated[bool, typer.Option("--dry", "-n", help="List what would be removed.")] = False,
    verbose: VerboseOpt = False,
) -> None:
    """Remove the cached environments that no step of the Marinfile uses."""
    from marinbuild.cli.startup import about_to_delete
    from marinbuild.pyenv.inventory import prune as prune_cache

    keep: set[str] = set() if everything else set(_environments(file, prefix, None))
    if not dry:
        about_to_delete()
    removed = prune_cache(keep, dry=dry)
    for path in removed:
        out.print(("would remove " if dry else "removed ") + str(path), markup=False)
    if not removed:
        out.print("nothing to remove")
