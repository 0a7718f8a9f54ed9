"""Unit tests of the drift notes: what changed outside a step's identity, and root changes upstream."""

from __future__ import annotations

import json
from pathlib import Path

from marinbuild.drift import code_record, drift_digest, drift_notes, plain_fields, root_changes, step_drift
from marinbuild.graph import build_graph
from marinbuild.steps import step, versioned
from marinbuild.store.markers import SUCCESS, StatusRecord, info_path, info_text
from marinbuild.store.storage import Storage


def _fn(cfg: object) -> None:
    pass


def test_plain_fields_leave_out_versioned_values_and_references() -> None:
    a = step("a", _fn, {})
    fields = plain_fields({"lr": 0.1, "n": versioned(3), "dep": a, "opt": {"b": [1, 2]}, "none": None})
    assert fields == {"lr": 0.1, "opt.b.0": 1, "opt.b.1": 2, "none": None}


def test_plain_fields_leave_out_values_whose_text_changes_every_run() -> None:
    assert "o" not in plain_fields({"o": object()})


def test_digest_follows_the_code_record() -> None:
    one = code_record(step("s", cmd="echo {x}", config={"x": 1}))
    two = code_record(step("s", cmd="echo {x} ", config={"x": 1}))
    assert drift_digest(one) == drift_digest(dict(one))
    assert drift_digest(one) != drift_digest(two)
    assert drift_digest({"command_template": None}) is None


def test_step_drift_notes_command_and_plain_field_changes() -> None:
    old = code_record(step("s", cmd="echo {x}", config={"x": 1, "y": 2}))
    now = step("s", cmd="echo {x} {y}", config={"x": 5, "y": 2})
    notes = step_drift(now, old)
    assert notes[0].startswith("command changed since the stored run")
    assert notes[1] == "plain field x changed since the stored run (1 -> 5); not part of the identity: --force it or make it versioned"
    assert step_drift(now, code_record(now)) == []
    assert step_drift(now, {}) == []  # an old record says nothing


def test_hash_code_steps_get_no_code_note() -> None:
    old = code_record(step("s", cmd="echo 1", config={}))
    assert step_drift(step("s", cmd="echo 2", config={}, hash_code=True), old) == []


def test_many_plain_changes_are_summed_up() -> None:
    old = code_record(step("s", _fn, {f"k{i}": i for i in range(8)}))
    notes = step_drift(step("s", _fn, {f"k{i}": -i - 1 for i in range(8)}), old)
    assert len(notes) == 6 and notes[-1].startswith("3 more plain fields changed")


def _stored_run(storage: Storage, output: str, info: dict) -> None:
    storage.write_atomic(info_path(output), info_text(info))


def test_drift_notes_read_only_steps_whose_digest_differs(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    old = step("s", cmd="echo {x}", config={"x": 1})
    same = step("t", cmd="echo t", config={})
    graph = build_graph([step("s", cmd="echo {x}", config={"x": 2}), same], storage.prefix)
    s_out, t_out = graph.nodes["s"].output_path, graph.nodes["t"].output_path
    _stored_run(storage, s_out, code_record(old))
    _stored_run(storage, t_out, code_record(same))
    statuses = {
        s_out: StatusRecord(SUCCESS, 1.0, drift=drift_digest(code_record(old))),
        t_out: StatusRecord(SUCCESS, 1.0, drift=drift_digest(code_record(same))),
    }
    found = drift_notes(storage, graph, ["s", "t"], statuses)
    assert list(found.notes) == ["s"] and "plain field x" in found.notes["s"][0]
    assert found.read == 1
    assert drift_notes(storage, graph, ["t"], statuses).read == 0
    assert drift_notes(storage, graph, ["s", "t"]).read == 2  # without statuses everything is read


def test_root_changes_follow_a_dependency_to_the_value_that_changed(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    old_graph = build_graph([step("b", _fn, {"a": step("a", _fn, {"lr": versioned(0.1)})})], storage.prefix)
    for node in old_graph.nodes.values():
        _stored_run(storage, node.output_path, {"identity_payload": node.payload})
    new_graph = build_graph([step("b", _fn, {"a": step("a", _fn, {"lr": versioned(0.2)})})], storage.prefix)
    changes = root_changes(storage, new_graph, new_graph.nodes["b"], old_graph.nodes["b"].payload)
    assert changes == ["a: lr 0.1 -> 0.2"]


def test_root_changes_name_a_dependency_whose_old_run_is_gone(tmp_path: Path) -> None:
    storage = Storage.for_prefix(str(tmp_path))
    old_graph = build_graph([step("b", _fn, {"a": step("a", _fn, {"lr": versioned(1)})})], storage.prefix)
    new_graph = build_graph([step("b", _fn, {"a": step("a", _fn, {"lr": versioned(2)})})], storage.prefix)
    [line] = root_changes(storage, new_graph, new_graph.nodes["b"], old_graph.nodes["b"].payload)
    assert line.startswith("a: changed (identity ") and "its earlier run is gone" in line
    assert json.dumps(line)
