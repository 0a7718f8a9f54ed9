"""The scheduler's claims, backed by leases: a step runs only while this runner holds its lease.

For each ready step the scheduler asks :meth:`LeaseClaims.try_claim`:

* the lease is acquired (created, adopted, or taken over when expired or orphaned) or
  the step ``wait``\\ s, and is asked again a poll interval later;
* once the lease is held the status is read: ``SUCCESS`` written by another runner (that
  finished and let go before) means ``done`` and the lease goes back, so a finished step
  is never run twice.

While steps run, one heartbeat thread renews their leases. A renewal that finds another
owner, or renewals failing for longer than the fence period, mark the step lost and call
the ``on_lost`` callback given to :meth:`LeaseClaims.watch` (the scheduler then cancels the
step); :meth:`LeaseClaims.lost` re-reads the lease right before anything is committed. Any
exception in a renewal (a full disk, a read-only file, bytes that are not UTF-8) counts
as a failed renewal; the heartbeat goes on.

Every successful renewal publishes the step's deadline (:mod:`marinbuild.backends.deadlines`),
which something outside the runner enforces, so that a runner that stops renewing (even
one suspended, running nothing) has its steps killed before anyone can take them over. A
lease found in another's hands makes the deadline *now*.

A lease that cannot be created because the store is full, over quota or read-only
(``ENOSPC``, ``EDQUOT``, ``EROFS``) fails its step at once with a line naming the cause:
waiting would not cure it. Other errors reading or writing a lease make the step wait.

Taking over a lease whose owner ran on this machine first kills whatever is left of the
previous attempt (its cgroup, named for its runner, :mod:`marinbuild.backends.local.cgroups`;
its process group and every process carrying its step token,
:mod:`marinbuild.backends.local.containment`), and waits while anything survives. The step's
process is in the lease before the step passes its gate (:meth:`Deadlines.started
<marinbuild.backends.deadlines.Deadlines.started>`).

>>> from marinbuild.store.storage import Storage
>>> claims = LeaseClaims(Storage.for_prefix("memory://claims-doc"))
>>> claims.close()
"""

from __future__ import annotations

import errno
import functools
import os
import threading
from collections.abc import Callable, Mapping

from marinbuild.backends.deadlines import Deadline, deadlines
from marinbuild.backends.local.cgroups import (
    cgroup_emptied,
    cgroup_holds,
    kill_cgroup,
    runner_cgroups,
    runners_cgroup,
    shared_cgroups,
)
from marinbuild.backends.local.containment import (
    carries_token,
    file_ids,
    kill_step_group,
    kill_token,
    process_start,
    step_token,
    writes_to,
)
from marinbuild.errors import LeaseLost, MarinbuildError, StorageError
from marinbuild.graph import StepNode
from marinbuild.store.conditional import conditional_store
from marinbuild.store.lease import (
    Heartbeat,
    Lease,
    LeaseRecord,
    LeaseSettings,
    Owner,
    StepProcess,
    lease_path,
    owner_alive,
)
from marinbuild.store.markers import StatusRecord, read_status
from marinbuild.store.storage import Storage, store_refusal

__all__ = ["LeaseClaims"]


class LeaseClaims:
    """Claims for :class:`~marinbuild.execution.scheduler.Scheduler` over the leases under one store.

    ``stale_success`` maps output paths to ``SUCCESS`` records that must not count as done
    (the steps a forced run is to redo); a different ``SUCCESS`` appearing later does.
    """

    def __init__(
        self,
        storage: Storage,
        settings: LeaseSettings | None = None,
        owner: Owner | None = None,
        stale_success: Mapping[str, StatusRecord] | None = None,
    ) -> None:
        self.storage = storage
        self.settings = settings or LeaseSettings.resolve()
        self.me = owner or Owner.current()
        # Every lease read and write ends well within the fence time, retries included.
        self._store = conditional_store(storage, deadline=self.settings.fence_after / 2)
        self._stale = dict(stale_success or {})
        self._leases: dict[str, Lease] = {}
        self._lost: dict[str, str] = {}
        self._guard = threading.Lock()
        self._on_lost: Callable[[str, str], None] = lambda name, why: None
        self._heartbeat = Heartbeat(self.settings.heartbeat, self._beat)

    def watch(self, on_lost: Callable[[str, str], None]) -> None:
        """Call ``on_lost(step_name, reason)``, from the heartbeat thread, when a lease is lost."""
        self._on_lost = on_lost

    def try_claim(self, node: StepNode) -> tuple[str, str]:
        # The status is read once the lease is held, not also before: a step finished
        # elsewhere is rare, and a read before would cost every step a round trip.
        lease = self._lease_of(node)
        try:
            attempt = lease.try_acquire()
        except (MarinbuildError, IsADirectoryError):
            raise  # a folder where the lease belongs never goes away by itself: the step fails alone
        except Exception as e:  # an unreadable lease file: the step waits, the run goes on
            refusal = store_refusal(e) or _never_heals(e)
            if refusal is not None:  # a full or read-only store does not heal while the step waits
                raise StorageError(f"its lease {lease.path} cannot be created: {refusal}") from e
            return "wait", f"its lease {lease.path} cannot be used ({type(e).__name__}: {e})"
        if not attempt.acquired:
            return "wait", attempt.why
        finished = self._finished_elsewhere(node)
        if finished:
            self.release(node)
            return "done", finished
        with self._guard:
            self._lost.pop(node.name, None)
        self._publish(node.output_path, lease)
        deadlines.keep_records(node.output_path, functools.partial(self._record_step, lease))
        self._heartbeat.start()
        return "go", attempt.why if attempt.took_over is not None else ""

    def lost(self, node: StepNode) -> bool:
        """True unless this runner holds the step's lease, checked in the store right now."""
        with self._guard:
            if node.name in self._lost:
                return True
            lease = self._leases.get(node.name)
        if lease is None:
            return True
        try:
            return not lease.verify()
        except Exception:
            return True  # ownership cannot be confirmed, so nothing may be committed

    def release(self, node: StepNode) -> None:
        """Let the lease go (deleted only if still ours); a store error leaves it to expire."""
        lease = self._forget(node.name)
        if lease is None:
            return
        deadlines.keep_records(node.output_path, None)
        deadlines.withdraw(node.output_path)
        try:
            lease.release()
        except Exception:  # left to expire; the step is over
            pass

    def close(self) -> None:
        """Stop renewing and let every lease still held go."""
        self._heartbeat.stop()
        with self._guard:
            leases = list(self._leases.values())
            self._leases.clear()
        for lease in leases:
            deadlines.keep_records(lease_output(lease), None)
            try:
                lease.release()
            except Exception:
                pass

    def _lease_of(self, node: StepNode) -> Lease:
        with self._guard:
            lease = self._leases.get(node.name)
            if lease is None:
                output = node.output_path
                lease = Lease(self._store, lease_path(output), self.me, self.settings,
                              clear_previous=lambda record: _clear_previous(record, output))
                self._leases[node.name] = lease
            return lease

    def _forget(self, name: str) -> Lease | None:
        with self._guard:
            self._lost.pop(name, None)
            return self._leases.pop(name, None)

    def _finished_elsewhere(self, node: StepNode) -> str | None:
        record = read_status(self.storage, node.output_path)
        stale = self._stale.get(node.output_path)
        # Compared by time: the record to redo may come from the status summary, which holds fewer fields.
        if record is None or not record.succeeded_for(node.identity) or (stale is not None and stale.time == record.time):
            return None
        by = f" by {record.owner}" if record.owner else ""
        return f"finished{by} meanwhile"

    def _beat(self) -> None:
        with self._guard:
            held = [(name, lease) for name, lease in self._leases.items() if lease.held and name not in self._lost]
        for name, lease in held:
            try:
                if lease.renew(deadlines.process(lease_output(lease))):
                    self._publish(lease_output(lease), lease)
                    continue
                reason = "another runner holds its lease now"
                deadlines.publish(lease_output(lease), Deadline.within(0.0))  # it may run there already
            except Exception as e:  # whatever went wrong, this renewal failed
                if not lease.fenced():
                    continue  # keep trying until the fence period is over
                why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                reason = f"its lease could not be renewed for {self.settings.fence_after:g} s ({why})"
            with self._guard:
                if self._leases.get(name) is not lease:
                    continue  # released meanwhile: the step is over
                self._lost[name] = reason
            try:
                self._on_lost(name, reason)
            except Exception:
                pass  # the deadline already published stops the step whatever happens here

    def _record_step(self, lease: Lease, process: StepProcess) -> None:
        """Write the step's process into its lease before the step passes its gate."""
        try:
            # Not a renewal: the step's deadline and this runner's fence keep their times.
            renewed = lease.renew(process, extend=False)
        except Exception as e:
            why = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise StorageError(f"its lease {lease.path} could not record the step's process ({why})") from e
        if not renewed:
            raise LeaseLost(f"another runner holds its lease {lease.path} now")

    def _publish(self, output: str, lease: Lease) -> None:
        left = lease.time_left()
        if left is not None:
            deadlines.publish(output, Deadline.within(left))


_NEVER_HEALS = {
    errno.ENAMETOOLONG: "the path is too long for the file system",
    errno.ENOTDIR: "a file is where a folder belongs",
    errno.EACCES: "this user may not write there",
    errno.EPERM: "this user may not write there",
    errno.ELOOP: "too many symlinks on the way",
}


def _never_heals(error: BaseException) -> str | None:
    """What a lease that can never be made here says (a name too long, a file for a folder, no permission)."""
    if not isinstance(error, OSError) or error.errno not in _NEVER_HEALS:
        return None
    return f"{error.strerror or os.strerror(error.errno)} ({_NEVER_HEALS[error.errno]})"


def lease_output(lease: Lease) -> str:
    """The output path a lease covers (its file is ``OUTPUT/.marinbuild/lease``)."""
    return lease.path.rsplit("/", 2)[0]


def _clear_previous(record: LeaseRecord, output: str) -> str | None:
    """Kill what is left of the step's previous attempt on this machine; what survived, or None.

    Only an owner on this machine, in this pid namespace, can be checked: elsewhere its own
    fences (its sentinel, its guardian, its deadline) are what stops it. A lease file may
    have been written by anyone, so nothing is killed on its word alone: only a cgroup
    named for the owner (pid and start time), a process group one of whose members carries
    the owner's token for this step or writes this step's log, and every process carrying
    that token.
    """
    owner = record.owner
    alive = owner_alive(owner)
    if alive is None:
        return None
    token = step_token(output, owner.pid, owner.started)
    step = record.step if record.step is not None and record.step.here() else None
    # Its cgroups first: they hold everything the step started, whatever it did to its
    # environment or group. A dead runner's steps are all to die, with or without their
    # first process; a live one reuses its cgroups, so only the one holding the step's
    # first process is the step's.
    cgroups: list[str] = []
    if step is not None and runners_cgroup(step.cgroup, owner.pid, owner.started) and (
        not alive or (process_start(step.pid) == step.started and cgroup_holds(step.cgroup, step.pid))
    ):
        cgroups.append(step.cgroup)
    if not alive:
        parents = [os.path.dirname(step.cgroup) if step is not None and step.cgroup else "", shared_cgroups().parent or ""]
        cgroups += runner_cgroups(owner.pid, owner.started, parents)
    survivors: list[str] = []
    for folder in dict.fromkeys(cgroups):
        kill_cgroup(folder)
        if not cgroup_emptied(folder):
            survivors.append(f"cgroup {folder}")
    if step is not None:
        logs = file_ids(Storage.join(output, "logs")) if "://" not in output else frozenset()
        survivors += map(str, kill_step_group(
            step.pid, step.pgid, step.started, lambda pid: carries_token(pid, token) or writes_to(pid, logs)))
    # Then two empty scans in a row before the lease changes hands: a missed process would
    # overlap the next attempt.
    survivors += map(str, kill_token(token, settle=2))
    if not survivors:
        return None
    return f"{len(survivors)} of its step's processes survived SIGKILL ({', '.join(survivors[:5])})"
