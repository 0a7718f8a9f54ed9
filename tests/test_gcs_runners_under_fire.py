"""Runners on ``gs://`` under random signals: no step runs twice at once, nothing false is believed done.

Three ``marinbuild run -j 4`` processes share one Marinfile and one prefix on the GCS
emulator, behind a proxy that adds 50 ms to every request (so that the store work each
runner does on its pool of store threads, ``execution/scheduler.py``, takes a while). A
seeded random source (``MARINBUILD_UNDER_FIRE_SEED``) sends them SIGKILL, SIGTERM or SIGINT,
to the runner alone or to its process group, at random moments and at the moments a step
of theirs has just started or just ended (when its claim or its commit is on its way), and
starts each killed runner again a little later. The Marinfile (24 steps: 16 leaves, four
fan-ins of four, a chain of three, and a step after all of those) is rebuilt with a new
identity for each round.

Each execution of a step appends ``start PID TIME RUNNER`` and ``end PID TIME RUNNER`` to a
file outside the prefix and writes ``partial PID``, then ``done PID``, to its output file
(also outside the prefix). While the signals fly, the markers are read twice a second. Then
one runner finishes the round, and:

* no execution of a step began while another one of it that went on to its end was
  running (a killed execution never ends, so only that much can be told of it);
* no execution of a step began after the step's ``SUCCESS`` marker was written, no
  ``SUCCESS`` marker was written twice or while an execution of its step ran, and a step
  seen ``SUCCESS`` had its output complete at that moment;
* every step is ``SUCCESS`` (``marinbuild status --json``), its last execution ended, its
  output is that execution's, and the marker names the runner that ran it;
* once the runners have exited no process of any step is left.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from bench.latency_proxy import start_proxy
from marinbuild.project import open_project
from marinbuild.store.markers import SUCCESS, read_statuses

from .helpers import cli_env, write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

ROUNDS = 2
CHAOS_SECONDS = 10.0
"""Per round; less when the runners finish the round's work before."""
TOKEN_VAR = "MARINBUILD_UNDER_FIRE_TOKEN"

STEP_SCRIPT = r"""#!/bin/sh
# step.sh RECORDS OUTPUTS NAME SECONDS
rec="$1/$3"; out="$2/$3"; runner=${MARINBUILD_STEP_TOKEN%%.*}
echo "start $$ $(date +%s.%N) $runner" >> "$rec"
echo "partial $$" > "$out"
sleep "$4"
echo "done $$" > "$out"
echo "end $$ $(date +%s.%N) $runner" >> "$rec"
"""

MARINFILE = """
from marinbuild import output_path_of, step, versioned

SCRIPT = {script!r}
RECORDS = {records!r}
OUTPUTS = {outputs!r}
ROUND = {round}
SECONDS = {seconds!r}


def s(name, ups=()):
    return step(name, cmd=f"sh {{SCRIPT}} {{RECORDS}} {{OUTPUTS}} {{name}} {{SECONDS[name]}}",
                config={{"round": versioned(ROUND), "ups": [output_path_of(u) for u in ups]}})


A = [s(f"a{{i:02d}}") for i in range(16)]
M = [s(f"m{{i}}", A[4 * i : 4 * i + 4]) for i in range(4)]
C = [s("c0")]
for i in range(1, 3):
    C.append(s(f"c{{i}}", [C[-1]]))
F = s("f", M + [C[-1]])
"""

NAMES = [f"a{i:02d}" for i in range(16)] + [f"m{i}" for i in range(4)] + [f"c{i}" for i in range(3)] + ["f"]

# (signal, to the whole process group?) and their odds
SIGNALS = [(signal.SIGKILL, False), (signal.SIGKILL, True), (signal.SIGTERM, True), (signal.SIGINT, True),
           (signal.SIGTERM, False)]
SIGNAL_WEIGHTS = [3, 2, 2, 2, 1]


@dataclass
class Execution:
    pid: str
    start: float
    runner: str
    end: float | None = None


def executions(path: Path) -> list[Execution]:
    """The executions a record file shows, in the order they started; an end matches its pid's open start."""
    runs: list[Execution] = []
    open_by_pid: dict[str, Execution] = {}
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        parts = line.split()
        if len(parts) != 4:
            continue
        kind, pid, at, runner = parts
        if kind == "start":
            run = Execution(pid, float(at), runner)
            runs.append(run)
            open_by_pid[pid] = run
        elif kind == "end" and pid in open_by_pid:
            open_by_pid.pop(pid).end = float(at)
    return sorted(runs, key=lambda r: r.start)


def overlaps(name: str, runs: list[Execution]) -> list[str]:
    """Pairs where one execution started while another one, which ended, was running."""
    found = []
    for i, earlier in enumerate(runs):
        for later in runs[i + 1 :]:
            if earlier.end is not None and later.start < earlier.end:
                found.append(f"{name}: pid {later.pid} (runner {later.runner}) started at {later.start:.3f} while "
                             f"pid {earlier.pid} (runner {earlier.runner}) ran {earlier.start:.3f}-{earlier.end:.3f}")
    return found


def leftovers(token: str, marker: str) -> list[str]:
    """Live processes carrying the token in their environment, or the marker in their command line."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if f"{TOKEN_VAR}={token}".encode() in env or marker in cmdline:
            found.append(f"{entry}: {cmdline}")
    return found


@dataclass
class Sampler:
    """Reads the markers of one round every second while the runners work, and checks what SUCCESS means."""

    file: Path
    prefix: str
    outputs: Path
    records: Path
    first_success: dict[str, float] = field(default_factory=dict)
    seen: dict[str, set[tuple[float, str]]] = field(default_factory=dict)
    """Every distinct SUCCESS marker read, by step: its time and its writer."""
    problems: list[str] = field(default_factory=list)
    samples: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        project = open_project(str(self.file), self.prefix)
        nodes = {n.name: n for n in project.graph.nodes.values()}
        identities = {n.output_path: n.identity for n in nodes.values()}
        while not self._stop.wait(0.5):
            try:
                statuses = read_statuses(project.storage, identities, identities)
            except Exception:
                continue  # a busy emulator: the next sample
            self.samples += 1
            for name, node in nodes.items():
                record = statuses.get(node.output_path)
                if record is None or record.mismatch or record.status != SUCCESS:
                    continue
                self.first_success.setdefault(name, record.time)
                self.seen.setdefault(name, set()).add((record.time, record.owner or "?"))
                output = (self.outputs / name).read_text() if (self.outputs / name).exists() else "(none)"
                if not output.startswith("done "):
                    runs = (self.records / name).read_text() if (self.records / name).exists() else ""
                    self.problems.append(f"{name}: SUCCESS (by {record.owner} at {record.time:.3f}) while its output "
                                         f"reads {output.strip()!r}; executions:\n{runs}")

    def written_during(self) -> list[str]:
        """SUCCESS markers written while another execution of their step (one that went on to end) ran, or twice."""
        found = []
        for name, markers in self.seen.items():
            runs = executions(self.records / name)
            for at, owner in sorted(markers):
                for run in runs:
                    if run.end is not None and run.start < at < run.end:
                        found.append(f"{name}: SUCCESS by {owner} written at {at:.3f} while pid {run.pid} "
                                     f"(runner {run.runner}) ran {run.start:.3f}-{run.end:.3f}")
            if len(markers) > 1:
                found.append(f"{name}: SUCCESS written more than once: {sorted(markers)}")
        return found

    def late_starts(self) -> list[str]:
        """Executions that began after their step's SUCCESS marker was written."""
        found = []
        for name, at in self.first_success.items():
            for run in executions(self.records / name):
                if run.start > at:
                    found.append(f"{name}: pid {run.pid} (runner {run.runner}) started at {run.start:.3f}, "
                                 f"after SUCCESS was written at {at:.3f}")
        return found


class Fire:
    """Keeps three runners going and shoots at them."""

    def __init__(self, rng: random.Random, command: list[str], cwd: Path, env: dict[str, str], logs: Path,
                 records: Path) -> None:
        self.rng = rng
        self.command = command
        self.cwd = cwd
        self.env = env
        self.logs = logs
        self.records = records
        self.runners: list[subprocess.Popen[bytes] | None] = [None, None, None]
        self.restart_at = [0.0, 0.0, 0.0]
        self.started = 0
        self.sent: dict[str, int] = {}
        self._files: list[IO[bytes]] = []
        self._sizes: dict[str, int] = {}

    def _start(self, i: int) -> None:
        self.started += 1
        out = open(self.logs / f"runner-{self.started:03d}.log", "wb")  # noqa: SIM115 - closed in close()
        self._files.append(out)
        self.runners[i] = subprocess.Popen(self.command, cwd=self.cwd, env=self.env, stdout=out, stderr=out,
                                           start_new_session=True)

    def tend(self) -> bool:
        """Start the runners due; True while some runner is alive or about to start."""
        now = time.monotonic()
        busy = False
        for i, r in enumerate(self.runners):
            if r is None:
                if now >= self.restart_at[i]:
                    self._start(i)
                busy = True
            elif r.poll() is not None:
                if r.returncode != 0:  # killed: back a little later
                    self.runners[i] = None
                    self.restart_at[i] = now + self.rng.uniform(0.0, 0.5)
                    busy = True
            else:
                busy = True
        return busy

    def new_lines(self, kind: str) -> list[str]:
        """Record lines of ``kind`` written since the last look."""
        found: list[str] = []
        if not self.records.exists():
            return found
        for path in self.records.iterdir():
            size = path.stat().st_size
            seen = self._sizes.get(path.name, 0)
            if size > seen:
                with open(path, "rb") as f:
                    f.seek(seen)
                    chunk = f.read(size - seen)
                if not chunk.endswith(b"\n"):
                    chunk = chunk[: chunk.rfind(b"\n") + 1]
                self._sizes[path.name] = seen + len(chunk)
                found += [line for line in chunk.decode().splitlines() if line.startswith(kind + " ")]
        return found

    def shoot(self, runner_pid: int | None = None) -> None:
        alive = [r for r in self.runners if r is not None and r.poll() is None]
        victims = [r for r in alive if r.pid == runner_pid] or alive
        if not victims:
            return
        victim = self.rng.choice(victims)
        sig, group = self.rng.choices(SIGNALS, weights=SIGNAL_WEIGHTS)[0]
        try:
            (os.killpg if group else os.kill)(victim.pid, sig)
        except ProcessLookupError:
            return
        key = f"{sig.name}{' (group)' if group else ''}{' at a step' if runner_pid else ''}"
        self.sent[key] = self.sent.get(key, 0) + 1

    def chaos(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        next_shot = time.monotonic() + self.rng.uniform(0.4, 1.5)
        aim: str | None = None  # "start" or "end": shoot the runner of the next such line
        aim_until = 0.0
        while time.monotonic() < deadline and self.tend():
            time.sleep(0.02 if aim else 0.05)  # aimed: shoot within a round trip of the line
            now = time.monotonic()
            if aim is not None:
                lines = self.new_lines(aim)
                if lines:
                    self.shoot(int(self.rng.choice(lines).split()[3]))
                    aim = None
                    next_shot = now + self.rng.uniform(0.4, 1.5)
                elif now >= aim_until:
                    self.shoot()
                    aim = None
                    next_shot = now + self.rng.uniform(0.4, 1.5)
                continue
            if now >= next_shot:
                how = self.rng.choice(["now", "start", "end", "end"])
                if how == "now":
                    self.shoot()
                    next_shot = now + self.rng.uniform(0.4, 1.5)
                else:
                    self.new_lines(how)  # only lines written from now on count
                    aim, aim_until = how, now + 2.0

    def cease(self) -> None:
        """SIGTERM to every runner still alive, SIGKILL to any that does not exit in 20 s."""
        for r in self.runners:
            if r is not None and r.poll() is None:
                os.killpg(r.pid, signal.SIGTERM)
        for r in self.runners:
            if r is not None:
                try:
                    r.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    os.killpg(r.pid, signal.SIGKILL)
                    r.wait()
        self.runners = [None, None, None]

    def close(self) -> None:
        for f in self._files:
            f.close()


def test_runners_on_gs_under_random_signals_never_overlap_a_step_nor_believe_one_done(
    gcs_emulator: Emulator, project: Path, tmp_path: Path
) -> None:
    seed = int(os.environ.get("MARINBUILD_UNDER_FIRE_SEED", "7"))
    rng = random.Random(seed)
    token = uuid.uuid4().hex
    script = tmp_path / f"step-{token[:12]}.sh"
    script.write_text(STEP_SCRIPT)
    logs = tmp_path / "runner-logs"
    logs.mkdir()
    prefix = gcs_emulator.prefix()
    proxy = start_proxy(gcs_emulator.endpoint, 0.05)
    # The emulator does not enforce generation preconditions, so each lease write is read back
    # after a pause (``store/conditional.py``), about 0.4 s here, and one heartbeat renews a
    # runner's leases one after another: an expiry of 4 s keeps a runner holding several
    # leases from fencing itself while nobody shoots at it.
    env = cli_env({**gcs_emulator.env, "STORAGE_EMULATOR_HOST": proxy.endpoint, TOKEN_VAR: token,
                   "MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "4"})
    command = [sys.executable, "-m", "marinbuild", "run", "-q", "-j", "4", "--prefix", prefix]
    problems: list[str] = []
    sent: dict[str, int] = {}
    starts = 0
    try:
        for round_ in range(ROUNDS):
            records = tmp_path / f"records-{round_}"
            outputs = tmp_path / f"outputs-{round_}"
            records.mkdir()
            outputs.mkdir()
            seconds = {name: round(rng.uniform(0.2, 1.0), 2) for name in NAMES}
            marinfile = write_marinfile(project, MARINFILE.format(
                script=str(script), records=str(records), outputs=str(outputs), round=round_, seconds=seconds))
            sampler = Sampler(marinfile, prefix, outputs, records)
            sampler.start()
            fire = Fire(rng, command, project, env, logs, records)
            try:
                fire.chaos(CHAOS_SECONDS)
            finally:
                fire.cease()
                fire.close()
            for key, n in fire.sent.items():
                sent[key] = sent.get(key, 0) + n
            final = subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120)
            sampler.stop()
            assert final.returncode == 0, final.stdout + final.stderr

            status = subprocess.run(
                [sys.executable, "-m", "marinbuild", "status", "--json", "--prefix", prefix],
                cwd=project, env=cli_env(gcs_emulator.env), capture_output=True, text=True, timeout=120,
            )
            assert status.returncode == 0, status.stdout + status.stderr
            rows = json.loads(status.stdout)
            assert sorted(r["name"] for r in rows) == sorted(NAMES), status.stdout
            assert {r["status"] for r in rows} == {SUCCESS}, status.stdout

            project_now = open_project(str(marinfile), prefix)
            identities = {n.output_path: n.identity for n in project_now.graph.nodes.values()}
            markers = read_statuses(project_now.storage, identities, identities)
            for node in project_now.graph.nodes.values():
                name = node.name
                runs = executions(records / name)
                starts += len(runs)
                problems += overlaps(name, runs)
                last = runs[-1] if runs else None
                if last is None or last.end is None:
                    problems.append(f"{name}: its last execution never ended: {runs}")
                    continue
                output = (outputs / name).read_text().strip()
                if output != f"done {last.pid}":
                    problems.append(f"{name}: SUCCESS but its output reads {output!r}, not its last execution's "
                                    f"(pid {last.pid}); executions: {runs}")
                marker = markers.get(node.output_path)
                owner = marker.owner if marker is not None else None
                if owner is None or owner.rsplit(":", 1)[1] != last.runner:
                    problems.append(f"{name}: SUCCESS written by {owner}, but its last execution ran under "
                                    f"runner {last.runner}; executions: {runs}")
            problems += sampler.problems + sampler.late_starts() + sampler.written_during()
            assert sampler.samples > 0
            assert not problems, f"seed {seed}, round {round_} (runner logs in {logs}):\n" + "\n".join(problems)
    finally:
        proxy.stop()

    # Every runner has exited: whatever a step started must be gone by now, or very soon
    # (a guardian kills what its runner left, and exits).
    deadline = time.monotonic() + 15
    left = leftovers(token, script.name)
    while left and time.monotonic() < deadline:
        time.sleep(0.25)
        left = leftovers(token, script.name)
    assert left == [], left
    assert sum(sent.values()) >= 8, sent
    print(f"seed {seed}: {sum(sent.values())} signals {sent}, {starts} executions")
