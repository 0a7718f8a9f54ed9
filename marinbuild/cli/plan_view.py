"""What ``marinbuild plan`` shows, and its plain-text form for pipes and files.

:func:`plan_view` picks the rows (a big plan gets counts by action and reason, then its
first steps); :mod:`marinbuild.cli.console` draws them as a rich table on a terminal, and
:func:`plan_text` writes aligned columns elsewhere, without importing rich at all (a
tenth of a second of a 10,000-step ``plan | less``).

Example, for a plan of one new step::

    $ marinbuild plan | cat
    step   action  reason  resources  output
    hello  run     new     Cores(1)   /work/marinbuild-out/hello-1f0e2a9c5d7b3e41
    1 to run
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from marinbuild.cli.printing import terminal_safe
from marinbuild.planner import Plan

__all__ = ["COLUMNS", "MAX_ROWS", "TERMINAL_WIDTH", "PlanView", "columns_text", "columns_within", "cut_reason", "plan_text",
           "plan_view",
           "under_prefix"]

MAX_ROWS = 200
"""Above this many steps the plan shows counts and the first rows: rich needs seconds to
lay out a table of ten thousand rows, and nobody reads one."""
SHOWN_ROWS = 50
COLUMNS = ("step", "action", "reason", "resources", "output")
TERMINAL_WIDTH = 100
"""Columns a table takes on a terminal at most, unless ``--wide``: output paths are shown
relative to the prefix and long reasons cut, ``why STEP`` telling the rest."""
REASON_WIDTH = 60
"""Characters of a reason shown in a table that fits :data:`TERMINAL_WIDTH`."""


def under_prefix(path: str, prefix: str) -> str:
    """``path`` relative to ``prefix`` when inside it (what a terminal table shows), else whole.

    >>> under_prefix("/out/train/lr0.1-1f0e", "/out"), under_prefix("/elsewhere/x", "/out")
    ('train/lr0.1-1f0e', '/elsewhere/x')
    """
    root = prefix.rstrip("/") + "/"
    return path[len(root):] if path.startswith(root) and len(path) > len(root) else path


def cut_reason(reason: str, name: str, width: int = REASON_WIDTH) -> str:
    """A reason cut to at most ``width`` characters, pointing at ``why STEP`` for the rest.

    The hint that a step resumes from partial output, at the end of a reason, is kept (whole
    where there is room, as ``; resumes`` where there is not).

    >>> cut_reason("changed: lr: 0.1 -> 0.2; dependency data: data-1f0e2a9c5d7b3e41 -> data-9c0e", "t", 36)
    'changed: lr: 0.1 -> 0.2… (why t)'
    """
    from marinbuild.planner import RESUMES

    tail = f"; {RESUMES}" if reason.endswith(f"; {RESUMES}") else ""
    head = reason[: len(reason) - len(tail)]
    if len(reason) <= width:
        return reason
    hint = f"… (why {name})"
    if tail and width - len(hint) - len(tail) < 10:
        tail = "; resumes"
    if width - len(hint) - len(tail) < 10:
        hint = "… (why)"  # a long name: `why` on the row's step tells the rest
    budget = width - len(hint) - len(tail)
    if budget < 10:  # no room for the hint: the reason's start, cut
        return reason[: width - 1] + "…"
    if len(head) + len(tail) <= width:
        return head + tail
    cut = head[:budget]
    cut = cut.rsplit(" ", 1)[0] if " " in cut[budget // 2:] else cut  # at a word, where one is near
    return f"{cut.rstrip(' ;,')}{hint}{tail}"


@dataclass(frozen=True)
class PlanView:
    """The rows of a plan as shown, with counts for a plan too big to list."""

    rows: tuple[tuple[str, str, str, str, str], ...]
    counts: tuple[tuple[str, str, int], ...] | None
    """``(action, kind of reason, steps)`` when the plan has more than MAX_ROWS steps."""
    totals: str


def plan_view(
    plan: Plan, resources: Mapping[str, object] | None = None, max_rows: int = MAX_ROWS, wide: bool = True
) -> PlanView:
    """Choose what to show of ``plan``: every step, or counts and the first steps to run.

    Unless ``wide``, rows fit a terminal: output paths relative to the prefix, reasons cut.
    """
    names = list(plan.order)
    counts = None
    if len(names) > max_rows:
        decided = [plan.decisions[n] for n in names]
        # Counted as they are, then each distinct kind of reason made safe once: a plan of
        # 10,000 steps has a handful of kinds. (Action is a StrEnum: its members are their own text.)
        raw = Counter((d.action, d.reason.partition(":")[0]) for d in decided)
        kinds: Counter[tuple[str, str]] = Counter()
        for (action, kind), count in raw.items():
            kinds[str(action), terminal_safe(kind)] += count
        counts = tuple((action, reason, count) for (action, reason), count in sorted(kinds.items()))
        to_run = [n for n, d in zip(names, decided, strict=True) if d.action != "skip"]
        names = (to_run or names)[:SHOWN_ROWS]
        totals: Counter[str] = Counter()
        for (action, _), count in raw.items():  # the plan's order and its decisions hold the same steps
            totals[action] += count
    else:
        totals = Counter(str(d.action) for d in plan.decisions.values())
    prefix = plan.steps.prefix
    rows = tuple(
        (
            n,
            str(plan.decisions[n].action),
            # A reason quotes config values: defused, so that one step stays one line of one row.
            terminal_safe(plan.decisions[n].reason) if wide else cut_reason(terminal_safe(plan.decisions[n].reason), n),
            terminal_safe(str((resources or {}).get(n, ""))),  # rendered only for the rows shown
            plan.node(n).output_path if wide else under_prefix(plan.node(n).output_path, prefix),
        )
        for n in names
    )
    return PlanView(rows, counts, ", ".join(f"{v} to {k!s}" for k, v in sorted(totals.items())) or "nothing to do")


def plan_text(plan: Plan, resources: Mapping[str, object] | None = None) -> str:
    """The plan as aligned plain-text columns, ending with a newline."""
    view = plan_view(plan, resources)
    lines: list[str] = []
    if view.counts is not None:
        lines.append(f"{len(plan.order)} steps")
        lines += columns_text([("action", "reason", "steps"), *((a, r, str(c)) for a, r, c in view.counts)])
        lines.append("")
        lines.append(f"first {len(view.rows)} steps:")
    lines += columns_text([COLUMNS, *view.rows])
    lines.append(view.totals)
    return "\n".join(lines) + "\n"


def columns_within(rows: list[tuple[str, ...]], room: int) -> list[tuple[str, ...]]:
    """Rows of plain columns (the first a key) without the columns zero or empty in every row, and
    without those from the right that would make a line wider than ``room``: for a terminal,
    where a longer line would wrap.

    >>> columns_within([("step", "est", "acc-h", "core-h"), ("a", "1 s", "0", "0.5"), ("b", "2 s", "0", "0.1")], 14)
    [('step', 'est'), ('a', '1 s'), ('b', '2 s')]
    """
    def blank(i: int) -> bool:
        return all(not row[i].strip() or _zero(row[i]) for row in rows[1:])

    keep = [i for i in range(len(rows[0])) if i == 0 or not blank(i)]
    while len(keep) > 1 and max(len(line) for line in columns_text([tuple(r[i] for i in keep) for r in rows])) > room:
        keep.pop()
    return [tuple(r[i] for i in keep) for r in rows]


def _zero(text: str) -> bool:
    try:
        return float(text) == 0
    except ValueError:
        return False


def columns_text(rows: list[tuple[str, ...]]) -> list[str]:
    """Rows as lines of left-aligned columns two spaces apart, trailing blanks trimmed."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]

