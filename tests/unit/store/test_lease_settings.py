"""Unit tests of marinbuild.store.lease_settings: flags, then the environment, then the defaults; the bounds."""

from __future__ import annotations

import pytest

from marinbuild.errors import UserError
from marinbuild.store.lease_settings import MAX_EXPIRY, MIN_EXPIRY, MIN_HEARTBEAT, LeaseSettings, lease_flag_problem


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


def test_settings_from_defaults_environment_and_flags() -> None:
    assert LeaseSettings.resolve(env={}) == LeaseSettings(10.0, 60.0, 5.0)
    env = {"MARINBUILD_LEASE_HEARTBEAT": "2", "MARINBUILD_LEASE_EXPIRY": "9"}
    assert LeaseSettings.resolve(env=env) == LeaseSettings(2.0, 9.0, 2.0)
    assert LeaseSettings.resolve(heartbeat=1, expiry=3, env=env) == LeaseSettings(1.0, 3.0, 1.0)
    assert LeaseSettings.resolve(env={**env, "MARINBUILD_LEASE_POLL": "0.25"}).poll == 0.25
    assert LeaseSettings(10, 60).fence_after == 50
    with pytest.raises(UserError, match="at least twice the heartbeat"):
        LeaseSettings.resolve(heartbeat=10, expiry=15, env={})
    with pytest.raises(UserError, match="number of seconds"):
        LeaseSettings.resolve(env={"MARINBUILD_LEASE_EXPIRY": "soon"})


@pytest.mark.parametrize(("heartbeat", "expiry"), [(10, 60), (1, 2), (0.5, 2), (30, 3600)])
def test_the_kill_deadline_falls_between_the_holders_fence_and_the_earliest_takeover(heartbeat, expiry) -> None:
    s = LeaseSettings(heartbeat=heartbeat, expiry=expiry, poll=1)
    assert s.fence_after < s.kill_after < s.expiry
