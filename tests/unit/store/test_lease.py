"""Unit tests of marinbuild.store.lease: settings, the lease record, verdicts, one lease's lifecycle.

Time is a fake monotonic clock: expiry is judged by observation, so no test sleeps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from marinbuild.errors import StorageError
from marinbuild.execution.claims import LeaseClaims
from marinbuild.graph import build_graph
from marinbuild.steps import step
from marinbuild.store.conditional import LocalConditionalStore, conditional_store
from marinbuild.store.lease import (
    MAX_EXPIRY,
    Heartbeat,
    Lease,
    LeaseRecord,
    LeaseSettings,
    Owner,
    Verdict,
    Watch,
    judge,
    lease_path,
    observe,
    owner_alive,
    read_leases,
    waiting_reason,
)
from marinbuild.store.markers import SUCCESS, StatusRecord, write_status
from marinbuild.store.storage import Storage
from tests.fakes import FakeClock

SETTINGS = LeaseSettings(heartbeat=1.0, expiry=10.0, poll=0.5)


def _owner(nonce: str, pid: int = 1234, host: str = "elsewhere") -> Owner:
    return Owner(host=host, pid=pid, started="1", nonce=nonce, machine="")


def _lease(path: Path, me: Owner, clock: FakeClock, alive=lambda o: None) -> Lease:  # type: ignore[no-untyped-def]
    return Lease(LocalConditionalStore(), str(path), me, SETTINGS, clock=clock, wall=lambda: 1.7e9, alive=alive)


# -- settings ------------------------------------------------------------------------------








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






# -- the step's process, for a taker on this machine --------------------------------------




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
    from marinbuild.store.lease_owner import StepProcess

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


# -- Lease logic with a fake clock: expiry by observation, dead owners, one winner, fencing.


SLOW_SETTINGS = LeaseSettings(heartbeat=10, expiry=60, poll=5)


def elsewhere(nonce: str = "n-elsewhere") -> Owner:
    return Owner(host="another-host", pid=4242, started="77", nonce=nonce, machine="other-boot/pid:[1]")


def memory_storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(f"memory://lease-tests/{tmp_path.name}")


@pytest.fixture(params=["local", "memory"])
def storage(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "out")) if request.param == "local" else memory_storage(tmp_path)




def test_record_round_trip_and_garbage() -> None:
    record = LeaseRecord(Owner.current(), acquired=1.5, renewed=2.5, beat=3, expiry=60.0)
    assert LeaseRecord.from_json(record.to_json()) == record
    assert LeaseRecord.from_json("{not json") is None
    assert LeaseRecord.from_json('{"owner": {"host": "h"}}') is None
    assert record.describe().startswith(f"{record.owner} since ")


def test_expiry_is_judged_by_watching_not_by_the_holders_clock() -> None:
    me = Owner.current()
    # The holder's clock says it renewed in 1970; nobody cares: only the watch counts.
    ancient = LeaseRecord(elsewhere(), acquired=0.0, renewed=0.0, expiry=None)
    watch = observe(None, "v1", now=100.0)
    assert judge(ancient, True, watch, 100.0, me, SLOW_SETTINGS) is Verdict.HELD
    assert judge(ancient, True, observe(watch, "v1", 159.9), 159.9, me, SLOW_SETTINGS) is Verdict.HELD
    assert judge(ancient, True, observe(watch, "v1", 160.0), 160.0, me, SLOW_SETTINGS) is Verdict.EXPIRED
    # A renewal (new version) restarts the watch.
    renewed = observe(watch, "v2", 159.0)
    assert renewed == Watch("v2", 159.0)
    assert judge(ancient, True, renewed, 200.0, me, SLOW_SETTINGS) is Verdict.HELD
    # A holder's clock far in the future changes nothing either.
    future = LeaseRecord(elsewhere(), acquired=4e9, renewed=4e9)
    assert judge(future, True, Watch("v3", 0.0), 61.0, me, SLOW_SETTINGS) is Verdict.EXPIRED


def test_holders_promised_expiry_wins_over_the_waiters_setting() -> None:
    short = LeaseRecord(elsewhere(), acquired=0, renewed=0, expiry=3.0)
    assert judge(short, True, Watch("v", 0.0), 3.0, Owner.current(), SLOW_SETTINGS) is Verdict.EXPIRED
    unreadable_watch = Watch("v", 0.0)
    assert judge(None, True, unreadable_watch, 59.0, Owner.current(), SLOW_SETTINGS) is Verdict.HELD
    assert judge(None, True, unreadable_watch, 60.0, Owner.current(), SLOW_SETTINGS) is Verdict.EXPIRED
    assert judge(None, False, None, 0.0, Owner.current(), SLOW_SETTINGS) is Verdict.FREE




def test_same_host_dead_owner_is_taken_over_without_waiting(storage: Storage) -> None:
    store = conditional_store(storage)
    path = lease_path(Storage.join(storage.prefix, "step-0000000000000000"))
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    me = Owner.current()
    dead = Owner(me.host, child.pid, _start_time_of(child.pid), "dead-runner", me.machine)
    assert store.create(path, LeaseRecord(dead, 1.0, 1.0, expiry=3600).to_json())
    clock = FakeClock()
    lease = Lease(store, path, me, SLOW_SETTINGS, clock=clock)
    assert not lease.try_acquire().acquired  # alive: waits
    child.kill()
    child.wait()
    attempt = lease.try_acquire()  # the clock has not moved at all
    assert attempt.acquired and attempt.took_over is not None
    assert "its runner exited" in attempt.why
    assert LeaseRecord.from_json(store.read(path).text).owner == me  # type: ignore[union-attr]


def _start_time_of(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[19]


def test_waiter_takes_over_only_after_watching_the_whole_expiry(storage: Storage) -> None:
    store = conditional_store(storage)
    path = lease_path(Storage.join(storage.prefix, "s-1"))
    holder_clock, waiter_clock = FakeClock(0.0), FakeClock(5000.0)  # unrelated clocks
    holder = Lease(store, path, elsewhere(), SLOW_SETTINGS, clock=holder_clock, alive=lambda o: None)
    waiter = Lease(store, path, Owner.current(), SLOW_SETTINGS, clock=waiter_clock, alive=lambda o: None)
    assert holder.try_acquire().acquired
    assert waiter.try_acquire().why.startswith("leased by another-host:4242 since")
    waiter_clock.now += 50
    holder_clock.now += 10
    assert holder.renew()  # a renewal restarts the waiter's watch
    waiter_clock.now += 50
    assert not waiter.try_acquire().acquired  # 100 s since first seen, but only 50 s unchanged
    waiter_clock.now += 59
    assert not waiter.try_acquire().acquired
    waiter_clock.now += 1
    assert waiter.try_acquire().acquired
    assert not holder.renew()  # the old holder finds out at its next beat
    assert not holder.held


def test_exactly_one_of_many_contenders_takes_over(storage: Storage) -> None:
    store = conditional_store(storage)
    for round_ in range(5):
        path = lease_path(Storage.join(storage.prefix, f"race-{round_}"))
        assert store.create(path, LeaseRecord(elsewhere(), 0, 0).to_json())
        clock = FakeClock()
        contenders = [Lease(store, path, Owner.current(), SLOW_SETTINGS, clock=clock, alive=lambda o: None)
                      for _ in range(12)]
        for c in contenders:
            assert not c.try_acquire().acquired  # everyone starts watching
        clock.now += SLOW_SETTINGS.expiry
        barrier = threading.Barrier(len(contenders))
        results: list[bool] = []

        def contend(lease: Lease, barrier: threading.Barrier = barrier, results: list[bool] = results) -> None:
            barrier.wait()
            results.append(lease.try_acquire().acquired)

        threads = [threading.Thread(target=contend, args=(c,)) for c in contenders]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results.count(True) == 1
        winner = next(c for c in contenders if c.held)
        assert LeaseRecord.from_json(store.read(path).text).owner == winner.me  # type: ignore[union-attr]


def test_renew_verify_and_release_respect_other_owners(storage: Storage) -> None:
    store = conditional_store(storage)
    path = lease_path(Storage.join(storage.prefix, "s-2"))
    mine = Lease(store, path, Owner.current(), SLOW_SETTINGS, clock=FakeClock())
    assert mine.try_acquire().acquired
    assert mine.verify()
    assert mine.renew()
    assert LeaseRecord.from_json(store.read(path).text).beat == 1  # type: ignore[union-attr]
    # Someone overwrites the lease (a store without preconditions, or a confused operator).
    storage.write_atomic(path, LeaseRecord(elsewhere(), 0, 0).to_json())
    assert not mine.verify()
    assert not mine.renew()
    mine.release()  # must not delete the other owner's lease
    assert LeaseRecord.from_json(store.read(path).text).owner == elsewhere()  # type: ignore[union-attr]


def test_a_holder_that_cannot_renew_is_fenced_before_anyone_may_take_over(tmp_path: Path) -> None:
    storage = memory_storage(tmp_path)
    real = conditional_store(storage)
    clock = FakeClock()

    class Unreachable:
        broken = False

        def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
            method = getattr(real, name)

            def call(*args, **kwargs):  # type: ignore[no-untyped-def]
                if self.broken:
                    raise StorageError("store unreachable")
                return method(*args, **kwargs)

            return call

    store = Unreachable()
    lease = Lease(store, lease_path(storage.prefix + "/s-3"), Owner.current(), SLOW_SETTINGS, clock=clock)  # type: ignore[arg-type]
    assert lease.try_acquire().acquired
    store.broken = True
    clock.now += SLOW_SETTINGS.fence_after - 1
    with pytest.raises(StorageError):
        lease.renew()
    assert not lease.fenced()
    clock.now += 1
    assert lease.fenced()
    store.broken = False
    assert not lease.verify()  # fenced: nothing may be committed even though the store answers again
    assert SLOW_SETTINGS.fence_after < SLOW_SETTINGS.expiry


def test_read_leases_in_one_batch(storage: Storage) -> None:
    store = conditional_store(storage)
    outs = [Storage.join(storage.prefix, f"s{i}-0000000000000000") for i in range(3)]
    record = LeaseRecord(elsewhere(), 1, 2)
    store.create(lease_path(outs[0]), record.to_json())
    store.create(lease_path(outs[1]), "garbage")
    assert read_leases(storage, outs) == {outs[0]: record, outs[1]: None}


def test_heartbeat_ticks_until_stopped() -> None:
    ticks: list[float] = []
    beat = Heartbeat(0.02, lambda: ticks.append(time.monotonic()))
    beat.start()
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop()
    count = len(ticks)
    time.sleep(0.1)
    assert count >= 3 and len(ticks) == count


def _node(storage: Storage, name: str = "train"):  # type: ignore[no-untyped-def]
    graph = build_graph([step(name, cmd="true")], storage.prefix)
    return graph.nodes[name]


def test_claims_go_wait_done(tmp_path: Path) -> None:
    storage = memory_storage(tmp_path)
    node = _node(storage)
    settings = LeaseSettings(heartbeat=0.05, expiry=0.5, poll=0.05)
    first, second = LeaseClaims(storage, settings), LeaseClaims(storage, settings)
    try:
        assert first.try_claim(node) == ("go", "")
        verdict, why = second.try_claim(node)
        assert verdict == "wait" and why.startswith(f"leased by {first.me} since ")
        assert not first.lost(node)
        write_status(storage, node.output_path, SUCCESS, owner=str(first.me))
        first.release(node)
        assert second.try_claim(node) == ("done", f"finished by {first.me} meanwhile")
    finally:
        first.close()
        second.close()


def test_claims_report_a_stolen_lease_through_the_callback(tmp_path: Path) -> None:
    storage = memory_storage(tmp_path)
    node = _node(storage)
    claims = LeaseClaims(storage, LeaseSettings(heartbeat=0.05, expiry=0.5, poll=0.05))
    lost = threading.Event()
    reasons: list[tuple[str, str]] = []
    claims.watch(lambda name, why: (reasons.append((name, why)), lost.set()))
    try:
        assert claims.try_claim(node)[0] == "go"
        # Put as another runner would, never between a renewal's comparison and its write.
        conditional_store(storage).put(lease_path(node.output_path), LeaseRecord(elsewhere(), 0, 0).to_json())
        assert lost.wait(5)
        assert reasons == [("train", "another runner holds its lease now")]
        assert claims.lost(node)
    finally:
        claims.close()
    # Closing let go of nothing that was not ours.
    assert LeaseRecord.from_json(storage.read_text(lease_path(node.output_path)) or "").owner == elsewhere()  # type: ignore[union-attr]


def test_forced_run_does_not_count_the_old_success_as_done(tmp_path: Path) -> None:
    storage = memory_storage(tmp_path)
    node = _node(storage)
    old = write_status(storage, node.output_path, SUCCESS)
    claims = LeaseClaims(storage, LeaseSettings(1, 5, 1), stale_success={node.output_path: old})
    try:
        assert claims.try_claim(node)[0] == "go"
        claims.release(node)
        newer = StatusRecord(SUCCESS, old.time + 1, owner="other:1")
        storage.write_atomic(Storage.join(node.output_path, ".marinbuild", "status"), newer.to_json())
        assert claims.try_claim(node)[0] == "done"
    finally:
        claims.close()


def test_conditional_store_semantics(storage: Storage) -> None:
    store = conditional_store(storage)
    path = Storage.join(storage.prefix, "x", ".marinbuild", "lease")
    assert store.read(path) is None
    v1 = store.create(path, "one")
    assert v1 and store.create(path, "two") is None
    assert store.swap(path, "not-the-version", "two") is None
    v2 = store.swap(path, v1, "two")
    assert v2 and v2 != v1 and store.read(path).text == "two"  # type: ignore[union-attr]
    assert not store.delete(path, v1)
    assert store.delete(path, v2)
    assert store.read(path) is None


# -- deadlines, a heartbeat that never dies, takeovers that check the previous attempt ----




def test_the_heartbeat_survives_an_exception_in_its_tick(capsys: pytest.CaptureFixture[str]) -> None:
    ticks: list[int] = []

    def tick() -> None:
        ticks.append(1)
        if len(ticks) == 1:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")

    beat = Heartbeat(0.02, tick)
    beat.start()
    deadline = time.monotonic() + 5
    while len(ticks) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    beat.stop()
    assert len(ticks) >= 3
    assert "UnicodeDecodeError" in capsys.readouterr().err


def test_claims_publish_the_deadline_of_each_renewal_and_withdraw_it_on_release(tmp_path: Path) -> None:
    from marinbuild.backends.deadlines import deadlines

    storage = Storage.for_prefix(str(tmp_path / "out"))
    node = _node(storage)
    settings = LeaseSettings(heartbeat=0.05, expiry=0.5, poll=0.05)
    claims = LeaseClaims(storage, settings)
    seen = []
    stop = deadlines.subscribe(node.output_path, seen.append)
    try:
        before = time.monotonic()
        assert claims.try_claim(node)[0] == "go"
        first = deadlines.latest(node.output_path)
        read = time.monotonic()
        # Set (by the claim, or a renewal since) within the fence's time of when it was set: not
        # checked against the time left now, which a busy machine may have used up meanwhile.
        assert first is not None and before < first.monotonic <= read + settings.kill_after
        deadline = time.monotonic() + 5
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(seen) >= 3 and seen[-1].monotonic > first.monotonic
        claims.release(node)
        assert deadlines.latest(node.output_path) is None
    finally:
        stop()
        claims.close()


class _BrokenReads:
    """A store whose reads start failing with an error marinbuild does not expect (a bug)."""

    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner
        self.broken = False

    def read(self, path: str):  # type: ignore[no-untyped-def]
        if self.broken:
            raise RuntimeError("a bug in a storage layer")
        return self.inner.read(path)

    def __getattr__(self, name: str):  # type: ignore[no-untyped-def]
        return getattr(self.inner, name)


def test_a_renewal_failing_with_any_exception_fences_the_step(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path / "out"))
    node = _node(storage)
    settings = LeaseSettings(heartbeat=0.05, expiry=0.5, poll=0.05)
    claims = LeaseClaims(storage, settings)
    broken = claims._store = _BrokenReads(claims._store)  # type: ignore[assignment]
    lost = threading.Event()
    reasons: list[str] = []
    claims.watch(lambda name, why: (reasons.append(why), lost.set()))
    try:
        assert claims.try_claim(node)[0] == "go"
        broken.broken = True
        assert lost.wait(5)
        assert reasons == [f"its lease could not be renewed for {settings.fence_after:g} s "
                           "(RuntimeError: a bug in a storage layer)"]
        assert claims.lost(node)
    finally:
        claims.close()


def test_a_takeover_on_this_machine_first_kills_what_is_left_of_the_previous_attempt(tmp_path: Path) -> None:
    from marinbuild.backends.local.containment import TOKEN_VAR, step_token
    from marinbuild.execution.claims import _clear_previous

    storage = Storage.for_prefix(str(tmp_path / "out"))
    store = conditional_store(storage)
    output = Storage.join(storage.prefix, "step-0000000000000000")
    path = lease_path(output)
    runner = subprocess.Popen([sys.executable, "-c", "pass"])
    runner_started = _start_time_of(runner.pid)  # read while it runs... or before it is reaped
    runner.wait()
    me = Owner.current()
    dead = Owner(me.host, runner.pid, runner_started, "dead-runner", me.machine)
    # The dead runner's step, in a session of its own, still runs: not reaped by anyone yet.
    token = step_token(output, dead.pid, dead.started)
    leftover = subprocess.Popen(["sleep", "300"], start_new_session=True, env={TOKEN_VAR: token})
    try:
        # A leftover step has been running a while: wait until the kernel shows its token.
        deadline = time.monotonic() + 10
        while token.encode() not in Path(f"/proc/{leftover.pid}/environ").read_bytes():
            assert time.monotonic() < deadline, "the leftover never showed its token"
            time.sleep(0.01)
        assert store.create(path, LeaseRecord(dead, 1.0, 1.0, expiry=3600).to_json())
        lease = Lease(store, path, me, SLOW_SETTINGS, clock=FakeClock(), clear_previous=lambda r: _clear_previous(r, output))
        attempt = lease.try_acquire()
        assert attempt.acquired and "its runner exited" in attempt.why
        # It was killed before the lease changed hands (only reaping is left).
        try:
            code = leftover.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        assert code == -9, (
            f"the leftover {leftover.pid} outlived the takeover ({attempt.why}); "
            f"owner alive: {owner_alive(dead)}, its stat: {Path(f'/proc/{leftover.pid}/stat').read_text()[:80]!r}"
        )
    finally:
        leftover.kill()
        leftover.wait()


def test_a_ctrl_c_inside_the_heartbeats_start_leaves_stop_nothing_to_join(monkeypatch: pytest.MonkeyPatch) -> None:
    """A signal handler raising inside ``Thread.start`` must not make ``stop`` raise "cannot join
    thread before it is started"; a later start still renews."""
    from marinbuild.store.lease import Heartbeat

    ticks = threading.Event()
    beat = Heartbeat(0.01, ticks.set)

    def interrupted(self: threading.Thread) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(threading.Thread, "start", interrupted)
    with pytest.raises(KeyboardInterrupt):
        beat.start()
    monkeypatch.undo()
    beat.stop()
    again = Heartbeat(0.01, ticks.set)
    beat.start()  # stopped: starts, and its stop event ends it at once
    again.start()
    assert ticks.wait(10)
    again.stop()
    beat.stop()
