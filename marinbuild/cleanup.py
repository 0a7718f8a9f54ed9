"""``clean`` as calls: choose the outputs to remove, then remove them, each returning a value.

:func:`choose_outputs` says what ``clean`` would remove and what it leaves alone (a dry run
stops there); :func:`remove_outputs` removes them one by one and says which went. The rules
of what may be removed live in :mod:`marinbuild.removal`; ``marinbuild.clean`` and the
command line both come through here, the command line asking before it removes anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from marinbuild.errors import UserError
from marinbuild.planner import select
from marinbuild.project import Project
from marinbuild.removal import OUTSIDE_FLAG, CleanPlan, Skipped, plan_clean, remove_output
from marinbuild.store.index import forget
from marinbuild.store.storage import Storage

__all__ = ["CleanResult", "choose_outputs", "clean_project", "remove_outputs"]


@dataclass(frozen=True)
class CleanResult:
    """What ``clean`` removed, or (a dry run) would remove, and what it left alone and why."""

    removed: tuple[str, ...]
    skipped: tuple[Skipped, ...] = ()
    would_remove: tuple[str, ...] = ()
    """A dry run's list of the outputs it would remove; nothing was removed (``removed`` is empty)."""


def choose_outputs(
    project: Project,
    targets: Sequence[str] = (),
    *,
    orphans: bool = False,
    any_orphans: bool = False,
    force: bool = False,
    outside_prefix: bool = False,
) -> CleanPlan:
    """What ``clean`` would remove: the targets' current outputs (none named: every step's), or orphans."""
    wanted = list(targets)
    names = None if orphans or any_orphans else select(project.graph, wanted)
    outside: set[str] = set()
    if outside_prefix:
        # Outside the prefix only what the user named, never what a glob or no target reaches.
        outside = {t for t in wanted if t in project.graph.nodes}
        if names is None or not outside:
            raise UserError(f"{OUTSIDE_FLAG} removes the outputs of steps named exactly: name them (no glob, no --orphans)")
    return plan_clean(project.storage, project.graph, names, project.marinfile.path, any_shape=any_orphans,
                      force=force, outside=outside)


def remove_outputs(
    storage: Storage,
    paths: Sequence[str],
    force: bool = False,
    on_removed: Callable[[str], None] | None = None,
    on_left: Callable[[Skipped], None] | None = None,
) -> CleanResult:
    """Remove the output folders ``paths`` (see :func:`~marinbuild.removal.remove_output`), telling each as it goes."""
    # Their status summary entries go first (store/index.py): an entry outliving its folder
    # could be believed again if a runner re-created the folder and stopped at once. One
    # forgotten for a folder then left alone costs a marker read, never a wrong answer.
    forget(storage, paths)
    removed: list[str] = []
    left: list[Skipped] = []
    for path in paths:
        why = remove_output(storage, path, force=force)
        if why is None:
            removed.append(path)
            if on_removed is not None:
                on_removed(path)
        else:
            left.append(Skipped(path, why))
            if on_left is not None:
                on_left(left[-1])
    return CleanResult(tuple(removed), tuple(left))


def clean_project(
    project: Project,
    targets: Sequence[str] = (),
    *,
    orphans: bool = False,
    any_orphans: bool = False,
    force: bool = False,
    outside_prefix: bool = False,
    dry: bool = False,
) -> CleanResult:
    """Choose and (unless ``dry``) remove, without asking: what ``clean --yes`` does, as a value."""
    chosen = choose_outputs(project, targets, orphans=orphans, any_orphans=any_orphans, force=force,
                            outside_prefix=outside_prefix)
    if dry:
        return CleanResult((), tuple(chosen.skipped), would_remove=tuple(chosen.remove))
    done = remove_outputs(project.storage, chosen.remove, force=force)
    return CleanResult(done.removed, (*chosen.skipped, *done.skipped))
