"""One value for a run's options: ``marinbuild run`` and ``marinbuild.run`` take the same ones."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import typer.main

import marinbuild
import marinbuild.api
from marinbuild import StepOutcome, step, versioned
from marinbuild.backends.registry import kind_options
from marinbuild.cli.app import app
from marinbuild.errors import UserError
from marinbuild.execution.invocation import RunVoice, invoke, load_review
from marinbuild.execution.reporting import NullReporter
from marinbuild.execution.run_parameters import RunParameters

LIBRARY_ONLY = {"steps", "reporter"}
"""Keywords of marinbuild.run with no option: Step objects instead of a Marinfile, and a reporter object."""


def _run_command():
    return typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]


def _help_flags() -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # 80 columns: names must still be whole
    shown = subprocess.run([sys.executable, "-m", "marinbuild", "run", "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert shown.returncode == 0, shown.stderr
    return set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", shown.stdout)) - {"--help"}


def test_library_run_takes_every_option_of_run_help_by_the_same_name():
    keywords = {n for n, p in inspect.signature(marinbuild.run).parameters.items() if p.kind is not p.VAR_KEYWORD}
    command = _run_command()
    names = {p.name for p in command.params}
    assert keywords - LIBRARY_ONLY == names
    # The kinds of backend declare options of their own (``--ray-address``): RunParameters keeps them together.
    assert {f.name for f in dataclasses.fields(RunParameters)} - {"backend_options"} | set(kind_options()) == names
    flags = {opt for p in command.params for opt in [*p.opts, *p.secondary_opts] if opt.startswith("--")}
    assert _help_flags() == flags - {"--help"}
    for p in command.params:
        if p.param_type_name == "option":
            # the keyword is the first long flag, spelled with underscores
            first = next(o for o in p.opts if o.startswith("--"))
            assert first[2:].replace("-", "_") == p.name, (p.name, p.opts)


def test_library_defaults_are_the_command_lines():
    command = _run_command()
    signature = inspect.signature(marinbuild.run)
    for p in command.params:
        if p.param_type_name != "option":
            continue
        library = signature.parameters[p.name].default
        cli = p.default if not p.multiple else ()
        if p.envvar:
            continue  # read from the environment by the command line; None in the library means the same
        assert (tuple(library) if isinstance(library, tuple | list) else library) == (tuple(cli or ()) if p.multiple else cli), p.name






def _voice(lines: list[str]) -> RunVoice:
    return RunVoice(reporter=NullReporter, echo=lines.append, warn=lines.append)


def test_a_dry_run_starts_nothing_and_lists_what_would_run(tmp_path):
    data = step("inv/data", cmd="echo 1 > {output}/x", config={"v": versioned(1)})
    shown: list[object] = []
    voice = dataclasses.replace(_voice([]), show_plan=shown.append)
    summary = invoke(RunParameters(prefix=str(tmp_path), dry=True), voice, steps=[data])
    assert summary.steps["inv/data"].outcome is StepOutcome.NOT_STARTED
    assert len(shown) == 1 and not list(Path(tmp_path).glob("inv/data-*/x"))


def test_run_then_nothing_to_do_said_once(tmp_path):
    data = step("inv/once", cmd="echo 1 > {output}/x")
    lines: list[str] = []
    started: list[bool] = []
    voice = dataclasses.replace(_voice(lines), starting=lambda: started.append(True))
    first = invoke(RunParameters(prefix=str(tmp_path), quiet=True), voice, steps=[data])
    assert first.steps["inv/once"].outcome is StepOutcome.RAN and started == [True]
    again = invoke(RunParameters(prefix=str(tmp_path)), voice, steps=[data])
    assert again.steps["inv/once"].outcome is StepOutcome.SKIPPED
    assert lines == ["nothing to do: 1 step up to date"] and started == [True]


def test_a_plan_file_takes_no_targets_beside_it(tmp_path):
    with pytest.raises(UserError, match="give no targets"):
        load_review(str(tmp_path / "plan.json"), ["a"], None, False)


def test_library_run_passes_each_of_its_keywords_on_by_name():
    """``marinbuild.run`` calls ``RunParameters.of`` with every keyword written out: one it forgot is caught here."""
    import ast

    source = inspect.getsource(marinbuild.api.run)
    calls = [n for n in ast.walk(ast.parse(textwrap.dedent(source))) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "RunParameters.of"]
    assert len(calls) == 1 and not any(k.arg is None for k in calls[0].keywords)  # no **keywords
    passed = {k.arg: ast.unparse(k.value) for k in calls[0].keywords}
    keywords = set(inspect.signature(marinbuild.run).parameters) - {"steps", "reporter"}
    assert passed == {name: name for name in keywords}
