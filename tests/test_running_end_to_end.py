"""Running Marinfiles end to end through the real command line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from marinbuild.execution.reporting import NullReporter

from .helpers import (
    cli_env,
    marinbuild,
    marinbuild_in_process,
    plan_json,
    snapshot,
    start_marinbuild,
    status_of,
    wait_dead,
    wait_for_text,
    write_marinfile,
)

PIPELINE = """
import json, os, time
from dataclasses import dataclass
from marinbuild import step, versioned, this_output_path, output_path_of

LR = {lr}

def record(out, name):
    with open(os.path.join(os.path.dirname(os.path.dirname(out)), "events.log"), "a") as f:
        f.write(f"{{name}} start {{time.time()}}\\n")
        f.flush()
        time.sleep({sleep})
        f.write(f"{{name}} end {{time.time()}}\\n")

@dataclass(frozen=True)
class TrainConfig:
    data: object
    lr: object
    out: object
    note: str = "{note}"

def make_data(cfg):
    record(cfg["out"], "data")
    open(os.path.join(cfg["out"], "rows.txt"), "w").write("1\\n2\\n3\\n")

def train(cfg):
    record(cfg.out, "train")
    rows = open(os.path.join(cfg.data, "rows.txt")).read().split()
    json.dump({{"lr": cfg.lr, "rows": len(rows)}}, open(os.path.join(cfg.out, "model.json"), "w"))

data = step("data", make_data, {{"n": versioned(3), "out": this_output_path()}})
model = step("train", train, TrainConfig(data=data, lr=versioned(LR), out=this_output_path()))
side = step("side", cmd="echo side > {{output}}/side.txt", config={{"v": versioned(1)}})
"""


def pipeline(project: Path, lr=0.1, note="plain", sleep=0.0):
    write_marinfile(project, PIPELINE.format(lr=lr, note=note, sleep=sleep))


def test_run_then_nothing_to_do_then_versioned_change_reruns_downstream_only(project):
    pipeline(project)
    first = marinbuild("run", cwd=project)
    assert first.returncode == 0, first.stderr
    before = plan_json(project)
    assert {r["action"] for r in before.values()} == {"skip"}
    model = json.loads((Path(before["train"]["output_path"]) / "model.json").read_text())
    assert model == {"lr": 0.1, "rows": 3}

    pipeline(project, note="changed plain field")
    assert {r["action"] for r in plan_json(project).values()} == {"skip"}

    pipeline(project, lr=0.2)
    after = plan_json(project)
    assert after["train"]["action"] == "run" and after["data"]["action"] == "skip"
    assert after["side"]["action"] == "skip"
    assert "lr: 0.1 -> 0.2" in after["train"]["reason"]
    assert marinbuild("run", cwd=project).returncode == 0

    pipeline(project, lr=0.1)  # changing it back reuses the first output
    back = plan_json(project)
    assert {r["action"] for r in back.values()} == {"skip"}
    assert back["train"]["output_path"] == before["train"]["output_path"]


def test_plan_writes_nothing(project):
    pipeline(project)
    prefix = project / "marinbuild-out"
    assert marinbuild_in_process("plan", cwd=project).returncode == 0
    assert not prefix.exists()
    assert marinbuild("run", "data", cwd=project).returncode == 0
    pipeline(project, lr=0.5)
    before = snapshot(prefix)
    for args in (["plan"], ["plan", "--json"], ["plan", "--dag", "dot"], ["run", "--dry"], ["status"], ["why", "train"]):
        result = (marinbuild if args[0] == "run" else marinbuild_in_process)(*args, cwd=project)
        assert result.returncode == 0, (args, result.stderr)
    assert snapshot(prefix) == before


def test_prefix_flag_env_and_relative_resolution(project, tmp_path):
    pipeline(project)
    env_prefix = tmp_path / "from-env"
    result = marinbuild_in_process("plan", "--json", cwd=project, env={"MARIN_PREFIX": str(env_prefix)})
    rows = json.loads(result.stdout)
    assert all(r["output_path"].startswith(str(env_prefix) + "/") for r in rows)
    rows = json.loads(marinbuild_in_process("plan", "--json", "--prefix", "rel/out", cwd=project).stdout)
    assert all(r["output_path"].startswith(str(project / "rel" / "out") + "/") for r in rows)
    rows = json.loads(marinbuild_in_process("plan", "--json", "--prefix", f"file://{tmp_path}/u", cwd=project).stdout)
    assert all(r["output_path"].startswith(f"{tmp_path}/u/") for r in rows)


FAILING = """
import os, time
from marinbuild import step, versioned
def boom(cfg):
    raise ValueError("bad value in step")
bad = step("bad", boom, {"v": versioned(1)})
after_bad = step("after_bad", cmd="echo never > {output}/x", config={"b": bad})
good = step("good", cmd="sleep 0.5; echo ok > {output}/ok.txt", config={"v": versioned(1)})
"""


def test_failing_step_marks_failed_and_exit_1_and_keep_going(project):
    write_marinfile(project, FAILING)
    result = marinbuild("run", "-k", "-j", "1", cwd=project)
    assert result.returncode == 1
    rows = plan_json(project)
    bad = status_of(rows["bad"]["output_path"])
    assert bad["status"] == "FAILED" and "ValueError: bad value in step" in bad["error"]
    assert "FAILED bad: ValueError: bad value in step" in result.stdout
    assert "log: " + rows["bad"]["output_path"] + "/logs/step.log" in result.stdout
    assert "Traceback" in (Path(rows["bad"]["output_path"]) / "logs/step.log").read_text()
    assert status_of(rows["good"]["output_path"])["status"] == "SUCCESS"
    assert status_of(rows["after_bad"]["output_path"]) is None
    assert rows["bad"]["action"] == "run" and rows["bad"]["reason"].startswith("failed before")


def test_without_keep_going_no_new_step_starts_after_a_failure(project):
    write_marinfile(project, FAILING.replace('"sleep 0.5; ', '"'))
    result = marinbuild("run", "bad", "good", "-j", "1", cwd=project)
    assert result.returncode == 1
    rows = plan_json(project)
    # bad comes first in order; with one job and no -k, good never starts.
    assert status_of(rows["good"]["output_path"]) is None
    assert "not started" in result.stdout


def test_shell_step_failure_exit_status(project):
    write_marinfile(project, 'from marinbuild import step\nstep("sh", cmd="echo out; exit 3")\n')
    result = marinbuild("run", cwd=project)
    assert result.returncode == 1
    row = plan_json(project)["sh"]
    assert status_of(row["output_path"])["error"] == "exit status 3"
    header, *rest = (Path(row["output_path"]) / "logs/step.log").read_text().splitlines()
    assert header.startswith("=== marinbuild attempt 1 ") and header.endswith(" backend local ===")
    assert rest == ["out"]


def test_parallel_jobs_overlap(project):
    write_marinfile(
        project,
        """
        import time
        from marinbuild import step, versioned
        def work(cfg):
            with open(cfg["log"], "a") as f:
                f.write(f"{cfg['i']} start {time.time()}\\n")
            # Until the other step has started too (a minute at most): run one after the
            # other, the first ends before the second starts and the overlap is not there.
            deadline = time.time() + 60
            while f"{1 - cfg['i']} start" not in open(cfg["log"]).read() and time.time() < deadline:
                time.sleep(0.02)
            with open(cfg["log"], "a") as f:
                f.write(f"{cfg['i']} end {time.time()}\\n")
        for i in range(2):
            step(f"w{i}", work, {"i": versioned(i), "log": "events.log"})
        """,
    )
    assert marinbuild("run", "-j", "2", cwd=project).returncode == 0
    events = {}
    for line in (project / "events.log").read_text().splitlines():
        i, what, t = line.split()
        events[(i, what)] = float(t)
    assert events[("0", "start")] < events[("1", "end")] and events[("1", "start")] < events[("0", "end")]


def test_sigkill_of_the_tool_mid_step_leaves_no_success_and_next_run_reruns(project):
    write_marinfile(
        project,
        """
        import os, time
        from marinbuild import step
        def slow(cfg):
            open("started", "w").write(str(os.getpid()))
            time.sleep(60)
        step("slow", slow, {})
        """,
    )
    proc = start_marinbuild("run", cwd=project)
    child = int(wait_for_text(project / "started"))
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    row = plan_json(project)["slow"]
    assert status_of(row["output_path"])["status"] == "RUNNING"
    assert row["action"] == "run"
    # The step's process died with the runner instead of going on unsupervised.
    assert wait_dead(child)
    # status agrees with plan: the lease left behind is no one's.
    shown = json.loads(marinbuild_in_process("status", "--json", cwd=project).stdout)[0]
    assert shown["status"] == "RUNNING" and shown["lease"] is None
    assert "its runner is gone" in marinbuild_in_process("status", cwd=project).stdout


def _with_sigint(disposition: str, argv: list[str]) -> list[str]:
    """``argv`` started with SIGINT ignored or at its default, through a small interpreter that
    sets it and execs: no ``preexec_fn``, whose fork would run the at-fork handlers of whatever
    this worker holds (gRPC's, from an earlier ``gs://`` test, crashed the child at times)."""
    handler = "SIG_IGN" if disposition == "ignored" else "SIG_DFL"
    code = f"import os, signal, sys; signal.signal(signal.SIGINT, signal.{handler}); os.execv(sys.argv[1], sys.argv[1:])"
    return [sys.executable, "-c", code, *argv]


@pytest.mark.parametrize("inherited", ["default", "ignored"])
def test_interrupt_marks_running_step_failed_and_exits_130(project, inherited):
    # "ignored": started as a script's background job is (and as pytest is from one).
    write_marinfile(
        project,
        """
        import time
        from marinbuild import step
        step("slow", cmd="touch started; sleep 60")
        """,
    )
    proc = subprocess.Popen(
        _with_sigint(inherited, [sys.executable, "-m", "marinbuild", "run"]),
        cwd=project,
        env=cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    # The runner says the step started (it holds it as running by then) and the step runs.
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if not first.startswith("start slow"):
        proc.kill()
        rest, err = proc.communicate(timeout=60)
        raise AssertionError(f"the runner said {first + rest!r} and ended {proc.returncode}; stderr: {err}")
    deadline = time.time() + 30
    while not (project / "started").exists() and time.time() < deadline:
        time.sleep(0.05)
    sent = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == 130, out + err
    row = plan_json(project)["slow"]
    rec = status_of(row["output_path"])
    assert rec["status"] == "FAILED" and rec["error"] == "interrupted", (rec, out, err, f"exited {took:.1f} s after SIGINT")


def test_success_target_with_deleted_ancestors_is_up_to_date(project):
    pipeline(project)
    assert marinbuild("run", cwd=project).returncode == 0
    rows = plan_json(project)
    import shutil

    shutil.rmtree(rows["data"]["output_path"])
    result = marinbuild("run", "train", cwd=project)
    assert result.returncode == 0 and "nothing to do" in result.stdout
    assert not Path(rows["data"]["output_path"]).exists()


def test_why_names_the_changed_field(project):
    pipeline(project)
    assert marinbuild("run", cwd=project).returncode == 0
    pipeline(project, lr=0.3)
    result = marinbuild_in_process("why", "train", cwd=project)
    assert result.returncode == 0
    assert "would run" in result.stdout
    assert "lr: 0.1 -> 0.3" in result.stdout
    dep = marinbuild_in_process("why", "data", cwd=project)
    assert "up to date" in dep.stdout


def test_why_names_a_changed_dependency(project):
    pipeline(project)
    assert marinbuild("run", cwd=project).returncode == 0
    write_marinfile(project, PIPELINE.format(lr=0.1, note="x", sleep=0).replace('versioned(3)', 'versioned(4)'))
    result = marinbuild_in_process("why", "train", cwd=project)
    assert "dependency data: data-" in result.stdout


def test_clean_orphans_and_targets(project, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("keep")
    pipeline(project)
    assert marinbuild("run", cwd=project).returncode == 0
    old = plan_json(project)
    pipeline(project, lr=0.7)
    assert marinbuild("run", cwd=project).returncode == 0
    new = plan_json(project)
    dry = marinbuild("clean", "--orphans", "--dry", cwd=project)
    assert old["train"]["output_path"] in dry.stdout and Path(old["train"]["output_path"]).exists()
    result = marinbuild("clean", "--orphans", "--yes", cwd=project)
    assert result.returncode == 0
    assert not Path(old["train"]["output_path"]).exists()
    for row in new.values():
        assert Path(row["output_path"]).exists()
    assert outside.read_text() == "keep"
    refused = marinbuild("clean", "side", cwd=project)
    assert refused.returncode == 2 and Path(new["side"]["output_path"]).exists()
    assert marinbuild("clean", "side", "--yes", cwd=project).returncode == 0
    assert not Path(new["side"]["output_path"]).exists()
    assert Path(new["train"]["output_path"]).exists()


def test_plan_check_and_dag_outputs(project):
    pipeline(project)
    assert marinbuild_in_process("plan", "--check", cwd=project).returncode == 1
    dot = marinbuild_in_process("plan", "--dag", "dot", cwd=project).stdout
    assert dot.startswith("digraph") and '"data" -> "train"' in dot
    mermaid = marinbuild_in_process("plan", "--dag", "mermaid", cwd=project).stdout
    assert mermaid.startswith("flowchart") and "-->" in mermaid
    assert marinbuild("run", cwd=project).returncode == 0
    assert marinbuild_in_process("plan", "--check", cwd=project).returncode == 0


def test_status_reports_each_step(project):
    pipeline(project)
    marinbuild("run", "data", cwd=project)
    result = marinbuild_in_process("status", "--json", cwd=project)
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert rows["data"]["status"] == "SUCCESS" and rows["data"]["duration"] is not None
    assert rows["train"]["status"] == "NONE"


def test_info_json_records_provenance(project):
    pipeline(project)
    assert marinbuild("run", "side", cwd=project).returncode == 0
    row = plan_json(project)["side"]
    info = json.loads((Path(row["output_path"]) / ".marinbuild/info.json").read_text())
    assert info["identity_payload"] == {"name": "side", "versioned": {"v": 1}, "dependencies": {}}
    assert info["command"] == f"echo side > {row['output_path']}/side.txt"
    for key in ("user", "host", "start_time", "end_time", "config", "dependencies"):
        assert key in info
    assert os.path.isabs(info["output_path"])


def test_plan_into_a_pipe_is_plain_columns_without_rich(project):
    write_marinfile(
        project,
        """
        from marinbuild import step, Cores
        a = step("prep", cmd="echo a > {output}/a", config={"i": 1})
        step("train", cmd="cat {prep}/a > {output}/b", config={"prep": a}, resources=Cores(1))
        """,
    )
    result = marinbuild_in_process("plan", cwd=project)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["step", "action", "reason", "resources", "output"]
    rows = {line.split()[0]: line.split() for line in lines[1:3]}
    assert rows["prep"][1:3] == ["run", "new"] and rows["train"][1:3] == ["run", "new"]
    assert rows["train"][4].startswith(str(project / "marinbuild-out" / "train-"))
    assert "2 to run" in lines
    # Aligned columns: every row's output path starts where the header's does.
    column = lines[0].index("output")
    assert all(line[column:].startswith(str(project)) for line in lines[1:3])
    assert not any(ch in result.stdout for ch in "│┃━\x1b")
    code = (
        "import sys\nfrom marinbuild.cli.app import command_line\nsys.argv = ['marinbuild', 'plan']\n"
        "try:\n    command_line()\nexcept SystemExit:\n    pass\n"
        "print('RICH' if 'rich' in sys.modules else 'NO-RICH', file=sys.stderr)"
    )
    probe = subprocess.run([sys.executable, "-c", code], cwd=project, env=cli_env(), capture_output=True, text=True)
    assert probe.stderr.strip().splitlines()[-1] == "NO-RICH"


@pytest.mark.parametrize("kind", ["a file", "under a file"])
@pytest.mark.parametrize("command", ["plan", "run", "status"])
def test_a_prefix_that_is_not_a_folder_is_one_line_naming_it_exit_2(project, kind, command):
    pipeline(project)
    (project / "afile").write_text("not a folder")
    prefix = "afile" if kind == "a file" else "afile/out"
    result = marinbuild(command, "--prefix", prefix, cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"marinbuild: error: prefix '{prefix}' is not a folder") and "Traceback" not in line
    assert result.stdout == "" and (project / "afile").read_text() == "not a folder"


def test_a_prefix_that_cannot_be_created_is_one_line_naming_it_exit_2(project):
    pipeline(project)
    prefix = "/proc/marinbuild-out"  # no user, root included, can create a folder here
    result = marinbuild("run", "--prefix", prefix, cwd=project)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"marinbuild: error: prefix '{prefix}' ")
    assert "internal error" not in line and not os.path.exists(prefix)


BARRIER = """
from marinbuild import step, Cores

GATE = {gate!r}

def meet(n):
    # Each step waits (up to 20 s) until n steps have started: only n at once get through.
    return (
        f"touch {{GATE}}/started_$MARINBUILD_STEP; i=0; "
        f"while [ $(ls {{GATE}} | wc -l) -lt {{n}} ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done; "
        f"[ $(ls {{GATE}} | wc -l) -ge {{n}} ] && echo met"
    )

{steps}
"""


def test_jobs_limits_steps_that_declare_nothing_not_the_core_count(project, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    steps = "\n".join(f'step("s{i}", cmd=meet(3))' for i in range(3))
    write_marinfile(project, BARRIER.format(gate=str(gate), steps=steps))
    # One core, -j 3: make would run three jobs at once, and so does marinbuild.
    result = marinbuild("run", "--cores", "1", "-j", "3", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("[s0] met") == 1  # each step's output is printed, prefixed


def test_jobs_leaves_steps_that_declare_resources_within_the_budget(project, tmp_path):
    write_marinfile(
        project,
        f"""
        from marinbuild import step, Cores
        LOG = {str(tmp_path / "events.log")!r}
        for i in range(3):
            step(f"c{{i}}", cmd=f"echo c{{i}} start >> {{LOG}}; sleep 0.3; echo c{{i}} end >> {{LOG}}", resources=Cores(1))
        """,
    )
    result = marinbuild("run", "--cores", "1", "-j", "3", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    events = (tmp_path / "events.log").read_text().split("\n")[:-1]
    # One core: each declared step starts only after the one before ended.
    assert [e.split()[1] for e in events] == ["start", "end"] * 3


def test_a_bare_j_means_all_cores_and_dry_run_is_accepted(project, tmp_path):
    gate = tmp_path / "gate"
    gate.mkdir()
    steps = "\n".join(f'step("s{i}", cmd=meet(2))' for i in range(2))
    write_marinfile(project, BARRIER.format(gate=str(gate), steps=steps))
    dry = marinbuild("run", "--dry-run", cwd=project)
    assert dry.returncode == 0 and "2 to run" in dry.stdout
    result = marinbuild("run", "--cores", "2", "-j", cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr


class _Waits(NullReporter):
    def __init__(self) -> None:
        self.counts: list[dict[str, int]] = []

    def steps_waiting(self, counts: dict[str, int]) -> None:
        self.counts.append(dict(counts))


def test_the_run_says_how_many_ready_steps_wait_and_on_what(project, tmp_path):
    import marinbuild

    write_marinfile(
        project,
        """
        from marinbuild import step, Cores
        for i in range(3):
            step(f"c{i}", cmd="sleep 0.2", resources=Cores(1))
        """,
    )
    waits = _Waits()
    summary = marinbuild.run(file=str(project / "Marinfile.py"), prefix=str(project / "out"), cores=1, reporter=waits)
    assert summary.ok
    assert {"cores": 2} in waits.counts and waits.counts[-1] == {}


def test_live_view_line_names_what_steps_wait_on():
    from marinbuild.cli.console import waiting_line

    line = waiting_line({"cores": 2, "a lease held by another runner": 1, "a GPU": 1})
    assert line == "waiting: 2 on cores, 1 on a GPU, 1 on a lease held by another runner"


def test_step_output_is_printed_prefixed_and_a_failure_shows_its_log_tail(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        def boom(cfg):
            print("loading the data")
            raise ValueError("the data is bad")
        step("fn", boom)
        step("sh", cmd="echo step one; echo 'error: no such file data.csv' >&2; exit 3")
        """,
    )
    first = marinbuild("run", "-k", cwd=project)
    assert first.returncode == 1
    assert "[fn] loading the data" in first.stdout and "[sh] step one" in first.stdout
    summary = first.stdout.split("0 done, 2 failed")[1]
    assert "| error: no such file data.csv" in summary and "| ValueError: the data is bad" in summary
    quiet = marinbuild("run", "-k", "-q", cwd=project)
    assert "[sh]" not in quiet.stdout
    # The summary shows this attempt's lines only, though the log keeps the first run's too.
    assert quiet.stdout.count("| step one") == 1
    silent = marinbuild("run", "-k", "--no-print-output", cwd=project)
    assert "[sh]" not in silent.stdout and "| step one" in silent.stdout


def test_status_into_a_pipe_is_plain_unwrapped_columns_with_an_error_column(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        step("a_step_with_a_rather_long_name/for_paths", cmd="echo ok")
        step("broken", cmd="echo 'no such file: data.csv' >&2; exit 3")
        """,
    )
    marinbuild("run", "-k", cwd=project)
    rows = plan_json(project)
    result = marinbuild_in_process("status", cwd=project, env={"COLUMNS": "40"})
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["step", "status", "duration", "finished", "output", "error"]
    ok = next(line for line in lines if line.startswith("a_step_with"))
    assert rows["a_step_with_a_rather_long_name/for_paths"]["output_path"] in ok  # whole, on one line
    broken = next(line for line in lines if line.startswith("broken"))
    assert "FAILED" in broken and broken.endswith("exit status 3")
    assert len(lines) == 3 and not any(ch in result.stdout for ch in "┃━│")


def test_clean_without_a_terminal_lists_what_would_go_and_removes_nothing(project):
    pipeline(project)
    assert marinbuild("run", "data", cwd=project).returncode == 0
    out = plan_json(project)["data"]["output_path"]
    result = subprocess.run(
        [sys.executable, "-m", "marinbuild", "clean", "data"],
        cwd=project, env=cli_env(), capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=60,
    )
    assert result.returncode == 2
    assert result.stdout == f"would remove {out}\n"
    assert "nothing removed; pass --yes" in result.stderr and Path(out).is_dir()


def test_clean_answered_no_says_nothing_was_removed(project):
    import pty

    pipeline(project)
    assert marinbuild("run", "data", cwd=project).returncode == 0
    out = plan_json(project)["data"]["output_path"]
    controller, terminal = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "marinbuild", "clean", "data"],
        cwd=project, env=cli_env(), stdin=terminal, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    os.close(terminal)
    os.write(controller, b"n\n")
    _, err = proc.communicate(timeout=60)
    os.close(controller)
    assert proc.returncode == 1 and "nothing removed" in err and Path(out).is_dir()


def test_why_explains_every_step_a_glob_matches_and_says_up_to_date_once(project):
    pipeline(project)
    assert marinbuild("run", cwd=project).returncode == 0
    result = marinbuild_in_process("why", "*a*", cwd=project)  # data and train
    assert result.returncode == 0
    heads = [line for line in result.stdout.splitlines() if line and not line.startswith(" ")]
    assert heads == ["data is up to date", "train is up to date"]


def test_an_output_path_or_a_file_in_it_is_a_target(project):
    pipeline(project)
    rows = plan_json(project)
    data_out = Path(rows["data"]["output_path"])
    rel = os.path.relpath(data_out, project)
    planned = marinbuild_in_process("plan", "--json", rel + "/", cwd=project)
    assert planned.returncode == 0, planned.stderr
    assert [r["name"] for r in json.loads(planned.stdout)] == ["data"]
    assert marinbuild("run", str(data_out / "rows.txt"), cwd=project).returncode == 0
    assert status_of(str(data_out))["status"] == "SUCCESS"
    assert status_of(rows["train"]["output_path"]) is None


def test_shell_completion_is_offered():
    # The shell is named, not detected: detection walks up the process tree to a shell, and
    # a test started from a service or a detached job has none above it.
    result = subprocess.run(
        [sys.executable, "-m", "marinbuild", "--show-completion", "bash"],
        env=cli_env({"_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}), capture_output=True, text=True,
        timeout=60, start_new_session=True,
    )
    assert result.returncode == 0 and "_MARINBUILD_COMPLETE" in result.stdout


HIDE = """
import importlib.abc, sys

class _Hidden(importlib.abc.MetaPathFinder):
    # As if these optional packages were not installed.
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {hidden!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, _Hidden())
"""


def _without(tmp_path: Path, *packages: str) -> dict[str, str]:
    folder = tmp_path / "hide"
    folder.mkdir(exist_ok=True)
    (folder / "sitecustomize.py").write_text(HIDE.format(hidden=set(packages)))
    return {"PYTHONPATH": os.pathsep.join([str(folder), cli_env()["PYTHONPATH"]])}


def _one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("marinbuild: error: ") and "internal error" not in line
    return line


def test_a_missing_optional_package_is_one_line_naming_its_extra(project, tmp_path):
    from .helpers import copy_example

    tpu = copy_example("tpu", tmp_path)
    line = _one_error_line(marinbuild("run", "train", "--cluster", "cluster.toml", cwd=tpu, env=_without(tmp_path, "paramiko")))
    assert "TPU steps need paramiko" in line and "pip install -e '.[tpu]'" in line

    pipeline(project)
    line = _one_error_line(marinbuild("plan", "--prefix", "gs://bucket/x", cwd=project, env=_without(tmp_path, "gcsfs")))
    assert "needs gcsfs" in line and "'marinbuild[gcs]'" in line and "pip install -e '.[gcs]'" in line

    line = _one_error_line(marinbuild("run", "--backend", "ray", cwd=project, env=_without(tmp_path, "ray")))
    assert "the Ray backend needs ray" in line and "pip install -e '.[ray]'" in line

    write_marinfile(project, "import jax\nfrom marinbuild import step\nstep('a', cmd='true')\n")
    line = _one_error_line(marinbuild("plan", cwd=project, env=_without(tmp_path, "jax")))
    assert "Marinfile.py:1: this Marinfile needs jax" in line and "pip install -e '.[jax]'" in line


def test_an_error_in_a_module_the_marinfile_imports_is_shown_where_it_was_raised(project):
    (project / "helper.py").write_text("def load():\n    raise ValueError('bad row 7')\n")
    write_marinfile(project, "import helper\nfrom marinbuild import step\nhelper.load()\nstep('a', cmd='true')\n")
    line = _one_error_line(marinbuild_in_process("plan", cwd=project))
    assert f"{project / 'helper.py'}:2: ValueError: bad row 7" in line
    verbose = marinbuild_in_process("plan", "-v", cwd=project)
    assert verbose.returncode == 2
    # -v: the whole traceback, the user's frames included.
    assert 'helper.py", line 2, in load' in verbose.stderr and 'Marinfile.py", line 3' in verbose.stderr


def test_the_summary_counts_steps_another_runner_finished_apart():
    from rich.console import Console

    from marinbuild.cli.console import print_summary
    from marinbuild.execution.reporting import Summary

    console = Console(record=True, width=200)
    print_summary(console, Summary(total=3, done=3, finished_elsewhere=["b"]))
    assert console.export_text().startswith("2 done, 0 failed, 0 up to date, 1 finished by another runner in ")


def test_run_json_keeps_stdout_to_json_lines_when_there_is_nothing_to_do(project):
    write_marinfile(project, 'from marinbuild import step\nstep("a", cmd="echo ok > {output}/o")\n')
    first = marinbuild("run", "--json", "--prefix", "out", cwd=project)
    again = marinbuild("run", "--json", "--prefix", "out", cwd=project)
    for result in (first, again):
        assert result.returncode == 0, result.stderr
        for line in result.stdout.splitlines():
            json.loads(line)  # every line of stdout is an event
    assert [json.loads(line)["event"] for line in first.stdout.splitlines()][-1] == "summary"
    assert "nothing to do: 1 step up to date" in again.stderr
