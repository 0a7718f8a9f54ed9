"""What ``plan`` and ``why`` add after their verdicts: drift notes, root changes, cost estimates."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from marinbuild.accounting import Estimate
    from marinbuild.planner import Plan
    from marinbuild.project import Project

__all__ = ["drift_lines", "estimate_lines", "estimates", "format_hours", "rough_duration", "why_extras"]


def drift_lines(project: Project, plan: Plan) -> list[str]:
    """One line per drift of each up-to-date step: ``train: note: command changed since ...``."""
    from marinbuild.staleness import Action

    kept = [n for n in plan.order if plan.decisions[n].action is Action.SKIP]
    if not kept:  # everything would run: no drift to read, nor its module to load
        return []
    from marinbuild.drift import drift_note_lines as lines_of

    return lines_of(project.storage, project.graph, kept, plan.statuses)


def why_extras(project: Project, name: str, info: Mapping[str, Any] | None, own: bool) -> list[str]:
    """``why``'s lines after the verdict: drift of a stored run of this identity, else the root changes upstream."""
    node = project.graph.nodes[name]
    if info is None:
        return []
    if own:
        from marinbuild.drift import step_drift

        return [f"note: {note}" for note in step_drift(node.step, info)]
    if not isinstance(info.get("identity_payload"), dict):
        return []
    from marinbuild.drift import root_changes

    roots = root_changes(project.storage, project.graph, node, info["identity_payload"])
    # The step's own changed values are the diff `why` printed already; the rest lie upstream.
    return [f"root change upstream: {r}" for r in roots if not r.startswith(f"{name}: ")]


def estimates(project: Project, plan: Plan) -> dict[str, Estimate | None]:
    """An estimate (or None: no history) for each step the plan would run."""
    from marinbuild.history import RunIndex

    names = plan.to_run()
    index = RunIndex(project.storage, project.graph, names)
    if not index:  # nothing under the prefix ever ran: no history, and accounting is not even loaded
        return dict.fromkeys(names)
    from marinbuild.accounting import estimates_for

    return estimates_for(project.storage, project.graph, names, index)


def rough_duration(seconds: float) -> str:
    """``42 s``, ``12m05s``, ``3h02m``.

    >>> rough_duration(42.4), rough_duration(725), rough_duration(10920)
    ('42 s', '12m05s', '3h02m')
    """
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def format_hours(hours: float) -> str:
    """Hours with two significant decimals where they matter: ``0.0012``, ``1.25``, ``320``."""
    if hours == 0:
        return "0"
    if hours < 0.01:
        return f"{hours:.4f}"
    if hours < 100:
        return f"{hours:.2f}"
    return f"{hours:.0f}"


def estimate_lines(found: Mapping[str, Estimate | None], columns: Callable[[list[tuple[str, ...]]], list[str]]) -> list[str]:
    """The estimate section under the plan: a row per step to run, then the totals."""
    if not found:
        return []
    with_history = {n: e for n, e in found.items() if e is not None}
    if not with_history:
        # Nothing ran before: one line, not a row of "no history" per step.
        return ["estimates: no history (no step to run has run before under this prefix)"] if found else []
    rows: list[tuple[str, ...]] = [("step", "est. duration", "accelerator-h", "core-h", "from runs")]
    for name, e in found.items():
        if e is None:
            rows.append((name, "no history", "", "", ""))
        else:
            rows.append((name, rough_duration(e.duration_s), format_hours(e.usage.accelerator_hours),
                         format_hours(e.usage.core_hours), str(e.runs)))
    total_s = sum(e.duration_s for e in with_history.values())
    total_acc = sum(e.usage.accelerator_hours for e in with_history.values())
    total_core = sum(e.usage.core_hours for e in with_history.values())
    missing = len(found) - len(with_history)
    rows.append(("total", rough_duration(total_s), format_hours(total_acc), format_hours(total_core),
                 f"{missing} without history" if missing else ""))
    return ["estimates from earlier runs of the same step (median; durations summed as if run one after another):",
            *("  " + line for line in columns(rows))]
