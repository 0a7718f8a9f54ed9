"""The gang's outcome: hangs classified and explained, the same error of many hosts said once."""

from __future__ import annotations

from marinbuild.backends.base import Cause
from marinbuild.backends.tpu.gang_outcome import GangOutcome, HostOutcome


def _outcome(*hosts: HostOutcome, **kw: object) -> GangOutcome:
    return GangOutcome(hosts=hosts, cancelled=False, started_at=0.0, ended_at=5.0, **kw)  # type: ignore[arg-type]


def test_a_gang_torn_down_for_no_progress_is_a_hang_and_says_when_it_last_moved() -> None:
    torn = HostOutcome("h0", 0, 0, exit_code=-1, torn_down=True)
    hung = _outcome(torn, hung=True, last_progress_at=1.0, progress_timeout=3.0, first_failed=None)
    assert hung.classification is Cause.HANG
    assert hung.summary().startswith("hang: no progress on any host for 3 s (last moved at ")
    # Without the flag the same teardown reads as the program's failure.
    assert _outcome(torn).classification is Cause.FAILED


def test_a_preempted_host_makes_a_hung_gang_a_preemption() -> None:
    gone = HostOutcome("h1", 0, 1, exit_code=None, connection_lost=True, reachable=False)
    assert _outcome(HostOutcome("h0", 0, 0, exit_code=-1), gone, hung=True).classification is Cause.PREEMPTED


def test_the_same_error_of_several_hosts_is_said_once_with_the_host_count() -> None:
    hosts = [HostOutcome(f"10.0.0.{i}", 0, i, infra_error=f"10.0.0.{i}: cannot connect to 10.0.0.{i}:22: connection refused")
             for i in range(2, 11)]
    summary = _outcome(*hosts).summary()
    assert summary == ("10.0.0.2: cannot connect to 10.0.0.2:22: connection refused "
                       "(the same on 8 more hosts: 10.0.0.3, 10.0.0.4, 10.0.0.5, …)")
    mixed = _outcome(HostOutcome("a", 0, 0, infra_error="a: key refused"), HostOutcome("b", 0, 1, infra_error="b: disk full"))
    assert mixed.summary() == "a: key refused; b: disk full"
