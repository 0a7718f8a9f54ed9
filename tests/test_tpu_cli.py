"""TPU steps through the real command line: `run --cluster` fans steps out over SSH."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .helpers import marinbuild, marinbuild_in_process, plan_json, status_of, write_marinfile

MARINFILE = """
import json, os
from marinbuild import step, versioned, ResourceConfig, this_output_path

def record(cfg):
    # Runs on every host, through `python -m marinbuild.backends.worker`.
    out = cfg["out"]
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"host{os.environ['MARINBUILD_PROCESS_ID']}.json"), "w") as f:
        json.dump({k: v for k, v in os.environ.items() if k.startswith(("MARINBUILD_", "MEGASCALE_"))}, f)

fn_step = step("tpu/fn", record, {"out": this_output_path(), "v": versioned(1)},
               resources=ResourceConfig.with_tpu("v4-16", slice_count=2))
sh_step = step("tpu/sh", cmd="echo $MARINBUILD_PROCESS_ID > {output}/w$MARINBUILD_PROCESS_ID.txt",
               resources=ResourceConfig.with_tpu("v4-16"), config={"after": fn_step})
local = step("local", cmd="cat {sh}/w0.txt > {output}/copy.txt", config={"sh": sh_step})
"""


def test_run_with_cluster_file_fans_out_function_and_shell_steps(project, fleet):
    write_marinfile(project, MARINFILE)
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1]), ("b", "v4-16", [2, 3])],
                                  python=sys.executable)
    refused = marinbuild_in_process("plan", cwd=project)
    assert refused.returncode == 2 and "tpu/fn" in refused.stderr and "v4-16" in refused.stderr
    result = marinbuild("run", "--cluster", str(cluster), cwd=project, env={"MARINBUILD_RETRY_BASE_DELAY": "0.05"})
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(project, "--cluster", str(cluster))
    fn_out = Path(rows["tpu/fn"]["output_path"])
    seen = [json.loads((fn_out / f"host{i}.json").read_text()) for i in range(4)]
    assert [s["MARINBUILD_PROCESS_ID"] for s in seen] == ["0", "1", "2", "3"]
    assert {s["MEGASCALE_NUM_SLICES"] for s in seen} == {"2"}
    assert [s["MEGASCALE_SLICE_ID"] for s in seen] == ["0", "0", "1", "1"]
    assert all(s["MARINBUILD_OUTPUT"] == str(fn_out) for s in seen)
    attempts = json.loads((fn_out / "attempts.json").read_text())
    assert [a["class"] for a in attempts["attempts"]] == ["SUCCESS"]
    assert status_of(str(fn_out))["status"] == "SUCCESS"
    # The single-slice shell step ran on one slice of two hosts; the local step read its output.
    sh_out = Path(rows["tpu/sh"]["output_path"])
    assert sorted(p.name for p in sh_out.glob("w*.txt")) == ["w0.txt", "w1.txt"]
    assert (Path(rows["local"]["output_path"]) / "copy.txt").read_text() == "0\n"


def test_failing_tpu_step_is_failed_with_exit_1(project, fleet):
    write_marinfile(project, """
from marinbuild import step, ResourceConfig
step("boom", cmd="test $MARINBUILD_WORKER_ID = 0 || exit 7", resources=ResourceConfig.with_tpu("v4-16"))
""")
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1])])
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project)
    assert result.returncode == 1
    row = plan_json(project, "--cluster", str(cluster))["boom"]
    rec = status_of(row["output_path"])
    assert rec["status"] == "FAILED"
    assert "FAILED boom" in result.stdout


def test_bad_cluster_file_is_exit_2(project):
    write_marinfile(project, "from marinbuild import step, ResourceConfig\nstep('t', cmd='true', resources=ResourceConfig.with_tpu('v4-32'))\n")
    (project / "cluster.toml").write_text('[[slices]]\nname = "p"\ntpu_type = "v4-32"\nhosts = ["10.0.0.2"]\n')
    result = marinbuild_in_process("plan", "--cluster", "cluster.toml", cwd=project)
    assert result.returncode == 2
    assert "'p'" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_hostile_cluster_files_are_one_line_and_exit_2(project):
    write_marinfile(project, "from marinbuild import step, ResourceConfig\nstep('t', cmd='true', resources=ResourceConfig.with_tpu('v4-32'))\n")
    gcp = '[gcp]\nproject = "my-project"\nzone = "us-central2-b"\n'
    cases = {
        "latin1.toml": b'[gcp]\nproject = "caf\xe9"\n',
        "deep.toml": ("a = " + "[" * 5000 + "]" * 5000 + "\n").encode(),
        "grace.toml": ("[ssh]\nkill_grace = -1e308\n" + gcp).encode(),
        "nan.toml": ("[ssh]\nconnect_timeout = nan\n" + gcp).encode(),
        "zone.toml": b'[gcp]\nproject = "my-project"\nzone = "../../x"\n',
        "project.toml": b'[gcp]\nproject = "a/b?c=d"\nzone = "us-central2-b"\n',
    }
    for name, text in cases.items():
        (project / name).write_bytes(text)
        result = marinbuild_in_process("plan", "--cluster", name, cwd=project)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0] and "internal error" not in lines[0], (name, lines)
