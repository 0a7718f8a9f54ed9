"""Several real ``marinbuild run`` processes on one prefix: nothing twice, crashes healed.

Every step appends ``NAME SHELL_PID RUNNER_PID start|end`` to a log outside the prefix, so
the log tells which runner ran what, and whether a step ran more than once.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import time
from collections import Counter
from pathlib import Path

from marinbuild.execution.output_folder import clear_output
from marinbuild.store.conditional import conditional_store
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.storage import Storage

from .helpers import (
    marinbuild,
    marinbuild_in_process,
    start_marinbuild,
    wait_dead,
    wait_for_text,
    write_marinfile,
)

LEASE_ENV = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}

DAG = """
from marinbuild import step, versioned, output_path_of

LOG = "@LOG@"
SLOW = @SLOW@
GATE = @GATE@

def work(name, inputs, seconds):
    # Write the output aside and move it into place: complete or absent, never half.
    reads = " ".join("cat {%s} >/dev/null;" % k for k in inputs)
    # With a GATE, a slow step waits for the test to open it instead of sleeping.
    wait = f"while [ ! -e {GATE} ]; do sleep 0.05; done;" if GATE and seconds == SLOW else f"sleep {seconds};"
    return (
        f"echo {name} $$ $PPID start >> {LOG}; {wait} {reads} "
        f"echo {name}-half > {{output}}/out.tmp; echo {name}-complete >> {{output}}/out.tmp; "
        f"mv {{output}}/out.tmp {{output}}/out.txt; echo {name} $$ $PPID end >> {LOG}"
    )

def make(name, deps, seconds=0.05):
    config = {f"in{i}": output_path_of(d, "out.txt") for i, d in enumerate(deps)}
    inputs = list(config)
    config["v"] = versioned(1)
    return step(name, cmd=work(name, inputs, seconds), config=config)

root = make("root", [])
l1 = [make(f"l1_{i}", [root]) for i in range(8)]
l2 = [make(f"l2_{i}", [l1[i // 2], l1[(i + 1) % 8]], SLOW) for i in range(16)]
l3 = [make(f"l3_{i}", [l2[i], l2[(i + 5) % 16]]) for i in range(16)]
l4 = [make(f"l4_{i}", [l3[2 * i], l3[2 * i + 1]]) for i in range(8)]
sink = make("sink", l4)
"""
STEPS = 50


def dag(project: Path, slow: float = 0.05, gate: Path | None = None) -> Path:
    """Write the DAG's Marinfile; with ``gate`` its l2 steps wait until that file exists."""
    log = project.parent / "steps.log"
    body = DAG.replace("@LOG@", str(log)).replace("@SLOW@", repr(slow)).replace("@GATE@", repr(gate and str(gate)))
    write_marinfile(project, body)
    return log


def events(log: Path) -> list[tuple[str, int, int, str]]:
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        name, shell, runner, what = line.split()
        out.append((name, int(shell), int(runner), what))
    return out


def outputs(prefix: Path) -> dict[str, Path]:
    # Step outputs only: not the mirror, nor the prefix's own .marinbuild folder.
    return {p.name.rsplit("-", 1)[0]: p for p in prefix.iterdir() if p.is_dir() and p.name != "mirror" and not p.name.startswith(".")}


def assert_every_success_is_complete(prefix: Path) -> None:
    done = 0
    for name, out in outputs(prefix).items():
        status = json.loads((out / ".marinbuild" / "status").read_text())
        if status["status"] == "SUCCESS":
            done += 1
            assert (out / "out.txt").read_text() == f"{name}-half\n{name}-complete\n"
            assert json.loads((out / ".marinbuild" / "info.json").read_text())["name"] == name
    assert done == STEPS


# -- conditional writes on local disk, raced by processes and threads ----------------------


def _race(path: str, start: float, tag: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    import threading

    store = conditional_store(Storage.for_prefix(os.path.dirname(path)))
    wins = []

    def one(i: int) -> None:
        while time.time() < start:
            pass
        if store.create(path, f"{tag}-{i}") is not None:
            wins.append(f"{tag}-{i}")

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put(wins)


def _race_swap(path: str, expected: str, start: float, tag: str, results: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    store = conditional_store(Storage.for_prefix(os.path.dirname(path)))
    while time.time() < start:
        pass
    results.put([tag] if store.swap(path, expected, tag) is not None else [])


def _contest(target: object, *args: object) -> list[str]:
    """Start 8 processes running ``target(*args, start, tag, results)`` together; the winners."""
    ctx = multiprocessing.get_context("fork")
    results: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    start = time.time() + 0.3
    procs = [ctx.Process(target=target, args=(*args, start, f"p{i}", results)) for i in range(8)]  # type: ignore[arg-type]
    for p in procs:
        p.start()
    wins = [w for _ in procs for w in results.get(timeout=30)]
    for p in procs:
        p.join()
    return wins


def test_create_if_absent_has_exactly_one_winner_among_processes_and_threads(tmp_path: Path) -> None:
    for round_ in range(10):
        path = str(tmp_path / f"r{round_}" / ".marinbuild" / "lease")
        wins = _contest(_race, path)
        assert len(wins) == 1, wins
        assert Path(path).read_text() == wins[0]


def test_compare_and_swap_has_exactly_one_winner_among_processes(tmp_path: Path) -> None:
    for round_ in range(10):
        path = str(tmp_path / f"s{round_}" / "lease")
        store = conditional_store(Storage.for_prefix(str(tmp_path)))
        expected = store.create(path, "initial")
        assert expected is not None
        wins = _contest(_race_swap, path, expected)
        assert len(wins) == 1, wins
        assert Path(path).read_text() == wins[0]


# -- whole runs ------------------------------------------------------------------------------


SIX_RUNNERS: list[list[str]] = [[], [], [], ["l4_*"], ["l3_*", "sink"], ["l2_*"]]


def run_six_runners(project: Path, env: dict[str, str], timeout: float) -> None:
    """Six concurrent `marinbuild run`s with overlapping targets; each must exit 0."""
    runners = [start_marinbuild("run", "-q", *t, cwd=project, env=env) for t in SIX_RUNNERS]
    for r in runners:
        out, err = r.communicate(timeout=timeout)
        assert r.returncode == 0, out + err


def test_six_runners_run_every_step_exactly_once(project: Path) -> None:
    log = dag(project)
    # A long expiry: no runner dies here, and a heartbeat delayed by load must not let another take a
    # live runner's step (that would be the lease doing its job, and a step run twice).
    run_six_runners(project, {**LEASE_ENV, "MARINBUILD_LEASE_EXPIRY": "60"}, timeout=120)
    starts = Counter(name for name, _, _, what in events(log) if what == "start")
    assert len(starts) == STEPS and set(starts.values()) == {1}, starts
    assert len({runner for *_, runner, _ in events(log)}) > 1  # the work was shared
    assert_every_success_is_complete(project / "marinbuild-out")
    assert not list((project / "marinbuild-out").glob("*/.marinbuild/lease"))


def test_killed_runners_steps_are_taken_over_and_nothing_half_done_is_marked(project: Path) -> None:
    # The l2 steps wait at a gate the test opens only after the kills, so a victim is always
    # caught in the middle of its step, however slow the machine. A runner on this machine
    # whose process is gone loses its leases at once; a long expiry keeps a live runner's
    # lease safe from a heartbeat delayed by load.
    gate = project.parent / "gate"
    log = dag(project, slow=1.0, gate=gate)
    env = {"MARINBUILD_LEASE_HEARTBEAT": "1", "MARINBUILD_LEASE_EXPIRY": "60"}
    runners = [start_marinbuild("run", "-q", cwd=project, env=env) for _ in range(6)]
    try:
        _kill_two_mid_step_then_finish(project, runners, log, gate)
    finally:
        gate.touch()  # a failed assertion must not leave runners waiting at the gate
        for r in runners:
            if r.poll() is None:
                r.kill()
                r.wait()


def _kill_two_mid_step_then_finish(project: Path, runners: list, log: Path, gate: Path) -> None:  # type: ignore[type-arg]
    pids = {r.pid: r for r in runners}
    victims: dict[int, str] = {}
    deadline = time.monotonic() + 120
    while len(victims) < 2 and time.monotonic() < deadline:
        for name, _, runner, what in events(log):
            if (what == "start" and name.startswith("l2_") and runner in pids
                    and runner not in victims and name not in victims.values()):
                pids[runner].send_signal(signal.SIGKILL)
                victims[runner] = name
                break
        time.sleep(0.05)
    assert len(victims) == 2, "two runners should have been caught in the middle of a step"
    for shell in {shell for _, shell, runner, what in events(log) if what == "start" and runner in victims}:
        # The guardian kills a dead runner's steps (tests/test_running_end_to_end.py checks it); a runner
        # killed in the instant between starting a shell step and registering it with its
        # guardian leaves that step behind. Either way it must be gone before the gate opens,
        # or it would finish its step beside the runner that took it over.
        if not wait_dead(shell, 10):
            os.killpg(shell, signal.SIGKILL)
            assert wait_dead(shell, 10)
    gate.touch()
    for r in runners:
        out, err = r.communicate(timeout=120)
        if r.pid in victims:
            assert r.returncode == -signal.SIGKILL
        else:
            assert r.returncode == 0, out + err
    history = events(log)
    starts = Counter(name for name, _, _, what in history if what == "start")
    by_victims = Counter(name for name, _, runner, what in history if what == "start" and runner in victims)
    for name in victims.values():
        assert starts[name] >= 2  # killed in the middle, then run again by a survivor
        assert (name, "end") not in {(n, w) for n, _, r, w in history if r in victims}
    # Only what a killed runner had started (and not recorded) ran again; all else ran once.
    for name, count in starts.items():
        assert count - 1 <= by_victims[name], (name, count)
    assert len(starts) == STEPS
    assert_every_success_is_complete(project / "marinbuild-out")


STOLEN = '''
import os
from marinbuild import step

FIRST = {first!r}

def cmd():
    # The first attempt sleeps long (it is meant to be killed); the next one is quick.
    return (
        f"echo $$ > {{FIRST}}.pid; if [ -e {{FIRST}} ]; then sleep 0.1; else touch {{FIRST}}; sleep 60; fi; "
        "echo trained > {{output}}/model.txt"
    )

step("train", cmd=cmd())
'''


def test_a_runner_whose_lease_is_taken_kills_its_step_and_records_nothing(project: Path) -> None:
    first = project.parent / "first-attempt"
    write_marinfile(project, STOLEN.format(first=str(first)))
    heartbeat = 1.0
    env = {"MARINBUILD_LEASE_HEARTBEAT": str(heartbeat), "MARINBUILD_LEASE_EXPIRY": "4"}
    runner = start_marinbuild("run", cwd=project, env=env)
    step_pid = int(wait_for_text(Path(f"{first}.pid")))
    out = next((project / "marinbuild-out").glob("train-*"))

    # While it runs, plan and status show the lease.
    plan = json.loads(marinbuild_in_process("plan", "--json", cwd=project, env=env).stdout)
    assert plan[0]["action"] == "wait"
    assert plan[0]["reason"].startswith(f"waiting: leased by {socket.gethostname()}:{runner.pid} since ")
    status = json.loads(marinbuild_in_process("status", "--json", cwd=project, env=env).stdout)
    assert status[0]["status"] == "RUNNING" and status[0]["lease"]["owner"] == f"{socket.gethostname()}:{runner.pid}"

    # Another owner (on another machine, never renewing) appears in the lease file, written under
    # the lock a renewal holds between its comparison and its write, as another runner writes it.
    thief = Owner("another-host", 4242, "1", "thief", "elsewhere")
    conditional_store(Storage.for_prefix(str(out))).put(
        lease_path(str(out)), LeaseRecord(thief, time.time(), time.time()).to_json())
    assert wait_dead(step_pid, 30)  # killed at the runner's next renewal, long before its 60 s end
    record = json.loads((out / ".marinbuild" / "status").read_text())
    assert record["status"] == "RUNNING"  # nothing recorded by the runner that lost its lease
    assert not (out / "model.txt").exists()

    # The thief never renews: the runner watches it for the expiry, takes over, and finishes.
    stdout, stderr = runner.communicate(timeout=60)
    assert runner.returncode == 0, stdout + stderr
    assert "lost its lease" in stdout
    assert json.loads((out / ".marinbuild" / "status").read_text())["status"] == "SUCCESS"
    assert (out / "model.txt").read_text() == "trained\n"


PARTIAL = '''
import os
from marinbuild import step

SEEN = {seen!r}

step("resume", cmd=(
    "if [ -e {{output}}/checkpoint ]; then echo kept >> " + SEEN + "; else echo empty >> " + SEEN + "; fi; "
    "touch {{output}}/checkpoint; test -e {{output}}/done || {{{{ touch {{output}}/done; exit 3; }}}}"
))
'''


def test_partial_output_is_kept_unless_fresh_output_is_asked(project: Path) -> None:
    seen = project.parent / "seen.log"
    write_marinfile(project, PARTIAL.format(seen=str(seen)))
    assert marinbuild("run", "-q", cwd=project).returncode == 1  # leaves a checkpoint and fails
    assert marinbuild("run", "-q", cwd=project).returncode == 0  # resumes from it
    assert seen.read_text().split() == ["empty", "kept"]
    out = next((project / "marinbuild-out").glob("resume-*"))
    (out / ".marinbuild" / "status").unlink()
    (out / "done").unlink()
    result = marinbuild("run", "-q", "--fresh-output", cwd=project)
    assert result.returncode == 1, result.stdout + result.stderr
    assert seen.read_text().split() == ["empty", "kept", "empty"]


def test_clearing_an_output_keeps_the_holders_lease(tmp_path: Path) -> None:
    out = tmp_path / "step-0123456789abcdef"
    (out / ".marinbuild").mkdir(parents=True)
    (out / "logs").mkdir()
    for name in ("ckpt", "logs/step.log", ".marinbuild/status", ".marinbuild/info.json", ".marinbuild/lease",
                 ".marinbuild/lease.lock"):
        (out / name).write_text("x")
    clear_output(Storage.for_prefix(str(tmp_path)), str(out))
    assert sorted(os.listdir(out)) == [".marinbuild"]
    assert sorted(os.listdir(out / ".marinbuild")) == ["lease", "lease.lock"]


def test_lease_flags_are_validated(project: Path) -> None:
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='true')\n")
    result = marinbuild("run", "--lease-heartbeat", "5", "--lease-expiry", "6", cwd=project)
    assert result.returncode == 2
    assert "at least twice the heartbeat" in result.stderr
