"""What every step's records in one run share: the run's facts, and how they name this runner.

One :class:`RunContext` per run, made by the session: where the outputs live, which of them
start over, resume or are cleared, the provenance every ``info.json`` records, and where a
warning about a step goes. Preparing an attempt (:mod:`marinbuild.execution.attempt_start`)
and committing it (:mod:`marinbuild.execution.attempt_commit`) both read it.
"""

from __future__ import annotations

import functools
import getpass
import os
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from marinbuild.execution.stray_writes import Layout, layout_of
from marinbuild.store.lease import Owner, Watch
from marinbuild.store.storage import Storage

__all__ = ["RunContext", "runner_name"]


@dataclass(frozen=True)
class RunContext:
    """Facts about this run that every step's info records, and the bookkeeping its steps share."""

    storage: Storage
    workdir: str
    marinfile: str
    outputs: Mapping[str, str]
    """Output path of every step in the graph, by name."""
    fresh_output: bool = False
    """Clear every step's partial output before it runs (``run --fresh-output``), as ``fresh_output=True`` does."""
    lost_attempts: frozenset[str] = frozenset()
    """Output paths whose step an earlier run left ``RUNNING`` (its runner killed): its last attempt
    was never recorded, and its number is not given again."""
    keep_output: bool = False
    """Every step resumes in place over what its folder holds (``run --keep-output``), as ``resume_output=True`` does."""
    start_over: frozenset[str] = frozenset()
    """Output paths whose earlier contents are set aside before their step runs (see :mod:`marinbuild.store.aside`)."""
    resuming: Mapping[str, str] = field(default_factory=dict)
    """Output paths whose step continues in place, with what the earlier run was (``failed``, ``interrupted``,
    ``finished``): the step's first log line says so when it finds output there."""
    identities: Mapping[str, str] = field(default_factory=dict)
    """Identity of every step in the graph, by name: a dependency's status must be written for it."""
    prefix: str = ""
    """Where the outputs live: a step's writes beside them are watched (:mod:`marinbuild.execution.stray_writes`)."""
    strict_outputs: bool = False
    """A step that writes outside its output fails (``run --strict-outputs``), as ``strict_outputs=True`` does."""
    warn: Callable[[str], None] = field(default=lambda line: None, repr=False, compare=False)
    """Where a warning about a step goes (a line of the run's output)."""
    # The run's own bookkeeping, shared by its steps (the fields above are facts, fixed at the start).
    dependency_leases: dict[str, Watch] = field(default_factory=dict, repr=False, compare=False)
    """Leases on dependencies seen held, by output path: how long each stayed unchanged
    (:mod:`marinbuild.execution.dependency_check`)."""
    step_spans: dict[str, list[float]] = field(default_factory=dict, repr=False, compare=False)
    """When each step of this run started and (once recorded) ended, by name: which steps ran beside
    one found writing outside its output (any of them may have written it)."""

    @functools.cached_property
    def layout(self) -> Layout:
        """Where the graph's outputs lie on this machine, once per run (see :mod:`marinbuild.execution.stray_writes`)."""
        local = {p: d for d, out in self.outputs.items() if (p := self.storage.local_file(out)) is not None}
        return layout_of(local, self.storage.local_file(self.prefix) or self.prefix)

    @functools.cached_property
    def provenance(self) -> dict[str, Any]:
        """Who ran the steps, where, from which commit and Marinfile: the same for every step's info."""
        return {
            "git_commit": _git_commit(self.workdir),
            "user": _user(),
            "host": socket.gethostname(),
            "marinfile": self.marinfile,
        }


@functools.cache
def runner_name() -> str:
    """How markers name this runner: the same ``HOST:PID`` its leases show."""
    return str(Owner.current())


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


def _git_commit(folder: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=folder, capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None
