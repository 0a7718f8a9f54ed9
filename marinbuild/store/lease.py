"""Leases on output paths: one runner runs a step, a dead runner's step is taken over.

A lease is a small JSON file at ``OUT/.marinbuild/lease`` naming its owner (host, pid, the
process's start time, a random nonce) with the times it was acquired and last renewed by
the owner's clock, a beat counter, and the expiry the owner promises to honour. It is
created with create-if-absent and renewed with compare-and-swap
(:mod:`marinbuild.store.conditional`), so that of several contenders exactly one wins.

Nobody compares clocks. A waiter judges a lease stale when it has *watched* the lease's
version stay the same for the expiry period, measured on its own monotonic clock; every
renewal changes the version and restarts the watch. A lease whose owner is a process on
this same machine that no longer exists (same pid with another start time counts as gone)
is taken over at once. The holder, for its part, counts itself fenced once its renewals
have failed for ``expiry - heartbeat`` seconds, before any waiter can have taken over.

The decisions are pure functions of what was read and the time they are given
(:func:`judge`); :class:`Lease` does the reading and writing; only :class:`Heartbeat` sleeps.

>>> from marinbuild.store.conditional import conditional_store
>>> from marinbuild.store.storage import Storage
>>> store = conditional_store(Storage.for_prefix("memory://lease-doc"))
>>> mine = Lease(store, "memory://lease-doc/out/.marinbuild/lease", Owner.current())
>>> mine.try_acquire().acquired
True
>>> theirs = Lease(store, mine.path, Owner.current(nonce="someone-else"))
>>> theirs.try_acquire().why.startswith("leased by")
True
"""

from __future__ import annotations

import enum
import json
import math
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from marinbuild.store.conditional import ConditionalStore, Versioned
from marinbuild.store.json_text import loads_or_none, number_or_none
from marinbuild.store.lease_owner import Owner, StepProcess, owner_alive, process_running
from marinbuild.store.lease_settings import (
    DEFAULT_EXPIRY,
    DEFAULT_HEARTBEAT,
    DEFAULT_POLL,
    MAX_EXPIRY,
    MIN_EXPIRY,
    MIN_HEARTBEAT,
    LeaseSettings,
    lease_flag_problem,
)
from marinbuild.store.markers import MARKER_DIR, read_texts
from marinbuild.store.retry import each_request_within
from marinbuild.store.storage import Storage

__all__ = [
    "DEFAULT_EXPIRY",
    "DEFAULT_HEARTBEAT",
    "DEFAULT_POLL",
    "MIN_HEARTBEAT",
    "Attempt",
    "Heartbeat",
    "Lease",
    "LeaseRecord",
    "LeaseSettings",
    "Owner",
    "StepProcess",
    "Verdict",
    "Watch",
    "judge",
    "lease_flag_problem",
    "lease_path",
    "observe",
    "owner_alive",
    "process_running",
    "read_leases",
    "waiting_reason",
]


def _parse_step(o: object) -> StepProcess | None:
    if not isinstance(o, dict):
        return None
    pid, pgid = o.get("pid"), o.get("pgid")
    for n in (pid, pgid):
        if isinstance(n, bool) or not isinstance(n, int) or not 1 < n < _MAX_PID:
            return None  # 0, 1 or -1 would name this group, init or every process to kill(2)
    assert isinstance(pid, int) and isinstance(pgid, int)
    fields = [_shown(o.get(k, "")) for k in ("host", "started", "boot_id", "pid_ns", "cgroup")]
    if not all(fields[:4]):
        return None
    return StepProcess(fields[0], pid, pgid, fields[1], fields[2], fields[3], fields[4])


# -- the lease file ------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaseRecord:
    """The content of a lease file. Times are the owner's wall clock, shown, never compared."""

    owner: Owner
    acquired: float
    renewed: float
    beat: int = 0
    expiry: float | None = None
    """The expiry the owner renews within, so that waiters with other settings agree."""
    step: StepProcess | None = None
    """The step's process, written from the first renewal after the step started."""

    def to_json(self) -> str:
        # vars(), not dataclasses.asdict: that deep-copies, a tenth of a millisecond a write.
        fields = {**vars(self), "owner": vars(self.owner)}
        if self.step is None:
            del fields["step"]
        else:
            fields["step"] = vars(self.step)
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> LeaseRecord | None:
        """Parse a lease; None for anything unreadable (a holder that cannot be named).

        A lease may come from another host, a bug or a hand edit, so every field is
        checked and clamped to a sane range before anything decides on it: times that are
        not finite become 0 (shown as unknown), an expiry is kept within
        [:data:`MIN_EXPIRY`, :data:`MAX_EXPIRY`] (a waiter never waits forever) or dropped
        when it is no positive number, and an owner without a plausible pid is no owner.
        """
        raw = loads_or_none(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("owner"), dict):
            return None
        owner = _parse_owner(raw["owner"])
        if owner is None:
            return None
        return cls(
            owner,
            _wall_time(raw.get("acquired")),
            _wall_time(raw.get("renewed")),
            _lease_count(raw.get("beat")),
            _expiry(raw.get("expiry")),
            _parse_step(raw.get("step")),
        )

    def describe(self) -> str:
        """``host:pid since 2024-05-01 12:00:00``, for plans and waiting messages."""
        return f"{self.owner} since {_clock_text(self.acquired)}"


_MAX_PID = 1 << 22  # Linux's pid_max ceiling
_LATEST_WALL = 32503680000.0  # year 3000: later is a corrupt clock; localtime() overflows far past it


def _parse_owner(o: dict[str, object]) -> Owner | None:
    pid, nonce = o.get("pid"), o.get("nonce")
    if isinstance(pid, bool) or not isinstance(pid, int) or not 0 < pid < _MAX_PID:
        return None  # pid 0 or -1 would name a process group, or every process, to kill(2)
    if not isinstance(nonce, str) or not nonce or not isinstance(o.get("host"), str):
        return None
    return Owner(_shown(o["host"]), pid, _shown(o.get("started", "")), nonce[:200], _shown(o.get("machine", "")))


def _shown(value: object) -> str:
    text = value if isinstance(value, str) else ""
    if not text.isprintable():  # a terminal escape in a host name must not reach a terminal
        text = text.encode("unicode_escape").decode("ascii")
    return text[:200]


def _wall_time(value: object) -> float:
    t = number_or_none(value)
    return t if t is not None and math.isfinite(t) and 0 <= t <= _LATEST_WALL else 0.0


def _lease_count(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 62 else 0


def _expiry(value: object) -> float | None:
    seconds = number_or_none(value)
    if seconds is None or math.isnan(seconds) or seconds <= 0:
        return None  # no promise at all: the waiter's own expiry applies
    return min(max(seconds, MIN_EXPIRY), MAX_EXPIRY)


def _clock_text(t: float) -> str:
    if t <= 0:
        return "an unknown time"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def lease_path(output: str) -> str:
    """Where the lease of an output path lives."""
    return Storage.join(output, MARKER_DIR, "lease")


def read_leases(
    storage: Storage, outputs: Iterable[str], problems: dict[str, str] | None = None
) -> dict[str, LeaseRecord | None]:
    """The lease files present among ``outputs``, in one batched read; None if unreadable.

    ``problems``, when given, receives ``PATH: what is wrong`` for each lease file that is
    present but cannot be used (not UTF-8, a folder, not a lease), keyed by output path.
    """
    by_path = {lease_path(o): o for o in outputs}
    with each_request_within(LeaseSettings().fence_after / 2):  # a lease is judged from a read that did not hang
        texts, unreadable = read_texts(storage, by_path)
    out: dict[str, LeaseRecord | None] = {by_path[p]: None for p in unreadable}
    for p, text in texts.items():
        out[by_path[p]] = record = LeaseRecord.from_json(text)
        if record is None and problems is not None:
            problems[by_path[p]] = f"{p}: not a lease (unreadable JSON or owner)"
    if problems is not None:
        problems.update({by_path[p]: f"{p}: {why}" for p, why in unreadable.items()})
    return out


# -- deciding ------------------------------------------------------------------------------


class Verdict(enum.StrEnum):
    FREE = "free"
    """Nobody holds it."""
    MINE = "mine"
    """It names this runner (a write whose answer was lost, or a lease adopted back)."""
    HELD = "held"
    """Another runner holds it, as far as anyone can tell."""
    EXPIRED = "expired"
    """Seen unchanged for the whole expiry period: take it over."""
    ORPHANED = "orphaned"
    """Its owner ran on this machine and has exited: take it over now."""


@dataclass(frozen=True)
class Watch:
    """A waiter's memory of a lease: the version it saw, and since when (its monotonic clock)."""

    version: str
    since: float


def observe(watch: Watch | None, version: str, now: float) -> Watch:
    """The watch after seeing ``version`` at ``now``: kept while the version stays the same."""
    if watch is not None and watch.version == version:
        return watch
    return Watch(version, now)


def judge(
    record: LeaseRecord | None,
    present: bool,
    watch: Watch | None,
    now: float,
    me: Owner,
    settings: LeaseSettings,
    alive: Callable[[Owner], bool | None] = owner_alive,
) -> Verdict:
    """Decide about a lease from what was read (``present``, ``record``) and the watch so far.

    ``record`` is None for an absent or unreadable lease; ``watch`` must already include
    the current observation (see :func:`observe`).
    """
    if not present:
        return Verdict.FREE
    if record is not None:
        if record.owner.same(me):
            return Verdict.MINE
        if alive(record.owner) is False:
            return Verdict.ORPHANED
    expiry = record.expiry if record is not None and record.expiry else settings.expiry
    if watch is not None and now - watch.since >= expiry:
        return Verdict.EXPIRED
    return Verdict.HELD


def waiting_reason(
    holder: str,
    record: LeaseRecord | None,
    watch: Watch | None,
    now: float,
    settings: LeaseSettings,
    wall: Callable[[], float] = time.time,
) -> str:
    """Whom a waiter waits for and when it will take over, for the waiting line.

    The text stays the same while the holder renews (a runner prints it only when it
    changes); a lease seen unrenewed for longer than two heartbeats adds the time of the
    takeover, by this runner's wall clock.
    """
    expiry = record.expiry if record is not None and record.expiry else settings.expiry
    reason = f"leased by {holder}; taken over if not renewed for {expiry:g} s"
    if watch is not None and now - watch.since > 2 * settings.heartbeat:
        takeover = wall() + max(0.0, expiry - (now - watch.since))
        reason += f" (not renewed lately: taking over at {_clock_text(takeover)})"
    return reason


# -- one runner's lease on one path ------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """The result of :meth:`Lease.try_acquire`."""

    acquired: bool
    why: str
    holder: LeaseRecord | None = None
    took_over: LeaseRecord | None = None


@dataclass(frozen=True)
class _Held:
    version: str
    record: LeaseRecord
    renewed_at: float
    """This runner's monotonic time when the last successful write was *sent*."""


class Lease:
    """One runner's lease on one output path: acquire, renew, verify, release.

    ``clock`` is monotonic and judges expiry; ``wall`` only fills the times shown to people.
    """

    def __init__(
        self,
        store: ConditionalStore,
        path: str,
        me: Owner,
        settings: LeaseSettings = LeaseSettings(),
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        alive: Callable[[Owner], bool | None] = owner_alive,
        clear_previous: Callable[[LeaseRecord], str | None] = lambda record: None,
    ) -> None:
        self.store = store
        self.path = path
        self.me = me
        self.settings = settings
        self._clock = clock
        self._wall = wall
        self._alive = alive
        self._clear_previous = clear_previous
        self._held: _Held | None = None
        self._watch: Watch | None = None
        self._lock = threading.Lock()  # state changes only: renewals run on the heartbeat thread
        # One renewal at a time: a step's start records its process from another thread than
        # the heartbeat's, and two swaps from one version would make the loser look lost.
        self._renewing = threading.Lock()

    @property
    def held(self) -> bool:
        return self._held is not None

    @property
    def record(self) -> LeaseRecord | None:
        held = self._held
        return held.record if held is not None else None

    def try_acquire(self) -> Attempt:
        """Take the lease if it is free, ours, expired by observation, or orphaned."""
        sent = self._clock()
        # A lease never seen is most likely free: try to create it straight away. One that
        # is being watched is most likely still held: read it first.
        seen = self.store.read(self.path) if self._watch is not None else None
        if seen is None:
            fresh = self._fresh_record()
            version = self.store.create(self.path, fresh.to_json())
            if version is not None:
                return self._took(version, fresh, sent, "acquired")
            seen = self.store.read(self.path)
            if seen is None:
                return Attempt(False, "the lease changed hands while it was read; looking again")
        return self._contend(seen, sent)

    def _contend(self, seen: Versioned, sent: float) -> Attempt:
        record = LeaseRecord.from_json(seen.text)
        now = self._clock()
        self._watch = observe(self._watch, seen.version, now)
        verdict = judge(record, True, self._watch, now, self.me, self.settings, self._alive)
        holder = record.describe() if record is not None else "an unreadable lease"
        if verdict is Verdict.MINE:
            assert record is not None
            return self._took(seen.version, record, sent, "acquired (it already named this runner)")
        if verdict is Verdict.HELD:
            return Attempt(
                False, waiting_reason(holder, record, self._watch, now, self.settings, self._wall), holder=record
            )
        if record is not None:
            # Its processes may live on after their runner (a zombie, a guardian still killing).
            survivors = self._clear_previous(record)
            if survivors is not None:
                return Attempt(False, f"{holder} is gone but {survivors}; waiting for them to exit", holder=record)
        fresh = self._fresh_record()
        version = self.store.swap(self.path, seen.version, fresh.to_json())
        if version is None:
            return Attempt(False, f"another runner took over the lease of {holder} first", holder=record)
        why = "its runner exited" if verdict is Verdict.ORPHANED else "not renewed within its expiry"
        return replace(self._took(version, fresh, sent, f"took over from {holder}: {why}"), took_over=record)

    def _fresh_record(self) -> LeaseRecord:
        now = self._wall()
        return LeaseRecord(self.me, acquired=now, renewed=now, beat=0, expiry=self.settings.expiry)

    def _took(self, version: str, record: LeaseRecord, sent: float, why: str) -> Attempt:
        with self._lock:
            self._held = _Held(version, record, sent)
        self._watch = None
        return Attempt(True, why)

    def renew(self, step: StepProcess | None = None, extend: bool = True) -> bool:
        """Write the next beat if the lease is still ours; False once it is not.

        ``step``, when given, is the process now running the step, recorded from this beat on.
        ``extend=False`` writes it without counting as a renewal: the fence and the step's
        deadline keep running from the last renewal (a step's start records its process).
        Reads first, so that an owner change is noticed even on a store that ignores
        preconditions; the swap then catches a change between the read and the write.
        Raises :class:`~marinbuild.errors.StorageError` when the store cannot be reached.
        """
        with self._renewing:
            return self._renew(step, extend)

    def _renew(self, step: StepProcess | None, extend: bool) -> bool:
        held = self._held
        if held is None:
            return False
        sent = self._clock()
        seen = self.store.read(self.path)
        version = None
        record = replace(held.record, renewed=self._wall(), beat=held.record.beat + 1, step=step or held.record.step)
        if seen is not None and seen.version == held.version:
            version = self.store.swap(self.path, held.version, record.to_json())
        with self._lock:
            if self._held is not held:
                return self._held is not None  # released meanwhile: release cleans up
            self._held = _Held(version, record, sent if extend else held.renewed_at) if version is not None else None
            return version is not None

    def time_left(self) -> float | None:
        """Seconds until the work under this lease must have stopped (None when not held)."""
        held = self._held
        if held is None:
            return None
        return held.renewed_at + self.settings.kill_after - self._clock()

    def fenced(self) -> bool:
        """True once renewals have failed for too long to be sure nobody took over."""
        held = self._held
        return held is None or self._clock() - held.renewed_at >= self.settings.fence_after

    def verify(self) -> bool:
        """Right before committing: the lease names this runner in the store now, and is not fenced.

        The owner is compared, not the version, so that a renewal in flight on the
        heartbeat thread does not make a held lease look lost.
        """
        if self._held is None or self.fenced():
            return False
        seen = self.store.read(self.path)
        record = LeaseRecord.from_json(seen.text) if seen is not None else None
        return record is not None and record.owner.same(self.me) and self._held is not None

    def release(self) -> None:
        """Delete the lease if it is still ours; forget it either way."""
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            return
        expected = held.version
        for _ in range(3):  # a renewal in flight may have moved the version on
            if self.store.delete(self.path, expected):
                return
            seen = self.store.read(self.path)
            record = LeaseRecord.from_json(seen.text) if seen is not None else None
            if seen is None or record is None or not record.owner.same(self.me):
                return
            expected = seen.version


class Heartbeat:
    """The loop that renews: calls ``tick`` every ``interval`` seconds on its own thread.

    It is the one place in lease handling that sleeps; it runs in the driver, on the same
    machine as the local steps it keeps leased.
    """

    def __init__(self, interval: float, tick: Callable[[], None]) -> None:
        self.interval = interval
        self.tick = tick
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._starting = threading.Lock()

    def start(self) -> None:
        with self._starting:  # claims are taken on several threads at once on a remote store
            if self._thread is None:
                thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
                # Kept once started: a Ctrl-C inside start() leaves nothing for stop() to join
                # (joining a thread never started raises), and the stop event ends it if it runs.
                thread.start()
                self._thread = thread

    def _run(self) -> None:
        next_due = time.monotonic() + self.interval
        while not self._stop.wait(max(0.0, next_due - time.monotonic())):
            next_due = time.monotonic() + self.interval
            try:
                self.tick()
            except Exception:  # the tick counts its own failures; this thread must not end
                traceback.print_exc(file=sys.stderr)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
