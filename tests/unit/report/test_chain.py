"""Unit tests of marinbuild.report.chain: upstream fields by group, the evaluations of a row, the columns."""

from __future__ import annotations

from marinbuild.graph import build_graph
from marinbuild.report.chain import evaluators, field_columns, flat_versioned, group_of, upstream_fields
from marinbuild.report.records import StepRecord
from marinbuild.steps import step, versioned


def _graph():
    data = step("data", cmd="true", config={"rows": versioned(10), "seed": versioned(7)})
    steps = []
    for lr in (0.1, 0.2):
        t = step(f"train/lr{lr}", cmd="true", config={"lr": versioned(lr), "seed": versioned(0), "data": data})
        steps += [t, step(f"eval/lr{lr}", cmd="true", config={"model": t, "seed": versioned(1)})]
    steps.append(step("summary", cmd="true", config={"all": [s for s in steps if s.name.startswith("train/")]}))
    return build_graph(steps, "/p")


def test_upstream_fields_are_grouped_by_the_first_part_of_the_name() -> None:
    up = upstream_fields(_graph(), ["eval/lr0.1", "data"])
    assert up["eval/lr0.1"] == {"data": {"rows": 10, "seed": 7}, "train": {"lr": 0.1, "seed": 0}}
    assert up["data"] == {} and group_of("a/b/c") == "a"


def test_a_row_is_evaluated_by_the_steps_below_it_alone() -> None:
    graph = _graph()
    assert evaluators(graph, ["train/lr0.1", "train/lr0.2"]) == {"train/lr0.1": ["eval/lr0.1"],
                                                                  "train/lr0.2": ["eval/lr0.2"]}
    # With the data among the rows (a report's closure), the training's eval is still its own.
    assert evaluators(graph, ["data", "train/lr0.1", "train/lr0.2"])["train/lr0.1"] == ["eval/lr0.1"]
    # Alone among the rows, the data is the only row upstream of everything below it: nearest first.
    assert evaluators(graph, ["data"])["data"][:2] == ["train/lr0.1", "train/lr0.2"]
    assert "summary" not in evaluators(graph, ["train/lr0.1", "train/lr0.2"])["train/lr0.1"]


def test_columns_name_a_shared_field_step_dot_field_and_keep_what_differs() -> None:
    graph = _graph()
    up = upstream_fields(graph, ["eval/lr0.1", "eval/lr0.2"])
    records = [StepRecord(name=n, identity="0" * 16, output_path=f"/p/{n}", status="SUCCESS", duration=1.0,
                          versioned={"seed": 1}, deps=(), resources="", held=None, upstream=up[n])
               for n in ("eval/lr0.1", "eval/lr0.2")]
    columns, values = field_columns(records)
    assert columns == ["lr"] and [v["lr"] for v in values] == [0.1, 0.2]
    every, _ = field_columns(records, every=True)
    assert every == ["seed", "rows", "data.seed", "lr", "train.seed"]


def test_a_mixed_table_keeps_one_column_per_field_of_the_chain() -> None:
    graph = _graph()
    names = ["data", "train/lr0.1", "eval/lr0.1", "train/lr0.2", "eval/lr0.2", "summary"]
    up = upstream_fields(graph, names)
    assert up["summary"] == {"data": {"rows": 10, "seed": 7}, "train": {"seed": 0}}  # no one lr: none
    records = [StepRecord(name=n, identity="0" * 16, output_path=f"/p/{n}", status="SUCCESS", duration=1.0,
                          versioned=flat_versioned(graph.nodes[n].payload), deps=(), resources="", held=None,
                          upstream=up[n]) for n in names]
    columns, values = field_columns(records)
    assert columns == ["lr"] and [v["lr"] for v in values] == [None, 0.1, 0.1, 0.2, 0.2, None]
    every, values = field_columns(records, every=True)
    assert every == ["rows", "data.seed", "lr", "train.seed", "eval.seed"]
    assert values[0]["data.seed"] == 7 and values[1]["train.seed"] == 0 and values[2]["eval.seed"] == 1
