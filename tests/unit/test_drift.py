"""Unit tests of the drift notes: what changed outside a step's identity, and root changes upstream."""

from __future__ import annotations

import json
from pathlib import Path

from marinbuild.drift import code_record, drift_digest, drift_notes, plain_fields, root_changes, step_digest, step_drift
from marinbuild.graph import build_graph
from marinbuild.steps import Step, step, versioned
from marinbuild.store.markers import SUCCESS, StatusRecord, info_path, info_text
from marinbuild.store.storage import Storage
from tests.helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile


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


def test_a_step_is_digested_as_its_code_record_is_whatever_its_config_holds() -> None:
    import enum
    import random

    class Level(enum.IntEnum):
        LOW = 1

    dep = step("dep", cmd="true")
    leaves = [
        "", "plain", "é", "\ud800", 'quote " and \\ backslash', "\x00\n\t", "日本", 0, -1, 2**63, 2**13_288 - 1,
        2**13_288, -(2**13_288), 0.0, -0.0, 0.1, 1e300, 5e-324, float("nan"), float("inf"), float("-inf"), True,
        False, None, dep, versioned(3), Level.LOW, [1, 2], {"x": 1}, (), object(), [dep, dep], (dep,), [dep, 1],
        [dep, [dep]], [versioned(1)],
    ]
    keys = ["a", "b", "B", "a.b", "é", "", "(config)", 0, 1, "dep", "\ud800", " "]
    chooser = random.Random(7)
    configs: list[object] = [{}, {"a": 1}, 3, None, "text", [dep, 1], {"": 1}, {0: "x"}]
    for _ in range(400):
        size = chooser.randint(1, 5)
        configs.append({chooser.choice(keys): chooser.choice(leaves) for _ in range(size)})
    for i, config in enumerate(configs):
        for cmd in ("echo {output}", None, "é \\ \"{x}\""):
            s = step(f"s{i}", cmd=cmd, config=config) if cmd is not None else step(f"s{i}", _fn, config)
            assert step_digest(s) == drift_digest(code_record(s)), (cmd, config)
    # Step(...) itself takes what step() refuses, such as a command that is not text.
    odd = Step(name="odd", cmd=5, config={"x": 1})  # type: ignore[arg-type]
    assert step_digest(odd) == drift_digest(code_record(odd))


def test_a_lowered_limit_on_integer_digits_gives_no_digest_on_either_path() -> None:
    import sys

    s = step("s", cmd="echo {output}", config={"x": 10**1000})
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)
    try:
        assert drift_digest(code_record(s)) is None
        assert step_digest(s) is None
    finally:
        sys.set_int_max_str_digits(before)


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


# -- Drift said out loud: command, function source and plain fields that changed outside the identity.


MARINFILE = """
from marinbuild import step, versioned

def prepare(cfg):
    print("rows", cfg["rows"])

data = step("data", prepare, {"rows": versioned(10), "workers": 4})
train = step("train/model", cmd="echo train {lr} {data}", config={"data": data, "lr": 0.1, "epochs": versioned(2)})
"""

NOTE = "not part of the identity: --force it or make it versioned"


def _plan_and_why(project):
    planned = marinbuild_in_process("plan", cwd=project)
    assert planned.returncode == 0, planned.stderr
    why = marinbuild_in_process("why", "data", "train/model", cwd=project)
    assert why.returncode == 0, why.stderr
    return planned, why


def test_no_note_when_nothing_changed(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", cwd=project).returncode == 0
    planned, why = _plan_and_why(project)
    assert "note:" not in planned.stderr + planned.stdout
    assert "note:" not in why.stdout
    assert "2 to skip" in planned.stdout


def test_changed_command_function_body_and_plain_field_are_noted_without_rerunning(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", cwd=project).returncode == 0
    before = plan_json(project)
    write_marinfile(project, MARINFILE.replace('print("rows", cfg["rows"])', 'print("ROWS:", cfg["rows"])')
                    .replace("echo train {lr}", "echo training {lr}")
                    .replace('"workers": 4', '"workers": 8'))
    after = plan_json(project)
    assert {n: r["identity"] for n, r in after.items()} == {n: r["identity"] for n, r in before.items()}
    assert all(r["action"] == "skip" for r in after.values())
    planned, why = _plan_and_why(project)
    notes = planned.stderr.splitlines()
    assert f"marinbuild: train/model: note: command changed since the stored run; {NOTE}" in notes
    assert f"marinbuild: data: note: function source changed since the stored run; {NOTE}" in notes
    assert f"marinbuild: data: note: plain field workers changed since the stored run (4 -> 8); {NOTE}" in notes
    assert len([n for n in notes if "note:" in n]) == 3
    assert f"  note: command changed since the stored run; {NOTE}" in why.stdout.splitlines()
    assert "train/model is up to date" in why.stdout
    # Nothing reran: a run is still a no-op.
    again = marinbuild("run", cwd=project)
    assert again.returncode == 0 and "nothing to do" in again.stdout


def test_plain_field_of_a_shell_step(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", cwd=project).returncode == 0
    write_marinfile(project, MARINFILE.replace('"lr": 0.1', '"lr": 0.2'))
    planned = marinbuild_in_process("plan", cwd=project)
    assert f"marinbuild: train/model: note: plain field lr changed since the stored run (0.1 -> 0.2); {NOTE}" in planned.stderr
    assert "command changed" not in planned.stderr  # the template is the same; only its value moved


def test_hash_code_puts_the_command_and_function_source_into_the_identity(project):
    write_marinfile(project, MARINFILE)
    plain = plan_json(project)
    hashed_file = MARINFILE.replace('{"rows": versioned(10), "workers": 4})', '{"rows": versioned(10), "workers": 4}, hash_code=True)')
    hashed_file = hashed_file.replace('"epochs": versioned(2)})', '"epochs": versioned(2)}, hash_code=True)')
    write_marinfile(project, hashed_file)
    hashed = plan_json(project)
    assert hashed["data"]["identity"] != plain["data"]["identity"]
    assert marinbuild("run", cwd=project).returncode == 0
    write_marinfile(project, hashed_file.replace("echo train {lr}", "echo training {lr}"))
    changed = plan_json(project)
    assert changed["data"]["action"] == "skip" and changed["train/model"]["action"] == "run"
    why = marinbuild_in_process("why", "train/model", cwd=project)
    assert "note:" not in why.stdout
    write_marinfile(project, hashed_file.replace('print("rows", cfg["rows"])', 'print("ROWS:", cfg["rows"])'))
    edited = plan_json(project)
    assert edited["data"]["action"] == "run" and edited["train/model"]["action"] == "run"


def test_why_names_the_root_change_upstream(project):
    write_marinfile(project, """
    from marinbuild import step, versioned
    tok = step("data/tokenize", cmd="echo {vocab}", config={"vocab": versioned(32000)})
    model = step("train/model", cmd="echo {lr} {tok}", config={"tok": tok, "lr": versioned(0.1)})
    ev = step("eval", cmd="echo {m}", config={"m": model})
    """)
    assert marinbuild("run", cwd=project).returncode == 0
    write_marinfile(project, """
    from marinbuild import step, versioned
    tok = step("data/tokenize", cmd="echo {vocab}", config={"vocab": versioned(32000)})
    model = step("train/model", cmd="echo {lr} {tok}", config={"tok": tok, "lr": versioned(0.2)})
    ev = step("eval", cmd="echo {m}", config={"m": model})
    """)
    why = marinbuild_in_process("why", "eval", cwd=project)
    assert why.returncode == 0, why.stderr
    lines = why.stdout.splitlines()
    assert any(line.strip().startswith("dependency m: train/model-") for line in lines)
    assert "  root change upstream: train/model: lr 0.1 -> 0.2" in lines
    assert not any("data/tokenize" in line for line in lines)
    own = marinbuild_in_process("why", "train/model", cwd=project)
    assert "  lr: 0.1 -> 0.2" in own.stdout.splitlines()
    assert "root change upstream" not in own.stdout


def test_run_says_the_drift_notes_plan_says_once_before_running_or_doing_nothing(project):
    write_marinfile(project, MARINFILE)
    assert marinbuild("run", cwd=project).returncode == 0
    write_marinfile(project, MARINFILE.replace("echo train {lr}", "echo training {lr}"))
    note = f"marinbuild: train/model: note: command changed since the stored run; {NOTE}"
    idle = marinbuild("run", cwd=project)
    assert idle.returncode == 0 and "nothing to do" in idle.stdout
    assert idle.stderr.splitlines().count(note) == 1, idle.stderr
    # Beside a step that does run, the note about the one that does not is said too, once.
    write_marinfile(project, MARINFILE.replace("echo train {lr}", "echo training {lr}")
                    + 'step("extra", cmd="true", config={"k": versioned(1)})\n')
    busy = marinbuild("run", "-q", cwd=project)
    assert busy.returncode == 0 and busy.stdout.startswith("1 done"), busy.stdout + busy.stderr
    assert busy.stderr.splitlines().count(note) == 1, busy.stderr
    dry = marinbuild_in_process("run", "-n", cwd=project)
    assert dry.stderr.splitlines().count(note) == 1, dry.stderr
