"""The gates a ready step passes before the run loop starts it, as the loop asks them.

Besides the ``-j`` cap: :class:`Admission`, the resource pools
(:mod:`marinbuild.execution.admission` counts them), and :class:`Claims`, the leases
(:mod:`marinbuild.execution.claims` holds them). A run given neither gets the open gates
here: every step admitted, every step its own.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from marinbuild.backends.base import Grant
from marinbuild.graph import StepNode

__all__ = ["Admission", "Claims", "NoClaims", "Unlimited"]


class Admission(Protocol):
    def try_acquire(self, node: StepNode) -> Grant | None:
        """Reserve the step's resources all at once, or nothing (None)."""

    def release(self, grant: Grant, duration: float | None = None) -> None:
        """Give back what :meth:`try_acquire` reserved; ``duration`` of a successful run."""

    def refusal(self, node: StepNode) -> str | None:
        """Why the step must not start at all in this run, or None."""


class Claims(Protocol):
    def try_claim(self, node: StepNode) -> tuple[str, str]:
        """``("go", "")`` to run, ``("done", why)`` when finished elsewhere, ``("wait", why)``."""

    def lost(self, node: StepNode) -> bool:
        """True when this runner no longer holds the step's claim (never commit SUCCESS then)."""

    def release(self, node: StepNode) -> None:
        """Give up the claim after the step's outcome is recorded."""

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        """Call ``on_lost(step_name, reason)`` from any thread when a held claim is lost."""


class Unlimited:
    """Admission without pools: every step's resources fit at once."""

    def try_acquire(self, node: StepNode) -> Grant | None:
        return Grant()

    def release(self, grant: Grant, duration: float | None = None) -> None:
        pass

    def refusal(self, node: StepNode) -> str | None:
        return None


class NoClaims:
    """Claims without leases: every step is this runner's, and stays so."""

    def try_claim(self, node: StepNode) -> tuple[str, str]:
        return "go", ""

    def lost(self, node: StepNode) -> bool:
        return False

    def release(self, node: StepNode) -> None:
        pass

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        pass
