"""Every option of a run in one value: ``marinbuild run``'s flags and :func:`marinbuild.run`'s keywords.

The command line and the library build a :class:`RunParameters`; the session reads the same
value (no copy of its fields), so an option and its default are written once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from marinbuild.backends.retry_budgets import RetryBudgets
from marinbuild.capacity import Machine

__all__ = ["RunParameters"]


_SEQUENCES = ("targets", "force", "resources", "token")


@dataclass(frozen=True)
class RunParameters:
    """Every option of a run, named as ``marinbuild run`` names it (``--lease-heartbeat`` is
    ``lease_heartbeat``, ``--plan FILE`` is ``plan``, ``--no-sync`` is ``no_sync``)."""

    targets: tuple[str, ...] = ()
    """Step names, globs or output paths; none: every declared step."""
    file: str = "Marinfile.py"
    prefix: str | None = None
    jobs: int | None = None
    """Steps running at once; steps that declare no resources then take no core. 0: the core count."""
    keep_going: bool = False
    force: tuple[str, ...] = ()
    force_all: bool = False
    dry: bool = False
    """Decide and start nothing: the command line prints the plan."""
    print_output: bool | None = None
    """Pass on what steps print; None: yes, except with ``quiet`` or ``json``."""
    json: bool = False
    """Report events as JSON lines on stdout."""
    cores: int | None = None
    mem: str | None = None
    resources: tuple[str, ...] = ()
    """Custom counted resources this run offers, ``NAME=N`` each."""
    token: tuple[str, ...] = ()
    """Tokens this run offers."""
    walltime: str | None = None
    backend: str | None = None
    """The kind of backend (a name ``--backend`` takes); None: the Marinfile's ``DEFAULT_BACKEND``, else local."""
    lease_heartbeat: float | None = None
    lease_expiry: float | None = None
    fresh_output: bool = False
    """A failed or interrupted step starts over instead of resuming from its partial output."""
    keep_output: bool = False
    """A step rerun over its finished output resumes in place instead of starting from an empty folder."""
    cluster: str | None = None
    max_retries_preemption: int = RetryBudgets.preemption
    max_retries_failure: int = RetryBudgets.failure
    max_retries_hang: int = RetryBudgets.hang
    """Retries of an attempt killed for making no progress (a step's own ``max_retries_hang`` wins)."""
    no_sync: bool = False
    """Do not copy the project directory to remote hosts."""
    allow_cross_region: bool = False
    """Run steps on capacity created outside the region of their prefix and ``gs://`` inputs."""
    plan: str | None = None
    """A plan file written by ``marinbuild plan -o``: run exactly it, or refuse."""
    print_commands: bool = False
    wide: bool = False
    """A dry run's plan on a terminal with whole paths and reasons, not fitted to 100 columns."""
    strict_outputs: bool = False
    """A step that writes outside its output folder fails instead of being warned about."""
    list: bool = False
    """Say the names of the steps the targets select, one a line, and run nothing (``marinbuild list``)."""
    quiet: bool = False
    verbose: bool = False
    """The command line's tracebacks; the library raises with its traceback either way."""
    backend_options: tuple[tuple[str, Any], ...] = ()
    """The run options the kinds of backend declare (:func:`marinbuild.backends.registry.kind_options`),
    as given: each is a ``marinbuild run`` flag and a :func:`marinbuild.run` keyword of its own."""

    @classmethod
    def of(cls, **values: Any) -> RunParameters:
        """From keywords as the command line or the library take them: a sequence may be a
        list, None or (targets) one string, and ``backend`` an enum member."""
        for name in _SEQUENCES:
            given = values.get(name)
            if given is None or isinstance(given, str):
                values[name] = () if given is None else (given,)
            else:
                values[name] = tuple(given)
        if values.get("backend") is not None:
            values["backend"] = str(values["backend"])
        from marinbuild.backends.registry import kind_options

        declared = kind_options()
        given = dict(values.pop("backend_options", ()))
        given.update({name: values.pop(name) for name in list(values) if name in declared})
        values["backend_options"] = tuple(sorted({**declared, **given}.items()))
        return cls(**values)

    @property
    def options(self) -> dict[str, Any]:
        """The run options the kinds of backend declare, by name (a flag ``--x-y`` is ``x_y``)."""
        return dict(self.backend_options)

    @property
    def sync(self) -> bool:
        """Whether the project directory is copied to remote hosts."""
        return not self.no_sync

    @property
    def machine(self) -> Machine:
        """What the run may use of this machine."""
        return Machine(cores=self.cores, mem=self.mem, resources=self.resources, tokens=self.token)

    @property
    def prints_output(self) -> bool:
        """Whether what steps print is passed on."""
        return self.print_output if self.print_output is not None else not self.quiet and not self.json
