"""A row is a run of the chain: ``show`` rows carry the upstream steps' versioned fields and the metrics
of the step that evaluates them; ``--history`` adds earlier identities, ``--diff`` only what differs."""

from __future__ import annotations

import csv
import io
import json
import shutil
from pathlib import Path

import pytest

from .helpers import marinbuild, marinbuild_in_process, on_terminal, write_marinfile

CHAIN = """
import json, os
from marinbuild import step, versioned, this_output_path

def train(cfg):
    open(os.path.join(cfg["out"], "model"), "w").write(str(cfg["lr"]))

def evaluate(cfg):
    lr = float(open(os.path.join(cfg["model"], "model")).read())
    with open(os.path.join(cfg["out"], "metrics.json"), "w") as f:
        json.dump({"eval_loss": round(abs(lr - 0.003) * 100 + cfg["seed"] * 0.01, 4)}, f)

data = step("data", cmd="echo data", config={"rows": versioned(1000), "seed": versioned(7)})
trains = []
for lr in (0.001, 0.003, 0.01):
    for seed in (0, 1):
        t = step(f"train/lr{lr}-s{seed}", train, {"lr": versioned(lr), "seed": versioned(seed),
                 "hidden": versioned(HIDDEN), "data": data, "out": this_output_path()})
        step(f"eval/lr{lr}-s{seed}", evaluate, {"model": t, "seed": versioned(seed), "out": this_output_path()})
        trains.append(t)
step("summary", cmd="echo summary", config={"all": trains})
"""


def _loss(lr: float, seed: int) -> float:
    return round(abs(lr - 0.003) * 100 + seed * 0.01, 4)


def _chain(project, hidden: int = 64) -> None:
    write_marinfile(project, CHAIN.replace("HIDDEN", str(hidden)))
    ran = marinbuild("run", "-q", cwd=project)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def _show(project, *args: str) -> list[dict]:
    result = marinbuild_in_process("show", *args, "--metrics", "metrics.json", "--json", cwd=project)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def one_chain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project where the chain ran once, for the tests that only show it."""
    project = tmp_path_factory.mktemp("chain")
    _chain(project)
    return project


def test_eval_rows_carry_the_training_fields_and_train_rows_their_eval_metrics(one_chain):
    project = one_chain
    evals = _show(project, "eval/*")
    assert len(evals) == 6
    for row in evals:
        lr, seed = float(row["step"].split("lr")[1].split("-")[0]), int(row["step"][-1])
        # lr is the training's alone; seed is eval's own and the training's too: train.seed
        assert row["config"] == {"seed": seed, "lr": lr, "train.seed": seed}, row
        assert row["metrics"] == {"eval_loss": _loss(lr, seed)} and row["metrics_from"] is None
    trains = _show(project, "train/*")
    for row in trains:
        lr, seed = row["config"]["lr"], row["config"]["seed"]
        assert row["metrics"] == {"eval_loss": _loss(lr, seed)}, row
        assert row["metrics_from"] == row["step"].replace("train/", "eval/")
    # The summary reads every training: it evaluates none of them alone.
    table = marinbuild_in_process("show", "train/*", "--metrics", "metrics.json", "--csv", "--sort", "eval_loss",
                                  cwd=project)
    best = next(csv.DictReader(io.StringIO(table.stdout)))
    assert best["step"] == "train/lr0.003-s0" and best["eval_loss"] == "0.0"


def test_history_keeps_the_earlier_identities_and_diff_lists_what_differs(project):
    _chain(project, hidden=64)
    _chain(project, hidden=96)
    plain = _show(project, "train/*")
    assert len(plain) == 6 and all("earlier" not in r for r in plain)
    rows = _show(project, "train/*", "--history")
    assert len(rows) == 12
    earlier = [r for r in rows if r["earlier"]]
    current = [r for r in rows if not r["earlier"]]
    assert len(earlier) == 6 and len(current) == 6
    assert {r["config"]["hidden"] for r in earlier} == {64} and {r["config"]["hidden"] for r in current} == {96}
    assert all(r["status"] == "SUCCESS" and r["identity"] for r in rows)
    for r in earlier:  # the earlier training's own evaluation, found through what that eval recorded
        assert r["metrics"] == {"eval_loss": _loss(r["config"]["lr"], r["config"]["seed"])}, r
    evals = _show(project, "eval/*", "--history")
    assert {r["config"].get("hidden") for r in evals if r["earlier"]} == {64}
    assert all(r["config"].get("rows") is None for r in evals)  # the same for every row: not a column
    diff = marinbuild_in_process("show", "train/*", "--metrics", "metrics.json", "--history", "--diff", "--csv",
                                 cwd=project)
    assert diff.returncode == 0, diff.stderr
    table = list(csv.DictReader(io.StringIO(diff.stdout)))
    assert list(table[0]) == ["step", "hidden", "version", "when"]
    assert [r["version"] for r in table[:2]] == ["current", "earlier"] and len(table) == 12
    # A cleaned output is gone from the history, as it is from the prefix.
    gone = next(r["output_path"] for r in earlier if r["step"] == "train/lr0.001-s0")
    shutil.rmtree(gone)
    again = _show(project, "train/*", "--history")
    assert len(again) == 11 and gone not in {r.get("output_path") for r in again}
    refused = marinbuild_in_process("show", "--diff", cwd=project)
    assert refused.returncode == 2 and "needs --history" in refused.stderr


def test_a_field_is_one_column_along_the_chain_and_unrelated_fields_of_one_name_stay_apart(project):
    """``show`` of every step: a training's own ``lr`` and its eval's training ``lr`` fill one column;
    the data's ``seed`` and the trainings' are apart (and the data's, the same in every row, goes);
    a summary over every training has their common ``hidden``, never one training's ``lr``, now and
    in its history; and the table fits 100 columns with the fields in it."""
    _chain(project, hidden=64)
    _chain(project, hidden=96)
    rows = _show(project, "--history")
    configs = {(r["step"], r["earlier"]): r["config"] for r in rows}
    columns = set().union(*(c.keys() for c in configs.values()))
    assert columns == {"lr", "hidden", "train.seed", "eval.seed"}, columns  # data.seed, rows: 7 in every row
    assert configs[("train/lr0.01-s1", False)]["lr"] == configs[("eval/lr0.01-s1", False)]["lr"] == 0.01
    assert configs[("train/lr0.01-s1", False)]["train.seed"] == configs[("eval/lr0.01-s1", False)]["train.seed"] == 1
    assert configs[("data", False)] == dict.fromkeys(columns)  # the data's own fields say nothing here
    assert configs[("summary", False)] == {**dict.fromkeys(columns), "hidden": 96}
    assert configs[("summary", True)] == {**dict.fromkeys(columns), "hidden": 64}
    shown = on_terminal(project, "show", "--metrics", "metrics.json", columns=100)
    head = shown.splitlines()[0]
    assert all(name in head for name in ("lr", "train.seed", "eval_loss")), shown
    assert max(len(line) for line in shown.splitlines()) <= 100, shown
    # With the history, when each ran gives way before a metric does.
    shown = on_terminal(project, "show", "--history", "--metrics", "metrics.json", columns=100)
    head = shown.splitlines()[0].split()
    assert {"hidden", "version", "eval_loss"} <= set(head) and "when" not in head, shown


def test_diff_without_any_earlier_identity_says_so_in_one_line(one_chain):
    project = one_chain
    note = "marinbuild: note: no shown step has an earlier identity under the prefix: nothing to compare"
    piped = marinbuild_in_process("show", "--history", "--diff", cwd=project)
    assert piped.returncode == 0 and piped.stdout == "" and piped.stderr.strip() == note, piped
    assert on_terminal(project, "show", "--history", "--diff", columns=100).strip() == note
    # Machine-readable output keeps its shape: no rows.
    assert _show(project, "--history", "--diff") == []
