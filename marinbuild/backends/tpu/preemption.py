"""Deciding what an attempt's outcome was: success, preemption, user failure, infrastructure, hang.

The decision is a pure function of what was observed on each host, so every rule can be
tested without a cluster:

>>> ok = HostObservation("h0", exit_code=0)
>>> gone = HostObservation("h1", exit_code=None, connection_lost=True, reachable=False)
>>> classify_attempt([ok, gone])
<Cause.PREEMPTED: 'PREEMPTED'>

A host that never answered SSH (a wrong port, a refused or timed-out connection) is not
taken for a preemption unless GCE says so, or it answered in an earlier attempt of the
step: a typo must not be retried on the (large) preemption budget.

>>> classify_attempt([HostObservation("h0", exit_code=None, reachable=False, unreached=True)])
<Cause.INFRA: 'INFRA'>
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from marinbuild.backends.base import Cause

__all__ = [
    "METADATA_PATH",
    "AttemptClass",
    "HostObservation",
    "classify_attempt",
    "is_preempted",
    "is_unreached",
    "metadata_query_command",
    "parse_metadata_answer",
]

METADATA_PATH = "/computeMetadata/v1/instance/preempted"


AttemptClass = Cause
"""How one attempt ended: the causes every backend shares (:class:`~marinbuild.backends.base.Cause`)."""


@dataclass(frozen=True)
class HostObservation:
    """What was seen on one host during and after an attempt.

    ``exit_code`` is ``None`` when the command's end was not seen (connection lost, or the
    host was torn down before it finished).  ``reachable`` is whether SSH answered after
    the attempt (``None``: not asked).  ``metadata_preempted`` is the GCE metadata answer
    (``None``: no answer, e.g. not on GCE).  ``infra_error`` is set when setting the host
    up failed (key, auth, sync, launch).  ``unreached`` is set when no SSH session to the
    host could be opened in this attempt, and ``answered_before`` when one could in an
    earlier attempt of the same step.
    """

    host: str
    exit_code: int | None = None
    connection_lost: bool = False
    reachable: bool | None = None
    metadata_preempted: bool | None = None
    infra_error: str | None = None
    unreached: bool = False
    answered_before: bool = False


def is_preempted(obs: HostObservation) -> bool:
    """A host counts as preempted when GCE says so or when it stopped answering SSH.

    Stopped answering: it answered in this attempt or an earlier one, and no longer does.
    A host that never answered is an infrastructure error (:func:`is_unreached`).

    >>> is_preempted(HostObservation("h", exit_code=137, metadata_preempted=True))
    True
    """
    if obs.metadata_preempted is True:
        return True
    return obs.reachable is False and (not obs.unreached or obs.answered_before)


def is_unreached(obs: HostObservation) -> bool:
    """The host never answered SSH in this step and GCE does not say it was preempted."""
    return obs.reachable is False and obs.unreached and not is_preempted(obs)


def classify_attempt(
    observations: Sequence[HostObservation], *, cancelled: bool = False, hung: bool = False
) -> Cause:
    """The class of an attempt from its hosts' observations.

    Order matters: a cancel wins; then any preempted host makes the whole attempt a
    preemption, because its siblings fail in the cascade and that is not the program's
    fault; then a gang torn down for making no progress is a HANG; then setup trouble is INFRA; then all hosts exiting 0 is SUCCESS; anything else
    (a non-zero exit, or a lost connection to a host that still answers) is FAILED or
    INFRA respectively.

    >>> classify_attempt([HostObservation("h0", exit_code=0), HostObservation("h1", exit_code=1)])
    <Cause.FAILED: 'FAILED'>
    """
    if cancelled:
        return Cause.CANCELLED
    if any(is_preempted(o) for o in observations):
        return Cause.PREEMPTED
    if hung:
        return Cause.HANG
    if any(o.infra_error or is_unreached(o) for o in observations):
        return Cause.INFRA
    if observations and all(o.exit_code == 0 for o in observations):
        return Cause.SUCCESS
    if any(o.exit_code not in (0, None) for o in observations):
        return Cause.FAILED
    # Nobody failed, yet not everyone finished: a dropped connection to a live host.
    return Cause.INFRA


def metadata_query_command(timeout: float = 3.0) -> str:
    """A POSIX shell command, run on a host, printing the GCE ``preempted`` answer.

    The metadata host is ``$GCE_METADATA_IP`` when set (as JAX honours it), else
    ``metadata.google.internal``.  It prints nothing when no metadata server answers.
    """
    t = shlex.quote(f"{timeout:g}")
    py = (
        "import os,sys,urllib.request as u\n"
        "h=os.environ.get('GCE_METADATA_IP') or 'metadata.google.internal'\n"
        f"r=u.Request('http://'+h+'{METADATA_PATH}',headers={{'Metadata-Flavor':'Google'}})\n"
        f"try: sys.stdout.write(u.urlopen(r,timeout={timeout:g}).read().decode())\n"
        "except Exception: pass\n"
    )
    url = f'"http://${{GCE_METADATA_IP:-metadata.google.internal}}{METADATA_PATH}"'
    return (
        "if command -v curl >/dev/null 2>&1; then "
        f"curl -fsS -m {t} -H 'Metadata-Flavor: Google' {url} 2>/dev/null; "
        f"else python3 -c {shlex.quote(py)} 2>/dev/null; fi; true"
    )


def parse_metadata_answer(text: str) -> bool | None:
    """``TRUE`` -> True, ``FALSE`` -> False, anything else (no server) -> None.

    >>> parse_metadata_answer("TRUE\\n"), parse_metadata_answer("")
    (True, None)
    """
    answer = text.strip().upper()
    if answer == "TRUE":
        return True
    if answer == "FALSE":
        return False
    return None
