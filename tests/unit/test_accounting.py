"""Unit tests of marinbuild.accounting: what attempts held, for how long, and estimates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.accounting import (
    Usage,
    attempt_usage,
    estimate,
    estimates_for,
    held_by,
    parse_time,
    run_attempts,
)
from marinbuild.graph import build_graph
from marinbuild.resources import Cores, Gpus, ResourceConfig
from marinbuild.steps import step, versioned
from marinbuild.store.markers import info_path, info_text
from marinbuild.store.storage import Storage


def test_held_by_each_kind_of_resource() -> None:
    assert held_by(None) == {"cores": 1}
    assert held_by(Cores(3), cores=(0, 1, 2))["cores"] == 3
    assert held_by(ResourceConfig.with_tpu("v4-32", slice_count=2)) == {
        "cores": 0, "tpu_type": "v4-32", "slices": 2, "tpu_chips": 32, "tpu_hosts": 8}
    assert held_by(Gpus(2, "H100")) == {"cores": 1, "gpus": 2, "gpu_type": "H100"}


def test_attempt_usage_is_duration_times_what_was_held() -> None:
    u = attempt_usage({"duration_s": 1800, "held": {"cores": 2, "gpus": 1, "tpu_chips": 4}})
    assert (u.hours, u.core_hours, u.gpu_hours, u.chip_hours, u.accelerator_hours) == (0.5, 1.0, 0.5, 2.0, 2.5)
    assert attempt_usage({"duration_s": 3600}, fallback={"cores": 4}).core_hours == 4.0
    assert attempt_usage({"duration_s": -5, "held": {"cores": 1}}) == Usage()
    assert attempt_usage({"duration_s": 3600, "held": {"cores": True, "gpus": "2"}}).core_hours == 0.0


def test_an_attempt_that_got_no_hosts_held_nothing() -> None:
    # A queued resource that went FAILED for capacity: the attempt waited, nothing ran on TPUs.
    waited = {"duration_s": 3600, "cause": "provisioning", "held": {"cores": 0, "tpu_chips": 16}}
    ran = {"duration_s": 1800, "cause": "success", "held": {"cores": 0, "tpu_chips": 16}}
    assert attempt_usage(waited) == Usage()
    assert (attempt_usage(waited) + attempt_usage(ran)).chip_hours == 8.0


def test_usage_adds_and_renders() -> None:
    total = Usage(1, 2, 3, 4) + Usage(1, 1, 1, 1)
    assert total == Usage(2, 3, 4, 5)
    assert total.to_json() == {"hours": 2, "core_hours": 3, "gpu_hours": 4, "tpu_chip_hours": 5, "accelerator_hours": 9}


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1970-01-01T00:01:00+00:00", 60.0), (5, 5.0), ("not a time", None), (None, None)],
)
def test_parse_time(text: object, seconds: float | None) -> None:
    assert parse_time(text) == seconds


def test_run_attempts_keeps_those_started_within_the_run() -> None:
    entries = [{"started_at": t} for t in (50.0, 100.0, 150.0, 300.0)] + [{"started_at": "bad"}]
    assert run_attempts(entries, {"start_time": 100.0, "end_time": 200.0}) == [{"started_at": 100.0}, {"started_at": 150.0}]
    assert run_attempts(entries, None) == entries
    assert len(run_attempts(entries, {"start_time": 100.0})) == 3


def test_estimate_is_the_median_of_each() -> None:
    assert estimate([]) is None
    e = estimate([(10.0, Usage(1, 0, 0, 4.0)), (30.0, Usage(1, 0, 0, 8.0)), (20.0, Usage(1, 0, 0, 6.0))])
    assert e is not None and (e.runs, e.duration_s, e.usage.chip_hours) == (3, 20.0, 6.0)
    assert e.to_json()["duration_s"] == 20.0


def test_estimates_from_earlier_successful_runs_of_the_same_step(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    durations = {1: 3600.0, 2: 7200.0}
    for n, duration in durations.items():
        node = build_graph([step("train", cmd="true", config={"n": versioned(n)})], storage.prefix).nodes["train"]
        info = {"name": "train", "start_time": 0.0, "end_time": duration, "duration": duration,
                "held": {"cores": 2}}
        storage.write_atomic(info_path(node.output_path), info_text(info))
    failed = build_graph([step("train", cmd="true", config={"n": versioned(9)})], storage.prefix).nodes["train"]
    storage.write_atomic(info_path(failed.output_path), json.dumps({"duration": 1.0, "error": "boom"}))
    graph = build_graph([step("train", cmd="true", config={"n": versioned(3)}), step("new", cmd="true")], storage.prefix)
    found = estimates_for(storage, graph, ["train", "new"])
    assert found["new"] is None
    train = found["train"]
    assert train is not None and train.runs == 2
    assert train.duration_s == 5400.0 and train.usage.core_hours == 3.0
