"""``marinbuild run --plan FILE``: run the reviewed plan, or refuse before anything runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from marinbuild.errors import UserError
from marinbuild.graph import StepGraph
from marinbuild.plan_review import Reviewed, differences, finished_meanwhile, read_plan_file
from marinbuild.planner import Plan

__all__ = ["check_review", "load_review"]


def load_review(path: str, targets: Sequence[str] | None, force: Sequence[str] | None, force_all: bool) -> Reviewed:
    """Read the plan file; the targets and forced steps come from it, so none may be given beside it."""
    if targets or force or force_all:
        raise UserError("--plan runs the targets and forced steps written in the plan file; give no targets, --force or -F with it")
    return read_plan_file(path)


def check_review(reviewed: Reviewed, plan: Plan, graph: StepGraph, say: Callable[[str], None]) -> None:
    """Refuse (printing each difference) unless ``plan`` is the reviewed plan, less steps finished meanwhile."""
    if reviewed.prefix is not None and reviewed.prefix != graph.prefix:
        say(f"marinbuild: the plan was made for the prefix {reviewed.prefix}, this run's is {graph.prefix}")
        raise UserError(f"the plan in {reviewed.path} is for another prefix; nothing was run")
    found = differences(reviewed, plan, graph)
    if found:
        for line in found:
            say(f"marinbuild: differs from the plan: {line}")
        n = len(found)
        raise UserError(
            f"the plan in {reviewed.path} no longer holds ({n} difference{'' if n == 1 else 's'}); nothing was run: "
            "plan again and review it"
        )
    for name in finished_meanwhile(reviewed, plan):
        say(f"marinbuild: {name}: finished by another runner since the plan was made; skipped")
