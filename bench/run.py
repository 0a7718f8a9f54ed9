"""Time marinbuild, Snakemake and GNU make side by side on equivalent generated workflows."""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.metadata
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

from bench.generate import SHAPES, TOOLS, generate

REPO = Path(__file__).resolve().parent.parent
DEFAULT_VENV = REPO / "bench" / ".venv-snakemake"
DEFAULT_MARINBUILD_VENV = REPO / "bench" / ".venv-marinbuild"
DEFAULT_DOC = REPO / "docs" / "benchmarks.md"
RESULTS_DIR = REPO / "bench" / "results"
PHASES = ("dry-run", "no-op", "execute")
PHASE_TITLES = {
    "dry-run": "Dry run, nothing built (`marinbuild plan` / `snakemake -n` / `make -n`)",
    "no-op": "No-op, everything already built (`marinbuild run` / `snakemake` / `make`)",
    "execute": "Execute all N trivial steps with 2 parallel jobs",
}
DEFAULT_SIZES = (1_000, 10_000, 100_000)
JOBS = 2


@dataclass
class Record:
    """One measurement: a tool running one phase of one workflow."""

    tool: str
    shape: str
    n: int
    phase: str
    status: str  # ok | timeout | failed | skipped
    seconds: float | None = None
    max_rss_kb: int | None = None
    rc: int | None = None
    note: str = ""

    def key(self) -> tuple[str, str, int, str]:
        return (self.tool, self.shape, self.n, self.phase)


@dataclass
class Outcome:
    """What one child process did: exit code, wall time, peak RSS, tail of its log."""

    rc: int | None
    seconds: float
    max_rss_kb: int | None
    timed_out: bool
    log_tail: str


def gnu_time() -> str | None:
    """Path of GNU time (Debian package `time`), which reports a child's peak RSS."""
    path = shutil.which("time") or "/usr/bin/time"
    return path if os.access(path, os.X_OK) else None


def measure(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float) -> Outcome:
    """Run cmd once under GNU time, in its own session so a timeout kills the whole tree.

    Peak memory comes from GNU time's %M: the wait4 ru_maxrss of its child, which Linux
    reports as the largest peak among that child and the descendants it reaped. Asking
    wait4 here instead would be wrong: a child's ru_maxrss starts from the high-water
    mark of the process it was forked from, i.e. this Python runner, and
    RUSAGE_CHILDREN keeps the maximum over every earlier measurement.
    """
    timer = gnu_time()
    with tempfile.TemporaryDirectory() as tmp:
        log_path, rss_path = Path(tmp) / "log", Path(tmp) / "rss"
        wrapped = [timer, "-f", "%M", "-o", str(rss_path), *cmd] if timer else cmd
        timed_out = False
        with log_path.open("wb") as log:
            start = time.perf_counter()
            proc = subprocess.Popen(
                wrapped,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            seconds = time.perf_counter() - start
        tail = log_path.read_bytes()[-4000:].decode(errors="replace")
        rss = rss_path.read_text().split() if rss_path.exists() else []
    max_rss = int(rss[-1]) if rss and rss[-1].isdigit() else None
    return Outcome(proc.returncode, seconds, max_rss, timed_out, tail)


REPEAT_UNDER = 15.0
"""A dry run or no-op faster than this (seconds) is measured REPEATS times, median kept."""
REPEATS = 5


def done_repeating(out: Outcome, runs: list[Outcome], phase: str) -> bool:
    """Whether a phase has been measured enough: failed, slow, executed, or REPEATS times."""
    failed = out.rc != 0 or out.timed_out
    return failed or phase == "execute" or out.seconds >= REPEAT_UNDER or len(runs) == REPEATS


def summarize(runs: list[Outcome]) -> Outcome:
    """The median run (a failed last run is the outcome), with the peak memory of all."""
    last = runs[-1]
    if last.rc != 0 or last.timed_out:
        return last
    middle = sorted(runs, key=lambda o: o.seconds)[len(runs) // 2]
    peak = max((o.max_rss_kb for o in runs if o.max_rss_kb is not None), default=None)
    return Outcome(middle.rc, middle.seconds, peak, False, middle.log_tail)


def measure_repeated(cmd: list[str], cwd: Path, env: dict[str, str], phase: str, opts: argparse.Namespace) -> Outcome:
    """Measure once; repeat a quick read-only phase and keep the median run.

    Shared 2-core machines drift by tens of percent between one second and the next; a
    single sub-second sample decided ratios by luck. Execution is measured once: it writes
    the outputs, and a repeat would be a no-op.
    """
    runs: list[Outcome] = []
    while True:
        os.sync()  # no writeback of an earlier measurement's files during this one
        runs.append(measure(cmd, cwd, env, opts.timeout))
        if done_repeating(runs[-1], runs, phase):
            return summarize(runs)


def failure_reason(out: Outcome) -> str:
    """Short cell text for a failed run, naming well-known Python failures."""
    for known in ("RecursionError", "MemoryError"):
        if known in out.log_tail:
            return known
    if out.rc in (-signal.SIGSEGV, 128 + signal.SIGSEGV):
        return "crashed (SIGSEGV)"  # GNU time reports a signal death as 128 + signal
    return f"failed (rc {out.rc})"


def count_outputs(out_dir: Path) -> int:
    """Number of out.txt files under out_dir, whatever the per-tool directory naming."""
    return sum(1 for _ in out_dir.rglob("out.txt")) if out_dir.exists() else 0


def tool_commands(
    tool: str, snakemake: Path, prefix: Path, snakemake_args: list[str], marinbuild: list[str] | None = None
) -> dict[str, list[str]]:
    """The command each phase runs for a tool, from inside its workflow directory.

    ``marinbuild`` is how marinbuild is started (default: this interpreter with ``-m``).
    """
    if tool == "marinbuild":
        base = marinbuild or [sys.executable, "-m", "marinbuild"]
        common = ["-f", "Marinfile.py", "--prefix", str(prefix)]
        run = [*base, "run", *common, "-j", str(JOBS), "-q"]
        return {"dry-run": [*base, "plan", *common], "execute": run, "no-op": run}
    if tool == "snakemake":
        run = [
            str(snakemake),
            "-s",
            "Snakefile",
            f"-c{JOBS}",
            "--quiet",
            *snakemake_args,
        ]
        return {"dry-run": [*run, "-n"], "execute": run, "no-op": run}
    run = ["make", "-s", f"-j{JOBS}"]
    return {"dry-run": ["make", "-n"], "execute": run, "no-op": run}


def compile_checkout() -> None:
    """Byte-compile this checkout's marinbuild, as ``pip install`` does for Snakemake.

    marinbuild runs from the checkout; where PYTHONDONTWRITEBYTECODE is set (as in the
    containers measured here) nothing else would write its bytecode, and every command
    would compile the modules again: 40 ms or more of each dry run.
    """
    import compileall

    if not compileall.compile_dir(str(REPO / "marinbuild"), quiet=1):
        raise SystemExit("could not byte-compile marinbuild/")


def tool_env(tool: str, from_checkout: bool = True) -> dict[str, str]:
    """Environment for a tool; marinbuild run from the checkout must import from it."""
    env = dict(os.environ)
    if tool == "marinbuild" and from_checkout:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def ensure_marinbuild(venv: Path) -> list[str]:
    """Install this checkout into its own virtual environment; return the command to start it.

    Snakemake is measured as its users get it (a venv with pip's byte-compiled files, no
    other packages' start-up hooks), so marinbuild is too: ``pip install .`` of the
    working tree, reinstalled on every run so the numbers are the checkout's.
    """
    pip = venv / "bin" / "pip"
    if not pip.exists():
        print(f"creating {venv} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(pip), "install", "-q", str(REPO)], check=True)
    subprocess.run([str(pip), "install", "-q", "--no-deps", "--force-reinstall", str(REPO)], check=True)
    return [str(venv / "bin" / "marinbuild")]


def to_record(tool: str, shape: str, n: int, phase: str, out: Outcome, timeout: float) -> Record:
    """Turn a raw outcome into a table record."""
    rec = Record(tool, shape, n, phase, "ok", round(out.seconds, 3), out.max_rss_kb, out.rc)
    if out.timed_out:
        rec.status, rec.note = "timeout", f"killed after {timeout:.0f} s"
    elif out.rc != 0:
        rec.status, rec.note = (
            "failed",
            failure_reason(out) + ": " + out.log_tail[-600:],
        )
    return rec


def cell_dir(workdir: Path, shape: str, n: int) -> Path:
    """Where the workflows of one shape and size live, one folder per tool."""
    return workdir / f"{shape}-{n}"


@dataclass
class Workflow:
    """One tool's generated workflow for one shape and size, and how to run it."""

    tool: str
    wf_dir: Path
    out_dir: Path
    cmds: dict[str, list[str]]
    env: dict[str, str]


def prepare(tool: str, shape: str, n: int, workdir: Path, opts: argparse.Namespace) -> Workflow:
    """Generate one tool's workflow in a fresh folder."""
    wf_dir = cell_dir(workdir, shape, n) / tool
    shutil.rmtree(wf_dir, ignore_errors=True)
    generate(tool, shape, n, wf_dir)
    out_dir = wf_dir / "out"
    cmds = tool_commands(tool, opts.snakemake_bin, out_dir, opts.snakemake_args.split(), opts.marinbuild_cmd)
    return Workflow(tool, wf_dir, out_dir, cmds, tool_env(tool, opts.marinbuild_cmd is None))


def dry_runs_in_turns(workflows: list[Workflow], opts: argparse.Namespace) -> dict[str, Outcome]:
    """Every tool's dry run, repeated in turns (A, B, C, A, B, C, ...).

    Repeating one tool's runs back to back let a slow minute of the machine land on one
    tool only; in turns, drift reaches every tool's median alike.
    """
    runs: dict[str, list[Outcome]] = {w.tool: [] for w in workflows}
    waiting = list(workflows)
    while waiting:
        for w in list(waiting):
            os.sync()
            runs[w.tool].append(measure(w.cmds["dry-run"], w.wf_dir, w.env, opts.timeout))
            if done_repeating(runs[w.tool][-1], runs[w.tool], "dry-run"):
                waiting.remove(w)
    return {tool: summarize(outcomes) for tool, outcomes in runs.items()}


def bench_one(w: Workflow, shape: str, n: int, dry_run: Outcome, opts: argparse.Namespace) -> list[Record]:
    """Record one tool's dry run, then measure its execution and no-op."""
    phases = ["dry-run"]
    if not opts.skip_exec and n <= opts.exec_max:
        phases += ["execute", "no-op"]
    records: list[Record] = []
    for phase in phases:
        if records and records[-1].status != "ok":
            records.append(Record(w.tool, shape, n, phase, "skipped", note="previous phase failed"))
            continue
        out = dry_run if phase == "dry-run" else measure_repeated(w.cmds[phase], w.wf_dir, w.env, phase, opts)
        rec = to_record(w.tool, shape, n, phase, out, opts.timeout)
        if phase == "dry-run" and rec.status == "ok" and count_outputs(w.out_dir):
            rec.status, rec.note = "failed", "dry run wrote outputs"
        if phase == "execute":
            check_outputs(rec, count_outputs(w.out_dir))
        records.append(rec)
        log_progress(rec)
    # Outputs stay until the whole matrix is done (see run_matrix).
    return records


def check_outputs(rec: Record, made: int) -> None:
    """Fail an execution that did not make every output; say how far a timeout got."""
    if rec.status == "timeout":
        rec.note += f"; {made:,} of {rec.n:,} done"
    elif rec.status == "ok" and made != rec.n:
        rec.status, rec.note = "failed", f"produced {made} of {rec.n} outputs"


def log_progress(rec: Record) -> None:
    """One line per measurement on stderr, so long runs can be followed."""
    print(
        f"{rec.shape:>8} n={rec.n:<7} {rec.tool:<10} {rec.phase:<7} {cell(rec)}",
        file=sys.stderr,
        flush=True,
    )


def ensure_snakemake(venv: Path, spec: str) -> Path:
    """Return the snakemake executable in venv, creating the venv from PyPI when missing."""
    exe = venv / "bin" / "snakemake"
    if not exe.exists():
        print(f"installing {spec} into {venv} ...", file=sys.stderr, flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", spec], check=True)
    return exe


def first_line(cmd: list[str], env: dict[str, str] | None = None) -> str:
    """First output line of a version command, or 'unavailable'."""
    try:
        res = subprocess.run(
            cmd,
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=REPO,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unavailable"
    lines = (res.stdout or res.stderr).strip().splitlines()
    return lines[0].strip() if res.returncode == 0 and lines else "unavailable"


def marinbuild_version(command: list[str] | None) -> str:
    """marinbuild's own version line plus the commit of this checkout, when known."""
    base = command or [sys.executable, "-m", "marinbuild"]
    ver = first_line([*base, "--version"], tool_env("marinbuild", command is None))
    if ver == "unavailable":
        try:
            ver = "marinbuild " + importlib.metadata.version("marinbuild")
        except importlib.metadata.PackageNotFoundError:
            ver = "marinbuild (version unknown)"
    commit = first_line(["git", "rev-parse", "--short", "HEAD"])
    return ver if commit == "unavailable" else f"{ver}, commit {commit}"


def tool_versions(tools: Iterable[str], snakemake: Path, extra: str, marinbuild: list[str] | None) -> dict[str, str]:
    """Version string of every tool measured."""
    versions: dict[str, str] = {}
    for tool in tools:
        if tool == "make":
            versions[tool] = first_line(["make", "--version"])
        elif tool == "snakemake":
            versions[tool] = "snakemake " + first_line([str(snakemake), "--version"])
            if extra:
                versions[tool] += f" with `{extra}`"
        else:
            versions[tool] = marinbuild_version(marinbuild)
            if marinbuild is not None:
                versions[tool] += ", installed in its own venv"
    return versions


def read_key(path: str, key: str) -> str:
    """Value of the first `key: value` or `key=value` line of a system file."""
    try:
        for line in Path(path).read_text().splitlines():
            name, sep, value = line.replace("=", ":", 1).partition(":")
            if sep and name.strip() == key:
                return value.strip().strip('"')
    except OSError:
        pass
    return "unknown"


def machine_info() -> dict[str, str]:
    """Describe the host so that numbers from different machines are never mixed silently."""
    mem_kb = read_key("/proc/meminfo", "MemTotal").split()[0]
    mem = f"{int(mem_kb) / 2**20:.1f} GiB" if mem_kb.isdigit() else "unknown"
    return {
        "cpu": read_key("/proc/cpuinfo", "model name"),
        "cores": str(len(os.sched_getaffinity(0))),
        "memory": mem,
        "os": f"{read_key('/etc/os-release', 'PRETTY_NAME')}, Linux {platform.release()}",
        "python": platform.python_version(),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def cell(rec: Record | None) -> str:
    """Table cell: seconds and peak memory, or why there is no number."""
    if rec is None:
        return "—"
    if rec.status == "ok":
        if rec.max_rss_kb is None:
            return f"{rec.seconds:.2f} s"
        return f"{rec.seconds:.2f} s · {rec.max_rss_kb / 1024:.0f} MB"
    if rec.status == "failed":
        if rec.rc in (-signal.SIGSEGV, 128 + signal.SIGSEGV):
            return "crashed (SIGSEGV)"
        return rec.note.split(":", 1)[0]
    if rec.status == "timeout":
        return f"timeout ({rec.note.removeprefix('killed after ')})"
    return rec.status


def ratio(num: Record | None, den: Record | None) -> str:
    """num/den of two successful timings, else a dash."""
    if num is None or den is None or num.status != "ok" or den.status != "ok" or not den.seconds:
        return "—"
    return f"{num.seconds / den.seconds:.1f}x"


def sort_key(shape: str, n: int) -> tuple[int, int]:
    return (SHAPES.index(shape) if shape in SHAPES else len(SHAPES), n)


def ratio_pairs(tools: list[str]) -> list[tuple[str, str]]:
    """Ratio columns that both tools measured; snakemake/make stands in without marinbuild."""
    wanted = [("snakemake", "marinbuild"), ("marinbuild", "make")]
    if "marinbuild" not in tools:
        wanted = [("snakemake", "make")]
    return [(a, b) for a, b in wanted if a in tools and b in tools]


def render_tables(records: list[Record]) -> str:
    """Markdown tables, one per phase: a row per (shape, N), a column per tool, and ratios."""
    by_key = {r.key(): r for r in records}
    tools = [t for t in TOOLS if any(r.tool == t for r in records)]
    parts: list[str] = []
    for phase in PHASES:
        rows = sorted(
            {(r.shape, r.n) for r in records if r.phase == phase},
            key=lambda k: sort_key(*k),
        )
        if not rows:
            continue
        pairs = ratio_pairs(tools)
        head = ["shape", "N", *tools, *(f"{a}/{b}" for a, b in pairs)]
        lines = [
            f"### {PHASE_TITLES[phase]}",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
        ]
        for shape, n in rows:
            got = {t: by_key.get((t, shape, n, phase)) for t in TOOLS}
            cells = [
                shape,
                f"{n:,}",
                *(cell(got[t]) for t in tools),
                *(ratio(got[a], got[b]) for a, b in pairs),
            ]
            lines.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


def failure_detail(rec: Record) -> str:
    """The telling part of a failure note: the log line naming the error, else its end."""
    label = cell(rec)
    _, _, log = rec.note.partition(": ")
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    named = [line for line in lines if label in line]
    tail = (named or lines)[-1:] if rec.status == "failed" else []
    if rec.status == "timeout":
        return rec.note
    return f"{label} (rc {rec.rc})" + "".join(f": {line[:240]}" for line in tail)


def render_failures(records: list[Record]) -> str:
    """Details for every cell that holds no number, so a failure is never just a word."""
    bad = [r for r in records if r.status in ("failed", "timeout")]
    if not bad:
        return ""
    lines = ["### Failures and timeouts", ""]
    for r in sorted(bad, key=lambda r: (r.tool, *sort_key(r.shape, r.n), r.phase)):
        lines.append(f"- {r.tool}, {r.shape}, N={r.n:,}, {r.phase}: {failure_detail(r)}")
    return "\n".join(lines) + "\n"


def machine_lines(machines: list[dict[str, str]]) -> list[str]:
    """One line per distinct machine, listing every date it was measured on."""
    dates: dict[str, list[str]] = {}
    for m in machines:
        desc = f"{m['cpu']}, {m['cores']} cores, {m['memory']} RAM; {m['os']}; Python {m['python']}"
        dates.setdefault(desc, []).append(m["date"])
    return [f"- {desc}; measured {', '.join(when)}" for desc, when in dates.items()]


def render_doc(results: dict) -> str:
    """The whole docs/benchmarks.md page."""
    machines = results["machines"]
    versions = results["versions"]
    lines = [
        "# Benchmarks: marinbuild vs Snakemake vs GNU make",
        "",
        "Written by `python -m bench.run`; see `bench/README.md` for the method.",
        "",
        "## Machine",
        "",
    ]
    lines += machine_lines(machines)
    lines += ["", "## Tools", ""]
    lines += [f"- {tool}: {versions[tool]}" for tool in TOOLS if tool in versions]
    legend = (
        "Cells: wall-clock seconds · peak RSS of the largest process. Ratios compare "
        f"seconds. Dry runs and no-ops under {REPEAT_UNDER:g} s: median of {REPEATS} runs; "
        f"the rest: one run. Execution uses {JOBS} parallel jobs. `—`: not measured."
    )
    lines += ["", "## Results", "", legend, ""]
    return "\n".join(lines) + "\n" + render_tables(results["records"]) + "\n" + render_failures(results["records"])


def load_results(paths: Iterable[str]) -> dict:
    """Merge result files: later files win for the same (tool, shape, N, phase)."""
    merged: dict = {"machines": [], "versions": {}, "records": {}}
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data["machine"] not in merged["machines"]:
            merged["machines"].append(data["machine"])
        merged["versions"].update(data["versions"])
        for raw in data["records"]:
            rec = Record(**raw)
            merged["records"][rec.key()] = rec
    merged["records"] = list(merged["records"].values())
    return merged


def save_json(path: Path, machine: dict, versions: dict, records: list[Record]) -> None:
    """Write raw results so tables can be regenerated and merged without re-running."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": machine,
        "versions": versions,
        "records": [asdict(r) for r in records],
    }
    path.write_text(json.dumps(payload, indent=1) + "\n")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Command-line options; the default is the full matrix."""
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of %(default)s")
    p.add_argument(
        "--shapes",
        default=",".join(SHAPES),
        help="comma-separated subset of %(default)s",
    )
    p.add_argument(
        "--sizes",
        default=",".join(map(str, DEFAULT_SIZES)),
        help="comma-separated step counts",
    )
    p.add_argument(
        "--exec-max",
        type=int,
        default=10_000,
        help="largest N that is executed (default %(default)s)",
    )
    p.add_argument("--skip-exec", action="store_true", help="dry runs only")
    p.add_argument(
        "--timeout",
        type=float,
        default=1800,
        help="seconds per command (default %(default)s)",
    )
    p.add_argument(
        "--workdir",
        type=Path,
        help="where workflows run (default: a temporary directory)",
    )
    p.add_argument("--keep", action="store_true", help="keep generated workflows and outputs")
    p.add_argument("--json", type=Path, help="raw results file (default bench/results/<date>.json)")
    p.add_argument(
        "--merge",
        nargs="+",
        default=[],
        help="result files to merge under the new results",
    )
    p.add_argument("--from-json", nargs="+", help="render from result files only; run nothing")
    p.add_argument(
        "--doc",
        type=Path,
        default=DEFAULT_DOC,
        help="markdown page to write (default %(default)s)",
    )
    p.add_argument("--no-doc", action="store_true", help="only print the table")
    p.add_argument("--venv", type=Path, default=DEFAULT_VENV, help="Snakemake virtual environment")
    p.add_argument(
        "--marinbuild-venv",
        type=Path,
        default=DEFAULT_MARINBUILD_VENV,
        help="virtual environment this checkout is installed into (default %(default)s)",
    )
    p.add_argument(
        "--from-checkout",
        action="store_true",
        help="run marinbuild from this checkout with the current interpreter instead (no install)",
    )
    p.add_argument(
        "--snakemake-args",
        default="",
        help="extra Snakemake options, e.g. '--scheduler greedy'",
    )
    p.add_argument("--snakemake-spec", default="snakemake", help="pip requirement for Snakemake")
    return p.parse_args(argv)


def run_matrix(opts: argparse.Namespace, tools: list[str], workdir: Path) -> None:
    """Measure every (shape, N, tool), saving raw results after each one.

    Nothing is deleted until every measurement is done. On ext4 without a journal (the
    disk of the machines measured here) the inode allocator skips, one by one, every
    inode freed in the last 60 s (360 s while its table block is dirty), so a tool
    measured right after `rm -rf` of a 10,000-step output tree creates each of its files
    several times slower: deleting between measurements made GNU make's 10,000-step
    execution take 29 s instead of 10.5 s, and slowed whichever tool came next.
    """
    machine = machine_info()
    versions = tool_versions(tools, opts.snakemake_bin, opts.snakemake_args, opts.marinbuild_cmd)
    records: list[Record] = []
    for shape in opts.shapes.split(","):
        for n in (int(s) for s in opts.sizes.split(",")):
            workflows = [prepare(tool, shape, n, workdir, opts) for tool in tools]
            dry_runs = dry_runs_in_turns(workflows, opts)
            for w in workflows:
                records += bench_one(w, shape, n, dry_runs[w.tool], opts)
                save_json(opts.json, machine, versions, records)


def remove_workflows(opts: argparse.Namespace, workdir: Path) -> None:
    """Delete what the matrix wrote: the whole workdir unless the user named it."""
    if not opts.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
        return
    for shape in opts.shapes.split(","):
        for n in opts.sizes.split(","):
            shutil.rmtree(cell_dir(workdir, shape, int(n)), ignore_errors=True)


def main(argv: list[str] | None = None) -> str:
    """Run (or re-render) the benchmark; print the tables and return the page text."""
    opts = parse_args(argv)
    if opts.from_json:
        results = load_results(opts.from_json)
    else:
        tools = [t for t in TOOLS if t in opts.tools.split(",")]
        unknown = set(opts.tools.split(",")) - set(TOOLS)
        if unknown:
            raise SystemExit(f"unknown tools: {sorted(unknown)}")
        opts.snakemake_bin = ensure_snakemake(opts.venv, opts.snakemake_spec) if "snakemake" in tools else None
        opts.marinbuild_cmd = None
        if "marinbuild" in tools and opts.from_checkout:
            compile_checkout()
        elif "marinbuild" in tools:
            opts.marinbuild_cmd = ensure_marinbuild(opts.marinbuild_venv)
        stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        opts.json = opts.json or RESULTS_DIR / f"{stamp}.json"
        workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="marinbuild-bench-"))
        try:
            run_matrix(opts, tools, workdir)
        finally:
            if not opts.keep:
                remove_workflows(opts, workdir)
        results = load_results([*opts.merge, str(opts.json)])
        print(f"raw results: {opts.json}", file=sys.stderr)
    page = render_doc(results)
    print(render_tables(results["records"]))
    if not opts.no_doc:
        opts.doc.parent.mkdir(parents=True, exist_ok=True)
        opts.doc.write_text(page + kept_sections(opts.doc))
    return page


KEPT = "<!-- Sections below are written by other benchmarks and kept when this page is rewritten. -->"


def kept_sections(doc: Path) -> str:
    """The part of the page after :data:`KEPT` (Ray, GCS, TPU figures), to carry over."""
    if not doc.exists():
        return ""
    text = doc.read_text()
    return "\n" + text[text.index(KEPT):] if KEPT in text else ""


if __name__ == "__main__":
    main()
