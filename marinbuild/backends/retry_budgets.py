"""How many retries each cause of a failed attempt may take: the budgets and their defaults.

The one home of the retry defaults: ``marinbuild run``'s flags, ``marinbuild.run``'s keywords,
:class:`~marinbuild.execution.run_parameters.RunParameters` and the TPU job read them from
:class:`RetryBudgets`. Kept apart from the retry loop (:mod:`marinbuild.backends.retrying`) so
that the command line reads its defaults without loading the loop.

>>> RetryBudgets().hang
2
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from marinbuild.backends.base import Cause

__all__ = ["BUDGET_NAMES", "RetryBudgets"]

BUDGET_NAMES: Mapping[Cause, str] = {
    Cause.FAILED: "failure",
    Cause.PREEMPTED: "preemption",
    Cause.HANG: "hang",
    Cause.INFRA: "infra",
    Cause.PROVISIONING: "provisioning",
}
"""Each retryable cause and the name of its budget (``max_retries_<name>``, the ``retries`` keys)."""


@dataclass(frozen=True)
class RetryBudgets:
    """How many retries each cause may take in one run of a step; provisioning is bounded by time."""

    failure: int = 0
    preemption: int = 100
    hang: int = 2
    infra: int = 2
    provision_timeout: float = 3600.0
    """Seconds a step may go on failing to get hosts (from its first such attempt in a row)."""

    def of(self, cause: Cause) -> int | None:
        """The count budget of ``cause``; None for provisioning (bounded by time) and final causes."""
        name = BUDGET_NAMES.get(cause)
        counts = {Cause.FAILED: self.failure, Cause.PREEMPTED: self.preemption, Cause.HANG: self.hang,
                  Cause.INFRA: self.infra}
        return counts.get(cause) if name is not None else None
