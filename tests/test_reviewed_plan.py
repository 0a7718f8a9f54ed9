"""Reviewed plans: `plan -o plan.json`, then `run --plan plan.json` runs exactly that plan or refuses."""

from __future__ import annotations

import json

from .helpers import marinbuild, marinbuild_in_process, plan_json, snapshot, status_of, write_marinfile

MARINFILE = """
from marinbuild import step, versioned
data = step("data", cmd="echo {n} > {output}/rows.txt", config={"n": versioned(%(n)d)})
train = step("train", cmd="cat {data}/rows.txt > {output}/model.txt", config={"data": data, "lr": versioned(0.1)})
report = step("report", cmd="cat {train}/model.txt", config={"train": train})
"""


def test_plan_file_lists_identity_output_and_action_and_run_plan_runs_it(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    made = marinbuild_in_process("plan", "-o", "plan.json", "train", cwd=project)
    assert made.returncode == 0, made.stderr
    doc = json.loads((project / "plan.json").read_text())
    rows = plan_json(project, "train")
    assert doc["targets"] == ["train"]
    assert [(s["name"], s["identity"], s["output_path"], s["action"]) for s in doc["steps"]] == [
        (n, rows[n]["identity"], rows[n]["output_path"], "run") for n in ("data", "train")
    ]
    ran = marinbuild("run", "--plan", "plan.json", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert status_of(rows["train"]["output_path"])["status"] == "SUCCESS"
    assert status_of(plan_json(project)["report"]["output_path"]) is None  # not in the reviewed plan


def test_run_plan_refuses_a_drifted_identity_before_running_anything(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    assert marinbuild_in_process("plan", "-o", "plan.json", cwd=project).returncode == 0
    write_marinfile(project, MARINFILE % {"n": 2})
    before = snapshot(project / "marinbuild-out")
    refused = marinbuild_in_process("run", "--plan", "plan.json", cwd=project)
    assert refused.returncode == 2
    lines = refused.stderr.splitlines()
    assert any(line.startswith("marinbuild: differs from the plan: data: identity ") and "n: 1 -> 2" in line for line in lines)
    assert any(line.startswith("marinbuild: differs from the plan: train: identity ") and "dependency data" in line for line in lines)
    assert lines[-1].startswith("marinbuild: error: the plan in plan.json no longer holds (")
    assert "nothing was run" in lines[-1]
    assert snapshot(project / "marinbuild-out") == before  # nothing ran, nothing was written


def test_run_plan_refuses_a_step_the_plan_did_not_list(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    assert marinbuild("run", "data", cwd=project).returncode == 0
    assert marinbuild_in_process("plan", "-o", "plan.json", cwd=project).returncode == 0
    assert [s["action"] for s in json.loads((project / "plan.json").read_text())["steps"]] == ["skip", "run", "run"]
    # Another runner (or a hand) marks data failed: it would now run, which nobody reviewed.
    data_out = plan_json(project)["data"]["output_path"]
    status = project / data_out / ".marinbuild" / "status"
    record = json.loads(status.read_text())
    status.write_text(json.dumps({**record, "status": "FAILED", "error": "damaged"}))
    index = project / "marinbuild-out" / ".marinbuild"
    if index.exists():
        import shutil

        shutil.rmtree(index)  # the status summary would still say SUCCESS
    refused = marinbuild_in_process("run", "--plan", "plan.json", cwd=project)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "marinbuild: differs from the plan: data: would run (failed before: damaged; resumes from partial output; --fresh-output to start over), but the plan listed it as up to date" in refused.stderr
    assert status_of(plan_json(project)["train"]["output_path"]) is None


def test_run_plan_skips_a_step_another_runner_finished_meanwhile(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    assert marinbuild_in_process("plan", "-o", "plan.json", cwd=project).returncode == 0
    other = marinbuild("run", "train", cwd=project)  # another runner gets there first
    assert other.returncode == 0
    train_out = plan_json(project)["train"]["output_path"]
    finished = status_of(train_out)
    ran = marinbuild("run", "--plan", "plan.json", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "marinbuild: train: finished by another runner since the plan was made; skipped" in ran.stderr
    assert status_of(train_out) == finished  # not run again
    assert status_of(plan_json(project)["report"]["output_path"])["status"] == "SUCCESS"


def test_bad_plan_files_are_one_line(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    (project / "junk.json").write_text("{not json")
    (project / "other.json").write_text(json.dumps({"steps": []}))
    for args, text in (
        (["--plan", "missing.json"], "no plan file missing.json"),
        (["--plan", "junk.json"], "junk.json is not a plan file"),
        (["--plan", "other.json"], "other.json is not a plan written by `marinbuild plan -o`"),
    ):
        result = marinbuild_in_process("run", *args, cwd=project)
        assert result.returncode == 2
        assert result.stderr.strip().splitlines() == [f"marinbuild: error: {result.stderr.split('error: ', 1)[1].strip()}"]
        assert text in result.stderr
    assert marinbuild_in_process("plan", "-o", "plan.json", cwd=project).returncode == 0
    both = marinbuild_in_process("run", "--plan", "plan.json", "train", cwd=project)
    assert both.returncode == 2 and "give no targets" in both.stderr
    assert not (project / "marinbuild-out").exists() or not any((project / "marinbuild-out").glob("*-*"))


def test_plan_o_into_a_missing_folder_is_one_line_and_writes_nothing(project):
    write_marinfile(project, MARINFILE % {"n": 1})
    result = marinbuild_in_process("plan", "-o", "no/such/plan.json", cwd=project)
    assert result.returncode == 2
    assert result.stderr.strip() == "marinbuild: error: cannot write the plan to no/such/plan.json: No such file or directory"
    assert sorted(p.name for p in project.iterdir()) == ["Marinfile.py"]


def test_run_plan_refuses_a_payload_edited_in_the_file(project):
    write_marinfile(project, MARINFILE % {"n": 3})
    assert marinbuild_in_process("plan", "-o", "plan.json", cwd=project).returncode == 0
    doc = json.loads((project / "plan.json").read_text())
    data = next(s for s in doc["steps"] if s["name"] == "data")
    assert data["payload"]["versioned"] == {"n": 3}
    data["payload"]["versioned"]["n"] = 99  # what a reviewer reads now; the identity still says 3
    (project / "plan.json").write_text(json.dumps(doc))
    refused = marinbuild_in_process("run", "--plan", "plan.json", cwd=project)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    (line,) = refused.stderr.strip().splitlines()
    assert line.startswith("marinbuild: error: plan.json: step 'data': its payload hashes to ") and "the file was edited" in line
    assert f"not to its identity {data['identity']}" in line and "nothing was run" in line
    assert not (project / "marinbuild-out").exists() or not any((project / "marinbuild-out").glob("*-*"))
    # A payload dropped from an entry is refused too: nothing would back what was reviewed.
    del data["payload"]
    (project / "plan.json").write_text(json.dumps(doc))
    refused = marinbuild_in_process("run", "--plan", "plan.json", cwd=project)
    assert refused.returncode == 2 and "step 'data' has no identity payload" in refused.stderr
