"""What every step's own sentinel costs, measured with GNU make carrying the same sentinel.

A local step of marinbuild starts its sentinel (``marinbuild/backends/local/fence.py``)
before its command: the step's shell reads its gate line and forks the sentinel, which
then holds the step's heartbeat pipe until the step ends. Where bash 4 is on ``PATH`` the
step's shell is bash and the sentinel one fork of it, timed by ``read -t``; elsewhere the
shell is ``/bin/sh``, the sentinel two forks of it, and its timer a subshell running
``sleep``. To see what that alone costs, this benchmark gives make the same work: each
recipe of a generated Makefile becomes the text marinbuild runs for a shell step
(``Shell.gated``), under the same shell, so make's children fork and execute exactly what
marinbuild's do, with no runner, lease, marker or ledger around them: a floor.

Each recipe's heartbeat pipe is a FIFO of its own, opened by the recipe's shell at both
ends: the shell writes the gate line (from the file ``gate``, so that an empty one keeps
every step at its gate), keeps the write end and hands the read end on, as the runner
does. The sentinel therefore lives as long as the step, its timer armed, and reads
end-of-file when the step's shell exits, where marinbuild's runner kills the group. Its
last ``kill -KILL 0`` (here make's own process group) kills the timer's subshell alone
(the portable sentinel's ``sleep`` runs out its second by itself); that is all that
differs. Opening the FIFO and writing the line are shell builtins, the same for both
fenced variants.

Variants, each from an empty output folder, in turns, with 2 jobs: plain make, make running
its plain recipes under bash (``--bash-alone``: what bash's start-up and forks cost without
any sentinel), make with the sentinel a run uses here, make with the portable sentinel (``--portable``, as on a
machine without bash), marinbuild itself (``--marinbuild``, installed into its own venv as
``bench.run`` does) and marinbuild from other checkouts (``--checkout DIR``, started as
``python -m marinbuild`` with the checkout on ``PYTHONPATH``, for a before and after).
Besides wall time, the CPU time of every process the command started is kept (a small
wrapper is their subreaper, so that the sentinels' and timers' time counts too): on a
shared machine it moves less with other people's load::

    python -m bench.fence_floor --shapes fanout,diamonds --sizes 10000 --rounds 3 \\
        --portable --marinbuild --workdir /dev/shm/floor --json bench/results/fence-floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.generate import generate
from bench.run import DEFAULT_MARINBUILD_VENV, count_outputs, ensure_marinbuild, machine_info, measure, tool_commands
from marinbuild.backends.local.fence import PORTABLE, Shell, find_shell

VARIANTS = ("make", "make+bash", "make+sentinel", "make+sh-sentinel", "marinbuild")
LEASE_SECONDS = "1"
"""The gate line, which arms the sentinel's timer as in a run. Short, because killing the
portable timer's subshell alone leaves its ``sleep`` behind (marinbuild's group kill takes it)."""

_TARGET = re.compile(r"^out/(s\d+)/out\.txt:", re.M)


def sentinel_recipe(shell: Shell, recipe: str) -> str:
    """One make recipe line running ``recipe`` as marinbuild runs a shell step, sentinel included."""
    marker = "\0"
    script = shell.gated(marker, cgroup="").replace("kill -KILL 0", 'kill -KILL "$t"')
    script = script.replace("</dev/null >/dev/null 2>&1 &", "</dev/null >/dev/null 2>&1 8>&- &")  # the runner's end
    pipe = "fifo/$(notdir $(@D))"
    opening = (
        f"exec 9<>{pipe} 8>{pipe} 7<{pipe} 9<&- && exec 9<&7 7<&-; "
        "if read -r g <gate; then echo \"$g\" >&8; else exec 8>&-; fi; "
    )
    line = "; ".join(script.splitlines())
    return opening.replace("$", "$$").replace("$$(notdir $$(@D))", "$(notdir $(@D))") + line.replace("$", "$$").replace(
        marker, recipe
    )


def _shell_of_make(shell: Shell) -> str:
    # bash in its POSIX mode, as marinbuild starts it (as `sh`); nothing for /bin/sh, make's own.
    return f"SHELL := {shell.path}\n.SHELLFLAGS := --posix -c\n" if shell.bash else ""


def fenced_makefile(shell: Shell, plain: str) -> str:
    """The Makefile ``plain`` with every recipe carrying the sentinel, run by ``shell``."""
    return _shell_of_make(shell) + "".join(
        f"\t{sentinel_recipe(shell, line[1:].rstrip(chr(10)))}\n" if line.startswith("\t") else line
        for line in plain.splitlines(keepends=True)
    )


def prepare(variant: str, shape: str, n: int, workdir: Path, shell: Shell) -> Path:
    """Generate one variant's workflow folder."""
    folder = workdir / f"{shape}-{n}" / variant
    shutil.rmtree(folder, ignore_errors=True)
    generate("marinbuild" if variant.startswith("marinbuild") else "make", shape, n, folder)
    if variant == "make+bash":
        makefile = folder / "Makefile"
        makefile.write_text(_shell_of_make(shell) + makefile.read_text())
    elif variant.startswith("make+"):
        makefile = folder / "Makefile"
        makefile.write_text(fenced_makefile(PORTABLE if variant == "make+sh-sentinel" else shell, makefile.read_text()))
        (folder / "gate").write_text(LEASE_SECONDS + "\n")
    return folder


def make_pipes(folder: Path) -> None:
    """One FIFO per step of a fenced Makefile (made before the clock starts)."""
    pipes = folder / "fifo"
    shutil.rmtree(pipes, ignore_errors=True)
    pipes.mkdir()
    for name in _TARGET.findall((folder / "Makefile").read_text()):
        os.mkfifo(pipes / name)


_COUNTED = """
import ctypes, os, sys
ctypes.CDLL(None).prctl(36, 1)  # PR_SET_CHILD_SUBREAPER: orphans (sentinels, timers) come here
pid = os.posix_spawnp(sys.argv[2], sys.argv[2:], os.environ)
while True:  # reaped as they end, so that no zombie holds a pid
    done, status = os.wait()
    if done == pid:
        break
usage = os.times()
with open(sys.argv[1], "w") as f:
    f.write(str(usage.children_user + usage.children_system))
sys.exit(os.waitstatus_to_exitcode(status) % 256)
"""
"""Runs a command as the subreaper of what it leaves behind, and writes the CPU seconds of the
command and of every orphan that ended before it did: the sentinels' and timers' time counts."""


def counted(command: list[str], cpu_file: Path) -> list[str]:
    """``command`` run under :data:`_COUNTED`, its CPU seconds written to ``cpu_file``."""
    return [sys.executable, "-c", _COUNTED, str(cpu_file), *command]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="fanout,diamonds")
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--portable", action="store_true", help="time make with the portable sentinel too")
    parser.add_argument("--bash-alone", action="store_true",
                        help="time make running its plain recipes under bash too (what bash costs without a sentinel)")
    parser.add_argument("--marinbuild", action="store_true", help="time marinbuild too")
    parser.add_argument("--marinbuild-venv", type=Path, default=DEFAULT_MARINBUILD_VENV)
    parser.add_argument("--checkout", type=Path, action="append", default=[],
                        help="time marinbuild from this checkout too (python -m marinbuild, PYTHONPATH=it); repeatable")
    parser.add_argument("--workdir", type=Path, help="where the workflows run (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="write the raw times here")
    opts = parser.parse_args(argv)

    shell = find_shell()
    wanted = {"make", "make+sentinel", *(["make+sh-sentinel"] if opts.portable else []),
              *(["make+bash"] if opts.bash_alone and shell.bash else []),
              *(["marinbuild"] if opts.marinbuild else [])}
    variants = [v for v in VARIANTS if v in wanted] + [f"marinbuild@{c.resolve().name}" for c in opts.checkout]
    checkouts = {f"marinbuild@{c.resolve().name}": c.resolve() for c in opts.checkout}
    base = ensure_marinbuild(opts.marinbuild_venv) if opts.marinbuild else None
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="fence-floor-"))
    results = []
    for shape in opts.shapes.split(","):
        for n in map(int, opts.sizes.split(",")):
            times: dict[str, list[float]] = {v: [] for v in variants}
            cpu: dict[str, list[float]] = {v: [] for v in variants}
            folders = {v: prepare(v, shape, n, workdir, shell) for v in variants}
            for _ in range(opts.rounds):
                for variant in variants:
                    folder = folders[variant]
                    shutil.rmtree(folder / "out", ignore_errors=True)
                    if variant in ("make+sentinel", "make+sh-sentinel"):
                        make_pipes(folder)
                    tool = "marinbuild" if variant.startswith("marinbuild") else "make"
                    env = dict(os.environ)
                    if variant in checkouts:
                        env["PYTHONPATH"] = str(checkouts[variant])
                    command = tool_commands(tool, Path("-"), folder / "out", [], base if variant == "marinbuild" else None)
                    cpu_file = folder / "cpu-seconds"
                    outcome = measure(counted(command["execute"], cpu_file), folder, env, opts.timeout)
                    made = count_outputs(folder / "out")
                    if outcome.rc != 0 or made != n:
                        sys.exit(f"{variant} {shape} {n}: rc {outcome.rc}, {made} of {n} outputs\n{outcome.log_tail}")
                    times[variant].append(round(outcome.seconds, 3))
                    cpu[variant].append(round(float(cpu_file.read_text()), 3))
                    print(f"{shape} {n} {variant}: {outcome.seconds:.2f} s, CPU {cpu[variant][-1]:.2f} s",
                          file=sys.stderr, flush=True)
            results.append({"shape": shape, "n": n, "seconds": times, "cpu_seconds": cpu})
    print(render(results, shell))
    if opts.json:
        info = {**machine_info(), "sentinel shell": shell.path}
        opts.json.write_text(json.dumps({"machine": info, "results": results}, indent=2) + "\n")


def render(results: list[dict], shell: Shell | None = None) -> str:
    """A Markdown table of median wall (and CPU) times and the ratios: fenced make to plain make,
    each marinbuild to make with the sentinel."""
    name = "bash" if shell is None or shell.bash else "sh"
    titles = {"make": "make", "make+bash": "make under bash", "make+sentinel": f"make + sentinel ({name})",
              "make+sh-sentinel": "make + sh sentinel"}
    variants = list(dict.fromkeys(v for row in results for v in row["seconds"]))
    fenced = [v for v in variants if v.startswith("make+")]
    runners = [v for v in variants if v.startswith("marinbuild")]
    head = ["shape", "N", *(titles.get(v, v) for v in variants), *(f"{titles[v]} / make" for v in fenced),
            *(f"{v} / (make + sentinel)" for v in runners)]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for row in results:
        wall = {v: statistics.median(t) for v, t in row["seconds"].items()}
        cpu = {v: statistics.median(t) for v, t in row.get("cpu_seconds", {}).items()}
        cells = [row["shape"], f"{row['n']:,}", *(_cell(wall, cpu, v) for v in variants),
                 *(_ratio(wall, cpu, v, "make") for v in fenced), *(_ratio(wall, cpu, v, "make+sentinel") for v in runners)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(wall: dict[str, float], cpu: dict[str, float], variant: str) -> str:
    if variant not in wall:
        return "—"
    return f"{wall[variant]:.2f} s" + (f" (CPU {cpu[variant]:.2f})" if variant in cpu else "")


def _ratio(wall: dict[str, float], cpu: dict[str, float], variant: str, over: str) -> str:
    if variant not in wall:
        return "—"
    text = f"**{wall[variant] / wall[over]:.2f}x**"
    return text + (f" (CPU {cpu[variant] / cpu[over]:.2f}x)" if variant in cpu and cpu.get(over) else "")


if __name__ == "__main__":
    main()
