"""Where commands print: stdout and stderr consoles made on first use, and the printers that
``run`` and ``plan`` share (the plan, planning notes, steps' lines).

Plain text never imports rich; a table on a terminal does (through :mod:`marinbuild.cli.console`).
"""

from __future__ import annotations

import errno
import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from marinbuild.execution.session import PlannedRun
    from marinbuild.planner import Plan

__all__ = ["LazyConsole", "err", "out", "print_notes", "print_plan", "print_table", "step_line_printer",
           "terminal_safe", "with_environments"]


def terminal_safe(text: str) -> str:
    """``text`` with control characters escaped (``\\x1b``, ``\\x07``, ``\\n``), each one alone:
    a config value, a metric or a marker must not clear the screen, retitle the window, ring
    the bell or break a line that a pipe reads as one step.

    >>> terminal_safe("\\x1b[2Jloss\\nnext é")
    '\\\\x1b[2Jloss\\\\nnext é'
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class LazyConsole:
    """A rich Console made on first use: commands that print plain text never import rich."""

    def __init__(self, **options: Any) -> None:
        self._options = options

    @functools.cached_property
    def console(self) -> Console:
        from rich.console import Console

        class _Console(Console):
            def on_broken_pipe(self) -> None:
                # rich ends the process (exit status 1) from wherever it printed: inside a run,
                # with its steps left RUNNING. The command stops as for Ctrl-C and exits 141.
                self.quiet = True
                raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

        return _Console(**self._options)

    def print(self, *objects: Any, **options: Any) -> None:
        self.console.print(*objects, **options)


out = LazyConsole(highlight=False, soft_wrap=True)
err = LazyConsole(stderr=True, highlight=False, soft_wrap=True)


def step_line_printer(json_events: bool, event: str, template: str) -> Callable[[str, str], None]:
    """A printer of ``(step, text)``: ``template`` filled on stdout, or a JSON ``event`` line.

    ``run`` prints what steps print (``output``, ``[{step}] {text}``) and, with ``-p``, each
    shell step's command (``command``, ``[{step}] $ {text}``).
    """
    if json_events:
        from marinbuild.execution.reporting import json_step_lines

        return json_step_lines(event)
    if event == "command":  # a command is marinbuild's to print, from config values: defused, one line
        return lambda step, text: out.print(template.format(step=step, text=terminal_safe(text)), markup=False,
                                            highlight=False)
    return lambda step, text: out.print(template.format(step=step, text=text), markup=False, highlight=False)


def print_notes(planned: PlannedRun) -> None:
    """What planning could not check, said once on stderr."""
    for note in planned.fields.notes if planned.fields is not None else ():
        err.print(f"marinbuild: note: {terminal_safe(note)}", markup=False)


def with_environments(planned: PlannedRun) -> dict[str, object]:
    """The resources column, with the key of each step's Python environment after its request."""
    envs = planned.fields.environments if planned.fields is not None else {}
    return {n: f"{r} env={envs[n].short}" if n in envs else r for n, r in planned.requests.items()}


def print_plan(plan: Plan, requests: Mapping[str, object], wide: bool = False) -> None:
    """A rich table on a terminal, within 100 columns unless ``wide`` (paths relative to the prefix,
    reasons cut); whole plain columns into a pipe or a file, for scripts."""
    if not sys.stdout.isatty():
        from marinbuild.cli.plan_view import plan_text

        sys.stdout.write(plan_text(plan, requests))
        return
    from marinbuild.cli.console import plan_table

    print_table(plan_table(plan, requests, wide=wide), wide)


def print_table(table: Any, wide: bool) -> None:
    """A table on the terminal: at most :data:`~marinbuild.cli.plan_view.TERMINAL_WIDTH` columns unless ``wide``."""
    from marinbuild.cli.plan_view import TERMINAL_WIDTH

    out.print(table, width=None if wide else min(out.console.width, TERMINAL_WIDTH))
