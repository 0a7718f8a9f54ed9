"""Unit tests of marinbuild.walltime: wall-time limits learned from a group's earlier runs."""

from __future__ import annotations

import doctest
import json
import os
import uuid
from pathlib import Path

import fsspec
import pytest

import marinbuild.walltime
from marinbuild.resources import WTime
from marinbuild.walltime import MAX_SAMPLES, WallTimeEstimator, estimate_from_samples


def test_no_estimate_before_eight_counted_runs() -> None:
    assert estimate_from_samples([20.0] * 7) is None
    assert estimate_from_samples([20.0] * 7 + [10.0]) is None  # 10 s or less is not counted
    assert estimate_from_samples([20.0] * 8) is not None


def test_estimate_is_mean_plus_sigmas() -> None:
    assert estimate_from_samples([20, 40] * 4) == (80.0, 50.0)


def test_stdev_is_at_least_five_percent_of_the_mean() -> None:
    hard, soft = estimate_from_samples([100.0] * 8)  # type: ignore[misc]
    assert hard == pytest.approx(125.0) and soft == pytest.approx(110.0)


def test_record_and_estimate_through_the_file(tmp_path: Path) -> None:
    path = tmp_path / ".marinbuild" / "walltime.json"
    est = WallTimeEstimator(str(path))
    assert not est.record("g", 5.0)
    for s in [20, 40] * 4:
        assert est.record("g", s)
    assert est.estimate("g") == (80.0, 50.0)
    stored = json.loads(path.read_text())
    assert stored["version"] == 1 and len(stored["groups"]["g"]) == 8
    assert WallTimeEstimator("file://" + str(path)).samples("g") == tuple(float(s) for s in [20, 40] * 4)


def test_resolve_fills_only_missing_limits(tmp_path: Path) -> None:
    est = WallTimeEstimator(str(tmp_path / "w.json"))
    for s in [20, 40] * 4:
        est.record("g", s)
    assert est.resolve(WTime(group="g")) == WTime(T=80, softT=50, group="g")
    explicit = WTime(T=5, group="g")
    assert est.resolve(explicit) is explicit
    assert est.resolve(WTime(group="unknown")) == WTime(group="unknown")


def test_only_the_latest_samples_are_kept(tmp_path: Path) -> None:
    est = WallTimeEstimator(str(tmp_path / "w.json"), max_samples=3)
    for s in (11, 12, 13, 14):
        est.record("g", s)
    assert est.samples("g") == (12.0, 13.0, 14.0)
    assert MAX_SAMPLES == 100


def test_refresh_sees_other_runners_records(tmp_path: Path) -> None:
    path = str(tmp_path / "w.json")
    mine, theirs = WallTimeEstimator(path), WallTimeEstimator(path)
    assert mine.samples("g") == ()
    theirs.record("g", 30)
    assert mine.samples("g") == ()
    mine.refresh()
    assert mine.samples("g") == (30.0,)


@pytest.mark.parametrize("content", ["not json", "[1]", '{"groups": 3}', '{"groups": {"g": "x"}}'])
def test_a_malformed_history_is_empty(tmp_path: Path, content: str) -> None:
    path = tmp_path / "w.json"
    path.write_text(content)
    assert WallTimeEstimator(str(path)).samples("g") == ()


def test_a_store_that_refuses_writes_never_fails_the_step(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    est = WallTimeEstimator(str(tmp_path / "file" / "w.json"))
    assert est.record("g", 30) is False


# -- Tests for wall-time estimation: the rule on given samples, and the history file that keeps them.


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


def test_no_estimate_from_no_runs_or_seven_counted_ones():
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
