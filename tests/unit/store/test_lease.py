"""Unit tests of marinbuild.store.lease: settings, the lease record, verdicts, one lease's lifecycle.

Time is a fake monotonic clock: expiry is judged by observation, so no test sleeps.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from marinbuild.errors import UserError
from marinbuild.store.conditional import LocalConditionalStore
from marinbuild.store.lease import (
    MAX_EXPIRY,
    MIN_EXPIRY,
    MIN_HEARTBEAT,
    Heartbeat,
    Lease,
    LeaseRecord,
    LeaseSettings,
    Owner,
    Verdict,
    Watch,
    judge,
    lease_flag_problem,
    lease_path,
    observe,
    owner_alive,
    read_leases,
    waiting_reason,
)
from marinbuild.store.storage import Storage
from tests.fakes import FakeClock

SETTINGS = LeaseSettings(heartbeat=1.0, expiry=10.0, poll=0.5)


def _owner(nonce: str, pid: int = 1234, host: str = "elsewhere") -> Owner:
    return Owner(host=host, pid=pid, started="1", nonce=nonce, machine="")


def _lease(path: Path, me: Owner, clock: FakeClock, alive=lambda o: None) -> Lease:  # type: ignore[no-untyped-def]
    return Lease(LocalConditionalStore(), str(path), me, SETTINGS, clock=clock, wall=lambda: 1.7e9, alive=alive)


# -- settings ------------------------------------------------------------------------------


def test_settings_flags_then_env_then_defaults() -> None:
    assert LeaseSettings.resolve(env={}) == LeaseSettings()
    s = LeaseSettings.resolve(env={"MARINBUILD_LEASE_HEARTBEAT": "2", "MARINBUILD_LEASE_EXPIRY": "8"})
    assert (s.heartbeat, s.expiry, s.poll) == (2.0, 8.0, 2.0)
    assert LeaseSettings.resolve(heartbeat=1, expiry=4, env={"MARINBUILD_LEASE_HEARTBEAT": "2"}).heartbeat == 1.0


@pytest.mark.parametrize(
    ("kw", "env", "problem"),
    [
        ({"heartbeat": 5, "expiry": 6}, {}, "at least twice the heartbeat"),
        ({"heartbeat": 0}, {}, "must be positive"),
        ({"heartbeat": float("nan")}, {}, "must be positive"),
        ({"expiry": MAX_EXPIRY * 2}, {}, "at most"),
        ({}, {"MARINBUILD_LEASE_EXPIRY": "soon"}, "MARINBUILD_LEASE_EXPIRY must be a number"),
    ],
)
def test_bad_settings_are_one_clear_error(kw: dict, env: dict, problem: str) -> None:
    with pytest.raises(UserError, match=problem):
        LeaseSettings.resolve(env=env, **kw)


def test_fence_comes_before_the_kill_and_the_kill_before_takeover() -> None:
    s = LeaseSettings(heartbeat=10, expiry=60)
    assert s.fence_after == 50
    assert s.fence_after < s.kill_after < s.expiry


# -- the record ----------------------------------------------------------------------------


def test_record_round_trips() -> None:
    record = LeaseRecord(_owner("n1"), acquired=1.0, renewed=2.0, beat=3, expiry=20.0)
    assert LeaseRecord.from_json(record.to_json()) == record


@pytest.mark.parametrize(
    "text",
    ["not json", "[]", '{"owner": 1}', '{"owner": {"pid": 0, "nonce": "n", "host": "h"}}',
     '{"owner": {"pid": -1, "nonce": "n", "host": "h"}}', '{"owner": {"pid": 5, "nonce": "", "host": "h"}}',
     '{"owner": {"pid": true, "nonce": "n", "host": "h"}}'],
)
def test_records_without_a_plausible_owner_are_none(text: str) -> None:
    assert LeaseRecord.from_json(text) is None


def test_hostile_fields_are_clamped() -> None:
    raw = {"owner": {"pid": 7, "nonce": "n", "host": "h\x1b[31m"}, "acquired": float("inf"), "renewed": "x",
           "beat": -4, "expiry": 1e12}
    record = LeaseRecord.from_json(json.dumps(raw).replace("Infinity", "1e999"))
    assert record is not None
    assert record.acquired == 0.0 and record.renewed == 0.0 and record.beat == 0
    assert record.expiry == MAX_EXPIRY
    assert record.owner.host.isprintable()
    assert "unknown time" in record.describe()
    tiny = LeaseRecord.from_json(json.dumps({**raw, "expiry": 0.001}))
    assert tiny is not None and tiny.expiry == 1.0


def test_owner_alive_for_this_process_and_another_host() -> None:
    assert owner_alive(Owner.current()) is True
    assert owner_alive(_owner("n")) is None  # another host: cannot tell
    me = Owner.current()
    assert Owner.current().same(me) is False  # a fresh nonce is another runner
    assert Owner.current(nonce=me.nonce).same(me)


# -- verdicts -------------------------------------------------------------------------------


def test_judge() -> None:
    me, other = _owner("me"), _owner("other")
    held = LeaseRecord(other, 1.0, 1.0, expiry=10.0)
    watch = observe(None, "v1", 0.0)
    assert judge(None, False, None, 0.0, me, SETTINGS) is Verdict.FREE
    assert judge(LeaseRecord(me, 1.0, 1.0), True, watch, 0.0, me, SETTINGS) is Verdict.MINE
    assert judge(held, True, watch, 5.0, me, SETTINGS, alive=lambda o: None) is Verdict.HELD
    assert judge(held, True, watch, 10.0, me, SETTINGS, alive=lambda o: None) is Verdict.EXPIRED
    assert judge(held, True, watch, 0.0, me, SETTINGS, alive=lambda o: False) is Verdict.ORPHANED
    # An unreadable lease expires by the waiter's own settings.
    assert judge(None, True, watch, 10.0, me, SETTINGS) is Verdict.EXPIRED


def test_observe_keeps_the_watch_while_the_version_stays() -> None:
    w = observe(None, "v1", 1.0)
    assert observe(w, "v1", 5.0) is w
    assert observe(w, "v2", 5.0) == Watch("v2", 5.0)


def test_waiting_reason_says_when_takeover_comes() -> None:
    record = LeaseRecord(_owner("o"), 1.0, 1.0, expiry=10.0)
    fresh = waiting_reason("h:1", record, Watch("v", 0.0), 1.0, SETTINGS)
    assert fresh == "leased by h:1; taken over if not renewed for 10 s"
    late = waiting_reason("h:1", record, Watch("v", 0.0), 5.0, SETTINGS, wall=lambda: 0.0)
    assert "not renewed lately: taking over at" in late


# -- one lease -------------------------------------------------------------------------------


def test_acquire_renew_verify_release(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    lease = _lease(tmp_path / "lease", _owner("me"), clock)
    attempt = lease.try_acquire()
    assert attempt.acquired and attempt.why == "acquired"
    assert lease.held and lease.verify()
    assert lease.renew()
    assert lease.record is not None and lease.record.beat == 1
    clock.now += 2
    assert lease.time_left() == pytest.approx(SETTINGS.kill_after - 2)
    lease.release()
    assert not lease.held and not (tmp_path / "lease").exists()


def test_a_held_lease_makes_others_wait_until_it_expires_unrenewed(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    holder = _lease(tmp_path / "lease", _owner("a"), clock)
    waiter = _lease(tmp_path / "lease", _owner("b"), clock)
    assert holder.try_acquire().acquired
    first = waiter.try_acquire()
    assert not first.acquired and "leased by elsewhere:1234" in first.why
    clock.now += 5
    assert holder.renew()  # renewed: the waiter's watch starts again
    assert not waiter.try_acquire().acquired
    clock.now += 9
    assert not waiter.try_acquire().acquired
    clock.now += 1
    taken = waiter.try_acquire()
    assert taken.acquired and "not renewed within its expiry" in taken.why
    assert taken.took_over is not None and taken.took_over.owner.nonce == "a"
    assert not holder.renew()  # the old holder finds out
    assert not holder.held


def test_an_orphaned_lease_is_taken_over_at_once(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    assert _lease(tmp_path / "lease", _owner("dead"), clock).try_acquire().acquired
    waiter = _lease(tmp_path / "lease", _owner("b"), clock, alive=lambda o: False)
    attempt = waiter.try_acquire()
    assert attempt.acquired and "its runner exited" in attempt.why


def test_survivors_of_the_previous_holder_block_the_takeover(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    assert _lease(tmp_path / "lease", _owner("dead"), clock).try_acquire().acquired
    waiter = Lease(LocalConditionalStore(), str(tmp_path / "lease"), _owner("b"), SETTINGS, clock=clock,
                   alive=lambda o: False, clear_previous=lambda r: "2 processes survived")
    attempt = waiter.try_acquire()
    assert not attempt.acquired and "2 processes survived" in attempt.why


def test_a_lease_naming_this_runner_is_adopted(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    me = _owner("me")
    assert _lease(tmp_path / "lease", me, clock).try_acquire().acquired
    again = _lease(tmp_path / "lease", me, clock).try_acquire()
    assert again.acquired and "already named this runner" in again.why


def test_fenced_after_failed_renewals(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    lease = _lease(tmp_path / "lease", _owner("me"), clock)
    lease.try_acquire()
    assert not lease.fenced()
    clock.now += SETTINGS.fence_after
    assert lease.fenced() and not lease.verify()


def test_release_leaves_another_runners_lease_alone(tmp_path: Path) -> None:
    clock = FakeClock(100.0)
    mine = _lease(tmp_path / "lease", _owner("me"), clock)
    mine.try_acquire()
    (tmp_path / "lease").write_text(LeaseRecord(_owner("other"), 1.0, 1.0).to_json())
    mine.release()
    assert (tmp_path / "lease").exists()


def test_read_leases_reports_unreadable_ones(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    good, bad, none = (str(tmp_path / n) for n in ("good", "bad", "none"))
    storage.write_atomic(lease_path(good), LeaseRecord(_owner("o"), 1.0, 1.0).to_json())
    storage.write_atomic(lease_path(bad), "garbage")
    problems: dict[str, str] = {}
    found = read_leases(storage, [good, bad, none], problems)
    assert set(found) == {good, bad}
    assert found[good] is not None and found[bad] is None
    assert set(problems) == {bad} and "not a lease" in problems[bad]


def test_heartbeat_ticks_on_its_thread_until_stopped() -> None:
    ticked = threading.Event()
    beat = Heartbeat(0.01, ticked.set)
    beat.start()
    beat.start()  # once only
    assert ticked.wait(5)
    beat.stop()
    assert beat._thread is not None and not beat._thread.is_alive()


def test_lease_path_is_under_the_marker_folder() -> None:
    assert lease_path("/p/s-1") == os.path.join("/p/s-1", ".marinbuild", "lease")


@pytest.mark.parametrize(
    ("heartbeat", "expiry", "problem"),
    [
        (1e-9, None, "must be at least 0.1 s"),
        (float("nan"), None, "must be positive"),
        (None, 0.5, "must be at least 1 s"),
        (None, 1e9, "must be at most 3600 s"),
        (5, 6, "at least twice the heartbeat"),
    ],
)
def test_lease_flag_problem_names_the_bound(heartbeat: float | None, expiry: float | None, problem: str) -> None:
    found = lease_flag_problem(heartbeat, expiry)
    assert found is not None and problem in found


def test_lease_flag_problem_accepts_the_bounds_themselves() -> None:
    assert lease_flag_problem(MIN_HEARTBEAT, MIN_EXPIRY) is None
    assert lease_flag_problem(None, MAX_EXPIRY) is None and lease_flag_problem() is None


# -- the step's process, for a taker on this machine --------------------------------------


def test_the_steps_process_round_trips_and_is_here_only_in_this_pid_namespace() -> None:
    from marinbuild.store.lease import StepProcess

    step = StepProcess.of(os.getpid(), os.getpgid(0), "/sys/fs/cgroup/x")
    assert step.started and step.boot_id and step.pid_ns.startswith("pid:[")
    record = LeaseRecord(_owner("n1"), acquired=1.0, renewed=2.0, step=step)
    text = record.to_json()
    assert json.loads(text)["step"]["pgid"] == os.getpgid(0)
    assert LeaseRecord.from_json(text) == record
    assert step.here()
    # A container on this host: the same boot id, another pid namespace. Its pids mean nothing here.
    from dataclasses import replace

    assert not replace(step, pid_ns="pid:[1]").here()
    assert not replace(step, boot_id="another-boot").here()
    assert not replace(step, host="elsewhere").here()
    assert "step" not in json.loads(LeaseRecord(_owner("n1"), acquired=1.0, renewed=2.0).to_json())


@pytest.mark.parametrize("step", [
    {"pid": 0, "pgid": 5}, {"pid": 5, "pgid": -1}, {"pid": 5, "pgid": 1}, {"pid": True, "pgid": 5},
    {"pid": 5, "pgid": 5, "started": ""}, "not an object",
])
def test_a_step_record_that_could_name_the_wrong_processes_is_dropped(step: object) -> None:
    full = {"host": "h", "started": "12", "boot_id": "b", "pid_ns": "pid:[3]"}
    raw = {"owner": {"pid": 7, "nonce": "n", "host": "h"}, "step": {**full, **step} if isinstance(step, dict) else step}
    record = LeaseRecord.from_json(json.dumps(raw))
    assert record is not None and record.step is None


def test_a_renewal_records_the_steps_process_from_then_on(tmp_path: Path) -> None:
    from marinbuild.store.lease import StepProcess

    store = LocalConditionalStore()
    lease = Lease(store, str(tmp_path / "lease"), _owner("me"))
    assert lease.try_acquire().acquired
    step = StepProcess.of(os.getpid(), os.getpgid(0))
    assert lease.renew(step)
    assert lease.renew()  # a later beat without news keeps it
    seen = store.read(str(tmp_path / "lease"))
    assert seen is not None
    record = LeaseRecord.from_json(seen.text)
    assert record is not None and record.step == step and record.beat == 2
