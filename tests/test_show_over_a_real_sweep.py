"""`marinbuild show` over a real sweep, accelerator-hours of real TPU attempts, and plan's estimates."""

from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from .helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

SWEEP = """
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    loss = round((cfg["lr"] - 0.03) ** 2 + cfg["width"] / 1000, 6)
    with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:
        json.dump({"loss": loss, "eval": {"acc": round(1 - loss, 6)}}, f)

for lr in (0.01, 0.03, 0.1):
    for width in (64, 128):
        step(f"sweep/lr{lr}-w{width}", train,
             {"lr": versioned(lr), "width": versioned(width), "seed": versioned(0), "out": this_output_path()})
step("other", cmd="true", config={"k": versioned(1)})
"""


def _loss(lr: float, width: int) -> float:
    return round((lr - 0.03) ** 2 + width / 1000, 6)


@pytest.fixture
def sweep(project):
    write_marinfile(project, SWEEP)
    result = marinbuild("run", "-q", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return project


def test_show_json_has_a_row_per_sweep_point_with_config_status_attempts_and_metrics(sweep):
    result = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", "--json", cwd=sweep)
    assert result.returncode == 0, result.stderr
    rows = json.loads(result.stdout)
    assert len(rows) == 6 and all(r["step"].startswith("sweep/") for r in rows)
    for r in rows:
        lr, width = r["config"]["lr"], r["config"]["width"]
        assert r["step"] == f"sweep/lr{lr}-w{width}"
        assert "seed" not in r["config"]  # the same in every row: left out by default
        assert r["status"] == "SUCCESS" and r["attempts"] == 1 and r["duration_s"] > 0
        assert r["metrics"] == {"loss": _loss(lr, width), "eval.acc": round(1 - _loss(lr, width), 6)}
        assert r["accelerator_hours"] == 0 and r["core_hours"] > 0
    every = json.loads(marinbuild_in_process("show", "sweep/*", "--json", "--all-fields", cwd=sweep).stdout)
    assert all(r["config"]["seed"] == 0 for r in every) and all(r["metrics"] == {} for r in every)


def test_show_csv_sorted_by_a_metric(sweep):
    result = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", "--csv", "--sort", "loss", cwd=sweep)
    assert result.returncode == 0, result.stderr
    table = list(csv.DictReader(io.StringIO(result.stdout)))
    assert list(table[0]) == ["step", "lr", "width", "status", "duration_s", "attempts", "accelerator_hours",
                              "core_hours", "loss", "eval.acc"]
    losses = [float(r["loss"]) for r in table]
    assert losses == sorted(losses) and len(losses) == 6
    assert table[0]["step"] == "sweep/lr0.03-w64"
    down_csv = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", "--csv", "--sort", "width", "-r",
                                     cwd=sweep).stdout
    down = list(csv.DictReader(io.StringIO(down_csv)))
    assert [r["width"] for r in down] == ["128"] * 3 + ["64"] * 3


def test_show_table_in_a_pipe_and_bad_input(sweep):
    text = marinbuild_in_process("show", "sweep/*", "--metrics", "metrics.json", cwd=sweep)
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0].split() == ["step", "lr", "width", "status", "duration_s", "attempts", "accelerator_hours",
                                "core_hours", "loss", "eval.acc"]
    assert len(lines) == 7
    bad = marinbuild_in_process("show", "sweep/*", "--sort", "nope", cwd=sweep)
    assert bad.returncode == 2 and bad.stderr.startswith("marinbuild: error: --sort 'nope': no such column")
    both = marinbuild_in_process("show", "--json", "--csv", cwd=sweep)
    assert both.returncode == 2 and len(both.stderr.strip().splitlines()) == 1


def test_plan_estimates_from_earlier_runs_of_the_same_step(sweep):
    fresh = json.loads(marinbuild_in_process("plan", "--json", cwd=sweep).stdout)
    assert all(r["estimate"] is None for r in fresh)  # up to date: nothing to estimate
    write_marinfile(sweep, SWEEP.replace('"seed": versioned(0)', '"seed": versioned(1)') + 'step("brand-new", cmd="true")\n')
    rows = plan_json(sweep)
    point = rows["sweep/lr0.01-w64"]
    assert point["action"] == "run"
    assert point["estimate"]["runs"] == 1 and point["estimate"]["duration_s"] > 0
    assert point["estimate"]["core_hours"] == pytest.approx(point["estimate"]["duration_s"] / 3600, rel=0.2)
    assert rows["brand-new"]["estimate"] is None
    text = marinbuild_in_process("plan", cwd=sweep).stdout
    assert "estimates from earlier runs of the same step" in text
    assert any(line.split()[:2] == ["brand-new", "no"] for line in text.splitlines())
    total = next(line for line in text.splitlines() if line.strip().startswith("total"))
    assert "1 without history" in total


TPU = """
from marinbuild import step, versioned, ResourceConfig
step("tpu/train", cmd="sleep 0.5; echo done", config={"v": versioned(%d)},
     resources=ResourceConfig.with_tpu("v4-16", slice_count=2))
"""


def test_tpu_attempts_record_chip_hours_and_plan_estimates_them(project, fleet):
    write_marinfile(project, TPU % 1)
    cluster = fleet.write_cluster(project / "cluster.toml", [("a", "v4-16", [0, 1]), ("b", "v4-16", [2, 3])],
                                  python=sys.executable)
    result = marinbuild("run", "--cluster", str(cluster), "--no-sync", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project, "--cluster", str(cluster))["tpu/train"]["output_path"])
    ledger = json.loads((out / "attempts.json").read_text())["attempts"]
    assert len(ledger) == 1
    entry = ledger[0]
    # Two v4-16 slices: 8 chips each (16 TensorCores), 2 hosts each.
    assert entry["held"] == {"cores": 0, "tpu_type": "v4-16", "slices": 2, "tpu_chips": 16, "tpu_hosts": 4}
    assert entry["backend"] == "tpu"
    chip_hours = 16 * entry["duration_s"] / 3600
    shown = json.loads(marinbuild_in_process("show", "tpu/train", "--json", cwd=project).stdout)[0]
    assert shown["accelerator_hours"] == pytest.approx(chip_hours, abs=1e-6)
    assert shown["attempts"] == 1 and shown["status"] == "SUCCESS"
    write_marinfile(project, TPU % 2)
    estimate = plan_json(project, "--cluster", str(cluster))["tpu/train"]["estimate"]
    assert estimate["runs"] == 1
    assert estimate["tpu_chip_hours"] == pytest.approx(chip_hours, abs=1e-6)
    assert estimate["accelerator_hours"] == pytest.approx(chip_hours, abs=1e-6)


def test_a_metric_named_step_beside_one_named_metrics_step_keeps_both_values(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        from marinbuild import step, versioned
        step("s", cmd="printf '%s' {m} > {output}/metrics.json",
             config={"i": versioned(0), "m": '{"step": 7, "metrics.step": 100}'})
    """)
    prefix = str(tmp_path / "out")
    built = marinbuild("run", "--prefix", prefix, cwd=tmp_path)
    assert built.returncode == 0, built.stdout + built.stderr
    shown = marinbuild_in_process("show", "--metrics", "metrics.json", "--json", "--prefix", prefix, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)[0]["metrics"] == {"step": 7, "metrics.step": 100}
    table = marinbuild_in_process("show", "--metrics", "metrics.json", "--prefix", prefix, cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()[:2]
    assert len(header.split()) == len(set(header.split())), header  # no two columns of one name
    assert "7" in row.split(), table.stdout  # the metric `step` is shown, not lost
