"""Unit tests of marinbuild.cli.plan_view: what a plan shows, in a table or as plain columns."""

from __future__ import annotations

from marinbuild.cli.plan_view import COLUMNS, columns_text, cut_reason, plan_text, plan_view, under_prefix
from marinbuild.graph import build_graph
from marinbuild.planner import RESUMES, make_plan
from marinbuild.steps import step
from marinbuild.store.markers import SUCCESS, StatusRecord


def test_under_prefix() -> None:
    assert under_prefix("/out/a/b-1", "/out/") == "a/b-1"
    assert under_prefix("/out", "/out") == "/out"
    assert under_prefix("/other/x", "/out") == "/other/x"


def test_cut_reason_points_at_why_and_keeps_the_resume_hint() -> None:
    short = "new"
    assert cut_reason(short, "s") == short
    long = "changed: " + "; ".join(f"field{i}: {i} -> {i + 1}" for i in range(10))
    cut = cut_reason(long, "s", 40)
    assert cut.endswith("… (why s)") and len(cut) <= 40
    resumed = cut_reason(long + f"; {RESUMES}", "s", 90)
    assert resumed.endswith(f"(why s); {RESUMES}") and len(resumed) <= 90
    tight = cut_reason(long + f"; {RESUMES}", "s", 40)  # no room for the whole hint: its first word
    assert tight.endswith("(why s); resumes") and len(tight) <= 40


def test_rows_of_a_small_plan_wide_and_fitted() -> None:
    a = step("a", cmd="true")
    graph = build_graph([step("b", cmd="true", config={"a": a})], "/out")
    node_a = graph.nodes["a"]
    plan = make_plan(graph, ["b"], {node_a.output_path: StatusRecord(SUCCESS, 1.0, identity=node_a.identity)})
    wide = plan_view(plan, {"b": "Cores(1)"})
    assert wide.counts is None and wide.totals == "1 to run, 1 to skip"
    assert wide.rows == (("a", "skip", "up to date", "", node_a.output_path),
                         ("b", "run", "new", "Cores(1)", graph.nodes["b"].output_path))
    fitted = plan_view(plan, wide=False)
    assert fitted.rows[0][4] == f"a-{node_a.identity}"


def test_a_big_plan_is_counted_and_shows_the_steps_to_run_first() -> None:
    graph = build_graph([step(f"s{i:03d}", cmd="true") for i in range(300)], "/out")
    done = {graph.nodes[n].output_path: StatusRecord(SUCCESS, 1.0, identity=graph.nodes[n].identity)
            for n in graph.declared[:100]}
    view = plan_view(make_plan(graph, graph.declared, done), max_rows=200)
    assert view.counts == (("run", "new", 200), ("skip", "up to date", 100))
    assert len(view.rows) == 50 and view.rows[0][0] == "s100" and all(r[1] == "run" for r in view.rows)
    assert plan_view(make_plan(graph, graph.declared, {})).counts is not None


def test_plan_text_is_aligned_columns() -> None:
    graph = build_graph([step("a", cmd="true"), step("longer-name", cmd="true")], "/out")
    lines = plan_text(make_plan(graph, graph.declared, {})).splitlines()
    assert lines[0].split() == list(COLUMNS)
    assert lines[1].startswith("a            run") and lines[2].startswith("longer-name  run")
    assert lines[-1] == "2 to run"


def test_columns_text() -> None:
    assert columns_text([("a", "bb"), ("ccc", "d")]) == ["a    bb", "ccc  d"]
