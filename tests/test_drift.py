"""Drift said out loud: command, function source and plain fields that changed outside the identity."""

from __future__ import annotations

from .helpers import marinbuild, plan_json, write_marinfile

MARINFILE = """
from marinbuild import step, versioned

def prepare(cfg):
    print("rows", cfg["rows"])

data = step("data", prepare, {"rows": versioned(10), "workers": 4})
train = step("train/model", cmd="echo train {lr} {data}", config={"data": data, "lr": 0.1, "epochs": versioned(2)})
"""

NOTE = "not part of the identity: --force it or make it versioned"


def _plan_and_why(project):
    planned = marinbuild("plan", cwd=project)
    assert planned.returncode == 0, planned.stderr
    why = marinbuild("why", "data", "train/model", cwd=project)
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
    planned = marinbuild("plan", cwd=project)
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
    why = marinbuild("why", "train/model", cwd=project)
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
    why = marinbuild("why", "eval", cwd=project)
    assert why.returncode == 0, why.stderr
    lines = why.stdout.splitlines()
    assert any(line.strip().startswith("dependency m: train/model-") for line in lines)
    assert "  root change upstream: train/model: lr 0.1 -> 0.2" in lines
    assert not any("data/tokenize" in line for line in lines)
    own = marinbuild("why", "train/model", cwd=project)
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
    dry = marinbuild("run", "-n", cwd=project)
    assert dry.stderr.splitlines().count(note) == 1, dry.stderr
