"""Tests for wall-time estimation: the rule on given samples, and the history file that keeps them."""

from __future__ import annotations

import doctest
import json
import os
import uuid

import fsspec
import pytest

import marinbuild.walltime
from marinbuild.resources import WTime
from marinbuild.walltime import WallTimeEstimator, estimate_from_samples


def test_docstring_examples_hold():
    assert doctest.testmod(marinbuild.walltime).failed == 0


# --- the rule ------------------------------------------------------------------------------------


def test_mean_plus_five_and_two_population_stdevs():
    # mean 30, population stdev 10 (the sample stdev would be 10.69)
    assert estimate_from_samples([20, 40] * 4) == (80.0, 50.0)
    # mean 40, population stdev 10
    assert estimate_from_samples([30, 50, 30, 50, 30, 50, 30, 50]) == (90.0, 60.0)
    # mean 60, population stdev 20
    assert estimate_from_samples([40, 80] * 6) == (160.0, 100.0)


def test_no_estimate_before_eight_counted_runs():
    assert estimate_from_samples([]) is None
    assert estimate_from_samples([20, 40, 20, 40, 20, 40, 20]) is None


def test_runs_of_ten_seconds_or_less_do_not_count():
    assert estimate_from_samples([20, 40] * 3 + [10, 10.0, 3, 0]) is None
    assert estimate_from_samples([20, 40] * 4 + [10, 1, 2]) == (80.0, 50.0)
    assert estimate_from_samples([20, 40] * 3 + [10.5, 10.5]) is not None


def test_nearly_equal_runs_still_leave_a_margin():
    # stdev 0 would put the hard limit at the mean; it is taken as 5 % of the mean instead
    assert estimate_from_samples([100] * 8) == (125.0, 110.0)


# --- the history file ------------------------------------------------------------------------------


@pytest.fixture
def local_url(tmp_path):
    return str(tmp_path / "prefix" / ".marinbuild" / "walltime.json")


def _record_all(est: WallTimeEstimator, group: str, runs) -> None:
    for seconds in runs:
        est.record(group, seconds)


def test_estimate_after_eight_runs_and_persisted_across_instances(local_url):
    est = WallTimeEstimator(local_url)
    _record_all(est, "tok", [20, 40] * 3 + [20])
    assert est.estimate("tok") is None
    est.record("tok", 40)
    assert est.estimate("tok") == (80.0, 50.0)
    later = WallTimeEstimator(local_url)
    assert later.samples("tok") == (20.0, 40.0) * 4
    assert later.estimate("tok") == (80.0, 50.0)
    assert later.estimate("other") is None


def test_short_runs_are_not_recorded(local_url, tmp_path):
    est = WallTimeEstimator(local_url)
    assert est.record("tok", 10) is False
    assert est.record("tok", 0.2) is False
    assert est.samples("tok") == ()
    assert not list(tmp_path.rglob("walltime.json"))
    assert est.record("tok", 10.01) is True
    assert WallTimeEstimator(local_url).samples("tok") == (10.01,)


def test_only_the_last_samples_are_kept(local_url):
    est = WallTimeEstimator(local_url, max_samples=10)
    _record_all(est, "g", range(11, 26))
    assert WallTimeEstimator(local_url).samples("g") == tuple(float(s) for s in range(16, 26))


def test_groups_are_kept_apart_in_one_file(local_url):
    est = WallTimeEstimator(local_url)
    est.record("a", 11)
    est.record("b", 22)
    with open(local_url) as f:
        data = json.load(f)
    assert data == {"version": 1, "groups": {"a": [11.0], "b": [22.0]}}


def test_local_writes_leave_no_temporary_files(local_url, tmp_path):
    est = WallTimeEstimator(local_url)
    _record_all(est, "g", [11, 12, 13])
    assert [p.name for p in (tmp_path / "prefix" / ".marinbuild").iterdir()] == ["walltime.json"]


def test_record_merges_what_another_runner_wrote(local_url):
    mine, theirs = WallTimeEstimator(local_url), WallTimeEstimator(local_url)
    mine.record("g", 11)
    theirs.record("g", 12)
    mine.record("g", 13)
    assert WallTimeEstimator(local_url).samples("g") == (11.0, 12.0, 13.0)
    assert theirs.samples("g") == (11.0, 12.0)  # cached until refreshed
    theirs.refresh()
    assert theirs.samples("g") == (11.0, 12.0, 13.0)


@pytest.mark.parametrize("garbage", ["{not json", "[1, 2]", '{"groups": 3}', '{"groups": {"g": "x"}}'])
def test_an_unreadable_history_counts_as_empty_and_is_replaced(local_url, tmp_path, garbage):
    target = tmp_path / "prefix" / ".marinbuild"
    target.mkdir(parents=True)
    (target / "walltime.json").write_text(garbage)
    est = WallTimeEstimator(local_url)
    assert est.samples("g") == ()
    est.record("g", 30)
    assert WallTimeEstimator(local_url).samples("g") == (30.0,)


def test_a_store_that_cannot_be_read_is_left_alone(local_url, caplog):
    os.makedirs(local_url)  # a directory where the file should be: reading fails with OSError
    est = WallTimeEstimator(local_url)
    assert est.record("g", 30) is False
    assert est.estimate("g") is None
    assert os.path.isdir(local_url)
    assert "not updated" in caplog.text


def test_works_on_any_fsspec_url():
    url = f"memory://wt-{uuid.uuid4().hex}/.marinbuild/walltime.json"
    est = WallTimeEstimator(url)
    _record_all(est, "g", [20, 40] * 4)
    assert WallTimeEstimator(url).estimate("g") == (80.0, 50.0)
    fs, path = fsspec.core.url_to_fs(url)
    assert json.loads(fs.cat_file(path))["groups"]["g"][0] == 20.0


def test_resolve_fills_limits_only_when_none_are_given(local_url):
    est = WallTimeEstimator(local_url)
    assert est.resolve(WTime(group="g")) == WTime(group="g")  # no estimate yet: unlimited
    _record_all(est, "g", [20, 40] * 4)
    assert est.resolve(WTime(group="g")) == WTime(T=80, softT=50, group="g")
    explicit = WTime(T=600, group="g")
    assert est.resolve(explicit) == explicit
    assert est.resolve(WTime(T=5)) == WTime(T=5)
