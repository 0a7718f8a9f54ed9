"""``plan``, ``status`` and ``show`` in a 100-column pseudo-terminal: no cell wraps, columns that do
not fit go with one line saying which, empty and all-zero columns go, ``--wide`` shows them all."""

from __future__ import annotations

import json

from .helpers import marinbuild, marinbuild_in_process, on_terminal, write_marinfile

SWEEP = """
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    if cfg["lr"] == 0.1:
        raise RuntimeError("diverged: " + "the loss went to nan after warm-up and every later step was nan " * 3)
    with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:
        json.dump({"eval_loss": 0.7112344 + cfg["lr"], "accuracy": 0.5 - cfg["lr"],
                   "perplexity_of_the_model": 12.345678, "tokens_per_second_mean": 123456.789}, f)

data = step("data/tokenized-corpus-with-a-long-name", cmd="echo data", config={"n": versioned(1)})
for lr in (0.001, 0.003, 0.01, 0.1):
    for seed in (0, 1):
        step(f"train/lr{lr}-seed{seed}-a-long-experiment-name-of-the-sweep", train,
             {"lr": versioned(lr), "seed": versioned(seed), "hidden": versioned(HIDDEN), "data": data,
              "warmup_steps_before_decay": versioned(WARMUP), "out": this_output_path()})
"""


def _marinfile(project, hidden: int = 64, warmup: int = 100) -> None:
    write_marinfile(project, SWEEP.replace("HIDDEN", str(hidden)).replace("WARMUP", str(warmup)))


def _rows_of(shown: str, names: list[str]) -> list[str]:
    lines = shown.splitlines()
    assert max(len(line) for line in lines) <= 100, shown
    rows = [line for line in lines if "│" in line]
    # One line per step: a cell that wrapped would add a line that starts with no step's name.
    assert len(rows) == len(names), shown
    for name in names:
        assert sum(1 for line in rows if line.startswith(f" {name} ")) == 1, (name, shown)
    return rows


def test_plan_status_and_show_keep_each_cell_on_one_line_in_100_columns(project):
    _marinfile(project)
    marinbuild("run", "-k", "-q", cwd=project)
    names = marinbuild_in_process("list", cwd=project).stdout.split()
    trains = [n for n in names if n.startswith("train/")]
    _marinfile(project, hidden=96, warmup=200)  # two fields change: a long reason per step
    plan = on_terminal(project, "plan", columns=100)
    _rows_of(plan, names)
    assert "… (why" in plan and "not shown for room: " in plan and "(--wide: all)" in plan
    _marinfile(project)
    status = on_terminal(project, "status", columns=100)
    rows = _rows_of(status, names)
    assert any("FAILED" in row and "diverged" in row for row in rows), status
    show = on_terminal(project, "show", "train/*", "--metrics", "metrics.json", columns=100)
    rows = _rows_of(show, trains)
    assert "accelerator_hours" not in show  # zero in every row of a CPU sweep: gone
    shown_metrics = [m for m in ("eval_loss", "accuracy", "perplexity_of_the_model", "tokens_per_second_mean")
                     if m in show.splitlines()[0]]
    assert "eval_loss" in shown_metrics
    loss = json.loads((next((project / "marinbuild-out" / "train").glob("lr0.001-seed0-*")) / "metrics.json")
                      .read_text())["eval_loss"]
    assert any(f"{loss:.6g}" in row for row in rows), show  # a number is whole, on its row
    gone = [line for line in show.splitlines() if line.startswith("not shown for room: ")]
    assert len(gone) == 1 and len(gone[0]) <= 100
    wide = on_terminal(project, "show", "train/*", "--metrics", "metrics.json", "--wide", columns=400)
    assert "accelerator_hours" in wide and "tokens_per_second_mean" in wide and "not shown" not in wide


def test_pipes_and_csv_keep_every_column(project):
    _marinfile(project)
    marinbuild("run", "-k", "-q", cwd=project)
    piped = marinbuild_in_process("show", "train/*", "--metrics", "metrics.json", cwd=project).stdout
    header = piped.splitlines()[0].split()
    assert "accelerator_hours" in header and "tokens_per_second_mean" in header and "not shown" not in piped
    csv = marinbuild_in_process("show", "train/*", "--metrics", "metrics.json", "--csv", cwd=project).stdout
    assert "accelerator_hours" in csv.splitlines()[0]
