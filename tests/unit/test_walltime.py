"""Unit tests of marinbuild.walltime: wall-time limits learned from a group's earlier runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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
