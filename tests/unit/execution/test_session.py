"""Unit tests of marinbuild.execution.session: one run wired from steps to plan, scheduler and markers."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from marinbuild.errors import ResourceError, UserError
from marinbuild.execution.run_parameters import RunParameters
from marinbuild.execution.run_results import StepOutcome
from marinbuild.execution.session import Machine, backend_choice, execute, load, plan_run
from marinbuild.resources import Cores
from marinbuild.steps import step, versioned


def test_backend_choice(tmp_path: Path) -> None:
    project = load(steps=[step("s", cmd="true")], prefix=str(tmp_path))
    assert backend_choice(RunParameters(), project) == "local"
    assert backend_choice(None, project) == "local"  # plan_run without a run's parameters
    assert backend_choice(RunParameters(backend="Ray"), project) == "ray"
    assert backend_choice(RunParameters(backend="slurm"), project) == "slurm"
    with pytest.raises(UserError, match="--backend must be 'local' or 'ray' or 'slurm', not 'lsf'"):
        backend_choice(RunParameters(backend="lsf"), project)


def test_plan_run_refuses_a_step_nothing_here_could_hold(tmp_path: Path) -> None:
    project = load(steps=[step("huge", cmd="true", resources=Cores(10_000))], prefix=str(tmp_path))
    with pytest.raises(ResourceError, match="'huge'"):
        plan_run(project, ["huge"])
    planned = plan_run(project, ["huge"], machine=Machine(cores=10_000))
    assert planned.plan.to_run() == ["huge"] and len(planned.capacity.cores) == 10_000


def test_plan_run_writes_nothing(tmp_path: Path) -> None:
    project = load(steps=[step("s", cmd="echo hi > {output}/x")], prefix=str(tmp_path / "out"))
    planned = plan_run(project, [])
    assert planned.plan.to_run() == ["s"] and planned.requests["s"].N == 1
    assert not (tmp_path / "out").exists()


def test_execute_runs_what_the_plan_says(tmp_path: Path) -> None:
    a = step("a", cmd="echo {n} > {output}/n.txt", config={"n": versioned(4)})
    b = step("b", cmd="cat {a}/n.txt > {output}/copy.txt", config={"a": a})
    bad = step("bad", cmd="exit 3")
    project = load(steps=[b, bad], prefix=str(tmp_path))
    echoed: list[str] = []
    summary = execute(plan_run(project, []), RunParameters(keep_going=True), echo=echoed.append)
    assert summary.names(StepOutcome.RAN) == ["a", "b"] and summary.names(StepOutcome.FAILED) == ["bad"]
    assert Path(summary.steps["b"].output_path, "copy.txt").read_text() == "4\n"
    assert summary.steps["bad"].error and summary.steps["bad"].log
    again = execute(plan_run(load(steps=[b], prefix=str(tmp_path)), []))
    assert again.ok and again.names(StepOutcome.SKIPPED) == ["b"]  # up to date: its inputs are not looked at


def test_output_lines_and_commands_reach_their_callbacks(tmp_path: Path) -> None:
    project = load(steps=[step("talk", cmd="echo hello; echo there")], prefix=str(tmp_path))
    lines: list[tuple[str, str]] = []
    commands: list[tuple[str, str]] = []
    summary = execute(plan_run(project, []), on_output=lambda s, t: lines.append((s, t)),
                      on_command=lambda s, c: commands.append((s, c)))
    assert summary.ok
    assert lines == [("talk", "hello"), ("talk", "there")]
    assert commands == [("talk", "echo hello; echo there")]


def test_a_run_imports_nothing_of_its_machinery_after_the_pre_import(tmp_path: Path) -> None:
    """The rule behind ``load_run_modules``: once it has run, running a step on this machine
    imports no module of marinbuild (nor ``pwd``) that was not loaded already."""
    script = textwrap.dedent(f"""
        import sys
        import marinbuild
        import marinbuild.execution.invocation as invocation
        from marinbuild import step

        seen = []
        original = invocation.load_run_modules

        def recording():
            original()
            seen.append(set(sys.modules))

        invocation.load_run_modules = recording
        summary = marinbuild.run(steps=[step("a", cmd="true"), step("b", cmd="true")], prefix={str(tmp_path / 'out')!r})
        assert summary.ok, summary
        (before,) = seen
        late = sorted(m for m in set(sys.modules) - before if m.startswith("marinbuild") or m == "pwd")
        print(",".join(late))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ""



def test_a_step_redone_but_finished_by_another_runner_after_the_plan_is_not_run_again(tmp_path: Path) -> None:
    """A plan redoes ``a`` (its marker says FAILED) and ``b`` (its SUCCESS predates ``a``'s rerun).
    Another runner redoes both between this plan and this run: their new SUCCESS markers are the
    other runner's work, not the records this plan set out to redo, so nothing runs twice."""
    ran = tmp_path / "ran.txt"
    a = step("a", cmd=f"echo a >> {ran}; echo 1 > {{output}}/n.txt")
    b = step("b", cmd=f"echo b >> {ran}; cat {{a}}/n.txt > {{output}}/copy.txt", config={"a": a})
    prefix = str(tmp_path / "out")
    assert execute(plan_run(load(steps=[b], prefix=prefix), [])).ok
    planned_a = plan_run(load(steps=[b], prefix=prefix), []).plan.node("a").output_path
    marker = Path(planned_a, ".marinbuild", "status")
    marker.write_text(marker.read_text().replace('"SUCCESS"', '"FAILED"'))
    planned = plan_run(load(steps=[b], prefix=prefix), [])
    assert planned.plan.to_run() == ["a", "b"]
    other = execute(plan_run(load(steps=[b], prefix=prefix), []))
    assert other.names(StepOutcome.RAN) == ["a", "b"]
    summary = execute(planned, echo=lambda line: None)
    assert summary.ok and summary.names(StepOutcome.FINISHED_ELSEWHERE) == ["a", "b"], summary
    assert ran.read_text().split() == ["a", "b", "a", "b"]  # the first build, then the other runner's
