"""A queued resource asked for and waited on until ACTIVE, and why one never got there.

:func:`create_answered` sends the create on a thread of its own, so that a cancel need not
wait for the API's answer; :func:`wait_active` asks after the queued resource each poll,
saying meanwhile what it waits for, until it is ACTIVE, FAILED (:func:`failure_of` judges
why), gone, cancelled, or ``provision_timeout`` has passed.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

from marinbuild.backends.tpu.cluster import GcpSettings
from marinbuild.backends.tpu.held_resources import HeldResource, note_answered, note_asked
from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.tpu_api import QueuedResourceInfo, QueuedResourceSpec, TpuApi, TpuApiError
from marinbuild.errors import MarinbuildError

__all__ = ["CapacityUnavailable", "ProvisionCancelled", "StepApi", "create_answered", "failure_of", "wait_active"]

_FAILED_STATES = frozenset({"FAILED", "SUSPENDING", "SUSPENDED"})
_FINAL_CODES = {3: "invalid configuration", 5: "not found", 7: "permission denied", 9: "failed precondition",
                11: "out of range", 12: "unimplemented", 16: "not authenticated"}
"""``google.rpc.Code`` values of a FAILED queued resource that no retry changes."""
_QUOTA = re.compile(r"[Qq]uota '?([A-Za-z0-9_.-]+)'? (?:exhausted|exceeded)")
_REPORT_EVERY_S = 30.0  # a line while waiting, even when the state stays the same
_WAITING = {"CREATING": "waiting for capacity", "ACCEPTED": "waiting for capacity",
            "WAITING_FOR_RESOURCES": "waiting for capacity", "PROVISIONING": "provisioning"}
_CREATE_CHECK_S = 0.1
"""How often a step waiting for the API to answer its create looks whether it was cancelled."""


class CapacityUnavailable(MarinbuildError):
    """The queued resource went FAILED (no capacity) or did not turn ACTIVE within ``provision_timeout``.

    ``final``: it failed for a reason no wait for capacity helps (a quota exhausted, an invalid
    configuration): the step fails in one line instead of retrying until ``provision_timeout``.
    """

    def __init__(self, message: str, *, timed_out: bool = False, final: bool = False) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.final = final


class ProvisionCancelled(MarinbuildError):
    """The step was cancelled while its slices were being provisioned."""


def failure_of(name: str, state: str, code: int, error: str | None) -> CapacityUnavailable:
    """A FAILED queued resource, judged by its error code and message.

    >>> failure_of("q", "FAILED", 8, "Quota 'TPUV4sPod' exhausted. Limit 32").final
    True
    >>> failure_of("q", "FAILED", 8, "There is no more capacity in the zone").final
    False
    """
    why = error or f"queued resource is {state}"
    quota = _QUOTA.search(why)
    if quota is not None:
        return CapacityUnavailable(f"queued resource {name} {state}: quota {quota.group(1)} exhausted ({why}); "
                                   "ask for more quota or a smaller slice", final=True)
    if code in _FINAL_CODES:
        return CapacityUnavailable(f"queued resource {name} {state}: {_FINAL_CODES[code]}: {why}", final=True)
    if code == 4:  # DEADLINE_EXCEEDED: its valid-until bound (provision_timeout) passed on the server
        return CapacityUnavailable(f"queued resource {name} {state}: {why}", timed_out=True)
    return CapacityUnavailable(f"queued resource {name} {state}: {why}")


@dataclass(frozen=True)
class StepApi:
    """How one step's provisioning asks the TPU API, and tells what it sees."""

    api: TpuApi
    gcp: GcpSettings
    report: Callable[[str], None]
    """A line for the step's log."""
    on_phase: Callable[[str, float, str], None]
    """Hears ``(phase, since, queued resource)`` on each change."""
    show: Callable[[str], None]
    """What the live view shows of the step now ("waiting for capacity (12 s)")."""
    clock: Callable[[], float]
    poll: float
    board: ZoneBoard | None
    """The run's shared look at the zone's queued resources (None: the step asks for its own)."""

    def look(self, name: str, since: float) -> QueuedResourceInfo | None:
        """The queued resource as the run's shared list has it; asked for by name when the list lacks it."""
        if self.board is None:
            return self.api.get(name)
        return self.board.get(name, since=since) or self.api.get(name)


def create_answered(asking: StepApi, spec: QueuedResourceSpec, record: HeldResource, key: str,
                    cancel: threading.Event, delete_late: Callable[[], None]) -> object:
    """Ask for the queued resource; its create's operation, once the API has answered.

    The API may hold a create for a long while; a stopping runner waits only so long for its
    steps. Cancelled first, this raises :class:`ProvisionCancelled` and leaves the create to
    finish on its own thread, which calls ``delete_late`` once answered (a failed create made
    nothing, or its delete says so); at exit, one never answered is named for ``marinbuild tpu down``.
    """
    def abandoned() -> None:
        record.delete_error = "cancelled before the TPU API answered its create"
        asking.report(f"queued resource {spec.name}: cancelled before the TPU API answered its create; "
                      "it is deleted if it is made while this run goes on, else named as the run exits")

    call = _PendingCreate(asking.api, spec, key, delete_late)
    threading.Thread(target=call.run, name=f"create-{spec.name}", daemon=True).start()
    while not call.answered.wait(_CREATE_CHECK_S):
        if cancel.is_set() and call.abandon(then=abandoned):
            # Not deleted now: a delete before the create is acted on finds nothing.
            raise ProvisionCancelled(f"cancelled while the TPU API had not answered the create of {spec.name}")
    if call.failed is not None:
        raise call.failed
    return call.operation


class _PendingCreate:
    """One create request on its own thread: answered, or abandoned by a cancel before that."""

    def __init__(self, api: TpuApi, spec: QueuedResourceSpec, key: str, delete_late: Callable[[], None]) -> None:
        self.api, self.spec, self.key, self.delete_late = api, spec, key, delete_late
        self.answered = threading.Event()
        self.operation: object = None
        self.failed: BaseException | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        note_asked(key)

    def run(self) -> None:
        try:
            self.operation = self.api.create(self.spec)
        except BaseException as e:
            self.failed = e
        with self._lock:
            self.answered.set()
            late = self._abandoned
        note_answered(self.key)
        if late:
            self.delete_late()

    def abandon(self, then: Callable[[], None]) -> bool:
        """Give up waiting for the answer, calling ``then`` before a late answer is acted on;
        False when the answer came meanwhile."""
        with self._lock:
            if self.answered.is_set():
                return False
            self._abandoned = True
            then()
            return True


def wait_active(asking: StepApi, spec: QueuedResourceSpec, created_at: float, deadline: float, operation: object,
                cancel: threading.Event) -> None:
    """Until the queued resource is ACTIVE: :class:`CapacityUnavailable` when it went FAILED or
    away, or ``deadline`` passed; :class:`ProvisionCancelled` when ``cancel`` is set meanwhile."""
    last: str | None = None
    next_report = 0.0
    while True:
        try:
            info = asking.look(spec.name, created_at)
        except TpuApiError as e:
            if not e.transient:
                raise
            # A burst of "try again": the queued resource keeps its place; ask again later.
            info, state = None, last or "WAITING_FOR_RESOURCES"
            asking.report(f"queued resource {spec.name}: the TPU API answers \"try again\"; still waiting ({e})")
        else:
            state = info.state if info is not None else "DELETED"
            if state == "ACTIVE":
                return
            if info is None and not _creating(asking, spec, operation):
                raise CapacityUnavailable(f"queued resource {spec.name} {state}: queued resource is {state}")
            if info is not None and state in _FAILED_STATES:
                raise failure_of(spec.name, state, info.error_code, info.error)
        now = asking.clock()
        phase = _WAITING.get(state, "waiting for capacity" if state == "DELETED" else state.lower())
        shown = f"{phase} ({now - created_at:.0f} s)"
        asking.show(shown)
        if state != last or now >= next_report:
            asking.report(f"queued resource {spec.name} ({spec.count} x {spec.tpu_type}): {shown}")
            if state != last:
                asking.on_phase(phase, now, spec.name)
            last, next_report = state, now + _REPORT_EVERY_S
        if now >= deadline:
            raise CapacityUnavailable(
                f"queued resource {spec.name} not ACTIVE within provision_timeout "
                f"({asking.gcp.provision_timeout:g} s; last state {state})", timed_out=True,
            )
        if cancel.wait(min(asking.poll, max(0.0, deadline - now))):
            raise ProvisionCancelled(f"cancelled while queued resource {spec.name} was {state}")


def _creating(asking: StepApi, spec: QueuedResourceSpec, operation: object) -> bool:
    """A queued resource that is not there: whether its create's operation still runs.

    An operation that ended with an error raises it, classified: the API refused what was
    asked for (a runtime version, a topology), which asking again does not change.
    """
    done, error = asking.api.operation_state(operation, f"creating queued resource {spec.name}")
    if error is not None:
        raise TpuApiError(f"TPU API: creating queued resource {spec.name} failed in project "
                          f"{asking.gcp.project}: {error}", final=True)
    return not done
