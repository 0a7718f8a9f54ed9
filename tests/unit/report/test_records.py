"""Unit tests of marinbuild.report.records: each step's stored record gathered from its output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from marinbuild.execution.session import load
from marinbuild.report.records import collect, describe_retries, flatten
from marinbuild.steps import step, versioned
from marinbuild.store.attempt_ledger import LEDGER
from marinbuild.store.markers import FAILED, SUCCESS, info_path, info_text, write_status
from marinbuild.store.storage import Storage

LEDGER_TEXT = {
    "attempts": [
        {"attempt": 1, "class": "PREEMPTED", "started_at": "2026-01-01T00:00:00+00:00", "ended_at": "2026-01-01T00:30:00+00:00",
         "duration_s": 1800, "host": "h1", "backend": "tpu", "runner": "box", "held": {"cores": 0, "tpu_chips": 8}},
        {"attempt": 2, "class": "SUCCESS", "started_at": "2026-01-01T00:31:00+00:00", "ended_at": "2026-01-01T01:31:00+00:00",
         "duration_s": 3600, "host": "h2", "held": {"cores": 0, "tpu_chips": 8}, "message": "ok"},
        {"attempt": 3, "class": "FAILED", "started_at": "2026-01-01T02:00:00+00:00", "ended_at": "2026-01-01T02:10:00+00:00"},
    ],
    "retries": {"preemption": {"used": 1, "max": 100}, "bogus": "x"},
}


def test_flatten() -> None:
    assert flatten({"loss": 0.5, "eval": {"acc": 0.9, "f1": [1, 2]}, "empty": {}}) == {
        "loss": 0.5, "eval.acc": 0.9, "eval.f1.0": 1, "eval.f1.1": 2, "empty": {}}
    assert flatten(3) == {"value": 3}


def test_describe_retries() -> None:
    assert describe_retries(None) == ""
    assert describe_retries({"failure": {"used": 0, "max": 1}, "infra": {"used": 0, "max": 2}}) == "failures 0/1"
    assert describe_retries({"infra": {"used": 2, "max": 2}}) == "infra 2/2"


def test_collect_reads_status_info_ledger_and_metrics(tmp_path: Path) -> None:
    train = step("train", cmd="true", config={"opt": versioned({"lr": 0.1})})
    never = step("never", cmd="true", config={"m": train})
    project = load(steps=[never], prefix=str(tmp_path))
    storage = project.storage
    out = project.graph.nodes["train"].output_path
    write_status(storage, out, SUCCESS, name="train", identity=project.graph.nodes["train"].identity, duration=5400.0)
    storage.write_atomic(info_path(out), info_text({"held": {"cores": 0, "tpu_chips": 8}}))
    storage.write_atomic(Storage.join(out, LEDGER), json.dumps(LEDGER_TEXT))
    storage.write_atomic(Storage.join(out, "metrics.json"), json.dumps({"loss": 0.25, "eval": {"acc": 0.75}}))
    train_rec, never_rec = collect(project, ["train", "never"], metrics_file="metrics.json")
    assert (train_rec.status, train_rec.duration, train_rec.versioned) == (SUCCESS, 5400.0, {"opt.lr": 0.1})
    assert train_rec.metrics == {"loss": 0.25, "eval.acc": 0.75} and train_rec.error is None
    assert [(a.number, a.kind, a.backend, a.host) for a in train_rec.attempts] == [
        (1, "PREEMPTED", "tpu", "h1"), (2, "SUCCESS", "local", "h2"), (3, "FAILED", "local", "?")]
    assert train_rec.attempts[2].duration_s == 600.0  # from its times when the entry has none
    assert [a.usage.chip_hours for a in train_rec.attempts[:2]] == [4.0, 8.0]
    assert train_rec.retries == {"preemption": {"used": 1, "max": 100}}
    assert (never_rec.status, never_rec.attempts, never_rec.deps) == ("NONE", (), ("train",))


def test_a_failed_step_carries_its_error(tmp_path: Path) -> None:
    project = load(steps=[step("bad", cmd="exit 1")], prefix=str(tmp_path))
    node = project.graph.nodes["bad"]
    write_status(project.storage, node.output_path, FAILED, error="exit 1", name="bad", identity=node.identity)
    [rec] = collect(project, ["bad"])
    assert (rec.status, rec.error, rec.attempts, rec.metrics) == (FAILED, "exit 1", (), {})


@pytest.mark.parametrize(("info", "ledger"), [
    ('"x"', "5"), ("[1, 2]", '"x"'), ("5", '{"attempts": 5, "retries": [1]}'), ("null", "[{}]"),
])
def test_records_of_the_wrong_json_type_read_as_empty(tmp_path: Path, info: str, ledger: str) -> None:
    project = load(steps=[step("a", cmd="true")], prefix=str(tmp_path))
    node = project.graph.nodes["a"]
    write_status(project.storage, node.output_path, SUCCESS, name="a", identity=node.identity, duration=2.0)
    project.storage.write_atomic(info_path(node.output_path), info + "\n")
    project.storage.write_atomic(Storage.join(node.output_path, LEDGER), ledger + "\n")
    [rec] = collect(project, ["a"])
    assert (rec.status, rec.duration, rec.attempts, rec.held, rec.retries, rec.provenance) == (
        SUCCESS, 2.0, (), None, None, {})


def test_a_provisioning_timeout_of_the_wrong_type_is_not_formatted_as_a_number() -> None:
    assert describe_retries({"provisioning": {"used": 2, "timeout_s": "x"}}) == "provisioning 2 (within 0 s)"
