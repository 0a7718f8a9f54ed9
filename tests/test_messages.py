"""What the command line says: stale reviewed plans, Marin's flag habits, ``run -n -p``, tables that fit a
terminal, a closed pipe, the estimates' "no history" line, and a quiet offline attempt of uv.

Every check runs the real command line in a fresh interpreter; terminal tables are read
through a real pseudo-terminal.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .helpers import cli_env, marinbuild, marinbuild_in_process, missing_tool, on_terminal, plan_json, write_marinfile
from .wheels import make_wheel

SWEEP = """
from marinbuild import step, versioned

points = [step(f"train/lr{{lr}}", cmd="echo {{lr}} {{seed}} {{width}} {{depth}} > {{output}}/w",
               config={{"lr": versioned(lr), "seed": versioned({seed}), "width": versioned({width}),
                        "depth": versioned({depth})}}) for lr in (0.1, 0.2)]
step("eval", cmd="for p in {{points}}; do cat $p/w; done > {{output}}/all", config={{"points": points}})
"""


def sweep(project: Path, seed: int = 1, width: int = 64, depth: int = 2) -> Path:
    return write_marinfile(project, SWEEP.format(seed=seed, width=width, depth=depth))


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


def test_a_renamed_step_makes_a_reviewed_plan_stale(project: Path) -> None:
    sweep(project)
    ok(marinbuild_in_process("plan", "-o", "plan.json", "train/lr0.1", cwd=project))
    write_marinfile(project, SWEEP.format(seed=1, width=64, depth=2).replace('f"train/lr', 'f"train/rate'))
    refused = marinbuild("run", "--plan", "plan.json", cwd=project)
    assert refused.returncode == 2
    assert "the reviewed plan no longer holds: train/lr0.1 is no longer in the Marinfile" in refused.stderr
    assert "did you mean" not in refused.stderr and "no step named" not in refused.stderr
    assert not (project / "marinbuild-out").exists()  # nothing ran


def test_marins_flag_spellings_are_understood(project: Path) -> None:
    sweep(project)
    dry = marinbuild("run", "--dry_run", cwd=project)
    assert dry.returncode == 0 and "train/lr0.1" in dry.stdout and "3 to run" in dry.stdout
    assert not (project / "marinbuild-out").exists()  # a dry run, as -n
    for flag in ("--force_run_failed", "--force-run-failed", "--force_run_failed=true"):
        result = marinbuild("run", "-q", flag, cwd=project)
        assert result.returncode == 0, result.stderr
        assert f"note: {flag.split('=')[0]} is not needed: failed steps always rerun" in result.stderr
    result = marinbuild("run", "--force_run_failed", "True", "eval", cwd=project)  # a value, as Marin's takes it
    assert result.returncode == 0 and "nothing to do" in result.stdout + result.stderr


def test_a_dry_run_with_p_prints_each_command_that_would_run(project: Path) -> None:
    sweep(project)
    rows = plan_json(project)
    shown = ok(marinbuild("run", "-n", "-p", cwd=project))
    out = rows["train/lr0.1"]["output_path"]
    assert f"[train/lr0.1] $ echo 0.1 1 64 2 > {out}/w" in shown
    assert f"[eval] $ for p in {rows['train/lr0.1']['output_path']} {rows['train/lr0.2']['output_path']}; do" in shown
    assert not (project / "marinbuild-out").exists()
    ok(marinbuild("run", "-q", "train/lr0.1", cwd=project))
    shown = ok(marinbuild("run", "-n", "-p", cwd=project))
    assert "[train/lr0.1] $" not in shown and "[train/lr0.2] $" in shown  # only what would run


def test_tables_fit_a_terminal_and_pipes_keep_whole_paths(project: Path) -> None:
    sweep(project)
    ok(marinbuild("run", "-q", cwd=project))
    sweep(project, seed=2, width=128, depth=12)  # three fields change: a long reason
    rows = plan_json(project)
    prefix = str(project / "marinbuild-out")
    for args in (("plan",), ("run", "-n"), ("status",)):
        shown = on_terminal(project, *args)
        assert max(len(line) for line in shown.splitlines()) <= 100, shown
        assert prefix not in shown  # paths relative to the prefix, where there is room for them
        # The reasons leave no room for the output paths in a plan: said, never folded.
        assert "train/lr0.1-" in shown if args == ("status",) else "not shown for room: output" in shown, shown
    shown = on_terminal(project, "plan")
    assert "… (why" in shown  # eval's reason, a whole dependency diff, is cut: `why eval` tells the rest
    assert rows["eval"]["reason"] not in shown and len(rows["eval"]["reason"]) > 60
    wide = on_terminal(project, "plan", "--wide", columns=400)
    assert rows["train/lr0.1"]["output_path"] in wide and "(why" not in wide
    assert rows["eval"]["reason"] in wide  # the whole reason
    piped = ok(marinbuild_in_process("plan", cwd=project))
    assert rows["train/lr0.1"]["output_path"] in piped and rows["train/lr0.1"]["reason"] in piped
    piped_status = marinbuild_in_process("status", cwd=project).stdout
    assert rows["train/lr0.1"]["output_path"] in piped_status


def test_a_closed_pipe_ends_quietly(project: Path) -> None:
    write_marinfile(project, """
        from marinbuild import step
        STEPS = [step(f"s{i:04d}", cmd="true") for i in range(3000)]
    """)
    for args in (("plan", "--dag", "dot"), ("plan",), ("plan", "--json"), ("status",)):
        reader, writer = os.pipe()
        os.close(reader)  # the reader is gone before a byte is written, as `| head` is after its lines
        result = subprocess.run([sys.executable, "-m", "marinbuild", *args], cwd=project, env=cli_env(),
                                stdout=writer, stderr=subprocess.PIPE, text=True, timeout=120)
        os.close(writer)
        assert result.returncode == 141, (args, result.returncode, result.stderr)
        assert result.stderr == "", (args, result.stderr)
    if shutil.which("head"):
        shell = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m marinbuild plan --dag dot | head -2"],
                               cwd=project, env=cli_env(), capture_output=True, text=True, timeout=120)
        assert shell.stdout.splitlines()[0].startswith("digraph") and shell.stderr == ""


def test_plan_says_once_when_nothing_to_run_has_history(project: Path) -> None:
    sweep(project)
    shown = ok(marinbuild_in_process("plan", cwd=project))
    assert shown.count("no history") == 1 and "estimates: no history" in shown
    ok(marinbuild("run", "-q", "train/lr0.1", cwd=project))
    sweep(project, seed=3)
    shown = ok(marinbuild_in_process("plan", cwd=project))
    assert "estimates from earlier runs" in shown  # the sweep points have history now


@pytest.fixture
def index(tmp_path: Path) -> Iterator[str]:
    """A package index on loopback (PEP 503, one wheel): reachable online, not offline."""
    root = tmp_path / "index"
    wheel = make_wheel(root / "files", name="tinyidx", version="1.0")
    page = root / "simple" / "tinyidx"
    page.mkdir(parents=True)
    (page / "index.html").write_text(f'<a href="/files/{wheel.name}">{wheel.name}</a>\n')
    (root / "simple" / "index.html").write_text('<a href="tinyidx/">tinyidx</a>\n')
    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(SimpleHTTPRequestHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()


def test_uvs_offline_attempt_is_silent_when_the_networked_one_installs(project: Path, tmp_path: Path, index: str) -> None:
    from marinbuild.pyenv.builder import find_uv

    try:
        find_uv(tmp_path / "uv-probe")
    except Exception as e:  # uv missing and not installable here
        missing_tool(f"uv is not available here: {e}")
    write_marinfile(project, """
        from marinbuild import step
        step("uses", cmd="python -c 'import tinyidx; print(tinyidx.VALUE)' > {output}/v", pip_dependency_groups=["tinyidx>=1"])
    """)
    env = {"MARINBUILD_ENV_CACHE": str(tmp_path / "envs"), "UV_INDEX_URL": index, "UV_CACHE_DIR": str(tmp_path / "uvc")}
    result = marinbuild("run", cwd=project, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    out = Path(plan_json(project, env=env)["uses"]["output_path"])
    assert (out / "v").read_text().strip() == "42"
    told = result.stdout + result.stderr + (out / "logs" / "step.log").read_text()
    assert "No solution found" not in told and "--offline" not in told, told
    info = json.loads((out / ".marinbuild" / "info.json").read_text())
    assert info["environment"]["requirements"] == ["tinyidx>=1"]
