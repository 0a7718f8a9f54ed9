"""marinbuild from Python: ``marinbuild.run``, ``marinbuild.plan`` and ``marinbuild.main``."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import networkx as nx

import marinbuild
from marinbuild import StepOutcome, step, versioned

from .helpers import REPO, cli_env, write_marinfile
from .helpers import marinbuild as cli


def _python(code_or_file: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, code_or_file, *args] if code_or_file.endswith(".py") else [sys.executable, "-c", code_or_file]
    return subprocess.run(argv, cwd=cwd, env=cli_env(), capture_output=True, text=True, timeout=120)


def test_run_a_marinfile_from_python_prints_its_summary(project):
    (project / "Marinfile.py").write_text((REPO / "Marinfile.py").read_text())
    first = _python("import marinbuild; print(marinbuild.run(file='Marinfile.py'))", cwd=project)
    assert first.returncode == 0, first.stderr
    assert "ran 2: hello/data, hello/stats" in first.stdout
    assert "done  hello/data" in first.stderr  # progress on stderr, plain lines
    again = _python("import marinbuild; print(marinbuild.run(file='Marinfile.py', quiet=True))", cwd=project)
    assert "skipped 2: hello/data, hello/stats" in again.stdout and again.stderr == ""


def test_run_steps_in_process_reports_each_step(tmp_path):
    ok = step("lib/ok", cmd="echo fine > {output}/x.txt", config={"v": versioned(1)})
    bad = step("lib/bad", cmd="echo broken >&2; exit 3")
    after_bad = step("lib/after_bad", cmd="cat {bad}/nothing", config={"bad": bad})
    summary = marinbuild.run(steps=[ok, after_bad], prefix=str(tmp_path), keep_going=True, quiet=True)
    assert not summary.ok
    assert summary.steps["lib/ok"].outcome is StepOutcome.RAN
    assert (Path(summary.steps["lib/ok"].output_path) / "x.txt").read_text() == "fine\n"
    assert summary.steps["lib/bad"].outcome is StepOutcome.FAILED
    assert "3" in (summary.steps["lib/bad"].error or "")
    assert summary.steps["lib/after_bad"].outcome is StepOutcome.NOT_STARTED
    again = marinbuild.run(steps=[ok], prefix=str(tmp_path), quiet=True)
    assert again.ok and again.steps["lib/ok"].outcome is StepOutcome.SKIPPED


def test_plan_from_python_is_a_networkx_graph_in_plan_order(tmp_path):
    a = step("g/a", cmd="true")
    b = step("g/b", cmd="true", config={"a": a})
    c = step("g/c", cmd="true", config={"a": a})
    d = step("g/d", cmd="true", config={"b": b, "c": c})
    plan = marinbuild.plan(steps=[d], prefix=str(tmp_path))
    assert isinstance(plan.graph, nx.DiGraph)
    assert set(plan.graph.edges) >= {("g/a", "g/b"), ("g/a", "g/c"), ("g/b", "g/d"), ("g/c", "g/d")}
    order = list(plan.order)
    assert set(order) == {"g/a", "g/b", "g/c", "g/d"}
    for u, v in plan.graph.edges:
        if u in order and v in order:
            assert order.index(u) < order.index(v)
    assert not any(tmp_path.iterdir())  # planning writes nothing


SCRIPT = """
    import marinbuild
    from marinbuild import step, versioned

    a = step("exp/a", cmd="echo {n} > {output}/n.txt", config={"n": versioned(7)})
    b = step("exp/b", cmd="cat {a}/n.txt > {output}/copy.txt", config={"a": a})
    marinbuild.main([b])
"""


def test_a_script_ending_in_main_behaves_like_the_command_line(project):
    exp = write_marinfile(project, SCRIPT, name="exp.py")
    plan = _python(str(exp), "plan", "--json", cwd=project)
    assert plan.returncode == 0, plan.stderr
    assert [(r["name"], r["action"]) for r in json.loads(plan.stdout)] == [("exp/a", "run"), ("exp/b", "run")]
    assert not (project / "marinbuild-out").exists()
    run = _python(str(exp), cwd=project)
    assert run.returncode == 0, run.stderr
    status = _python(str(exp), "status", "--json", cwd=project)
    rows = {r["name"]: r["status"] for r in json.loads(status.stdout)}
    assert rows == {"exp/a": "SUCCESS", "exp/b": "SUCCESS"}
    bad = _python(str(exp), "plan", "--no-such-flag", cwd=project)
    assert bad.returncode == 2 and "no-such-flag" in bad.stderr and "Traceback" not in bad.stderr
    # Loaded as a Marinfile, the unguarded main() only declares: nothing runs twice, nothing recurses.
    as_marinfile = cli("plan", "-f", "exp.py", cwd=project)
    assert as_marinfile.returncode == 0, as_marinfile.stderr
    assert "exp/b" in as_marinfile.stdout and "up to date" in as_marinfile.stdout


def test_library_errors_raise_instead_of_exiting(tmp_path):
    missing = tmp_path / "nowhere" / "Marinfile.py"
    code = textwrap.dedent(
        f"""
        import marinbuild
        try:
            marinbuild.plan(file={str(missing)!r})
        except marinbuild.MarinbuildError as e:
            print("error:", e)
        """
    )
    out = _python(code, cwd=tmp_path)
    assert out.returncode == 0 and out.stdout.startswith("error: no Marinfile at")


def test_status_and_clean_from_python_read_and_empty_a_real_prefix(tmp_path):
    ok = step("lib/made", cmd="echo made > {output}/x.txt", config={"v": versioned(1)})
    bad = step("lib/broke", cmd="echo broken >&2; exit 3")
    never = step("lib/after", cmd="cat {bad}/x.txt", config={"bad": bad})
    prefix, steps = str(tmp_path), [ok, bad, never]
    marinbuild.run(steps=steps, prefix=prefix, keep_going=True, quiet=True)

    report = marinbuild.status(steps=steps, prefix=prefix)
    assert isinstance(report, marinbuild.StatusReport) and report.prefix == prefix
    by_name = {row.name: row for row in report.rows}
    assert [row.name for row in report.rows] == ["lib/made", "lib/broke", "lib/after"]
    assert by_name["lib/made"].status == "SUCCESS" and by_name["lib/made"].duration is not None
    assert by_name["lib/broke"].status == "FAILED" and "3" in (by_name["lib/broke"].error or "")
    assert by_name["lib/after"].status == "NONE" and by_name["lib/after"].lease is None
    # The rows are the objects `status --json` prints, key for key.
    shown = cli("status", "--json", "--prefix", prefix, "-f", _script_of(tmp_path), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    printed = json.loads(shown.stdout)
    assert printed == report.to_json()
    assert set(printed[0]) >= {"slurm", "provisioning", "outside_writes", "lease", "retries"}
    assert marinbuild.status("lib/made", steps=steps, prefix=prefix).rows == (by_name["lib/made"],)

    made = by_name["lib/made"].output_path
    dry = marinbuild.clean("lib/made", steps=steps, prefix=prefix, dry=True)
    assert dry.would_remove == (made,) and dry.removed == () and Path(made, "x.txt").exists()
    done = marinbuild.clean(steps=steps, prefix=prefix)
    assert set(done.removed) == {made, by_name["lib/broke"].output_path} and done.would_remove == ()
    assert not Path(made).exists()
    after = marinbuild.status(steps=steps, prefix=prefix)
    assert {row.status for row in after.rows} == {"NONE"}
    assert marinbuild.clean(steps=steps, prefix=prefix, dry=True).would_remove == ()


def _script_of(tmp_path: Path) -> str:
    """A Marinfile declaring the steps of the test above, for the command line to read."""
    path = tmp_path.parent / f"{tmp_path.name}-Marinfile.py"
    path.write_text(textwrap.dedent("""
        from marinbuild import step, versioned

        ok = step("lib/made", cmd="echo made > {output}/x.txt", config={"v": versioned(1)})
        bad = step("lib/broke", cmd="echo broken >&2; exit 3")
        never = step("lib/after", cmd="cat {bad}/x.txt", config={"bad": bad})
    """))
    return str(path)
