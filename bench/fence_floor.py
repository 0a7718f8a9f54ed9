"""What every step's own sentinel costs, measured with GNU make carrying the same sentinel.

A local step of marinbuild starts its sentinel (``marinbuild/backends/local/fence.py``)
before its command: the step's shell reads its gate line, forks the sentinel twice over,
the sentinel forks its timer and the timer executes ``sleep``. That is four processes a
step on top of the step's own shell, whatever the runner around them does. To see what
that alone costs, this benchmark gives make the same work: each recipe of a generated
Makefile becomes the text marinbuild runs for a shell step (``gated_shell``), fed its gate
line from a file, so make's children fork and execute exactly what marinbuild's do. Only
the sentinel's last ``kill -KILL 0`` (which here would hit make's own process group) kills
the timer's subshell alone (its ``sleep`` runs out its tenth of a second); the sentinel then reads end-of-file at once, where marinbuild's waits for
the step to end. The figure is therefore a floor: no runner, lease, marker or ledger.

Three workflows run one after the other, round by round, each from an empty output
folder, with 2 jobs: plain make, make with the sentinel, and (``--marinbuild``) marinbuild
itself, installed into its own venv as ``bench.run`` does::

    python -m bench.fence_floor --shapes fanout,diamonds --sizes 10000 --rounds 2 \\
        --marinbuild --workdir /dev/shm/floor --json bench/results/fence-floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

from bench.generate import generate
from bench.run import DEFAULT_MARINBUILD_VENV, count_outputs, ensure_marinbuild, machine_info, measure, tool_commands
from marinbuild.backends.local.fence import gated_shell

VARIANTS = ("make", "make+sentinel", "marinbuild")
LEASE_SECONDS = "0.1"
"""The gate line, which arms the sentinel's timer as in a run. Short, because killing the
timer's subshell alone leaves its ``sleep`` behind (marinbuild's group kill takes it)."""


def sentinel_recipe(recipe: str) -> str:
    """One make recipe line running ``recipe`` as marinbuild runs a shell step, sentinel included."""
    marker = "\0"
    script = gated_shell(marker, cgroup="").replace("kill -KILL 0", 'kill -KILL "$t"')
    line = "; ".join(script.splitlines()).replace("$", "$$")
    return f"exec 9<gate; {line}".replace(marker, recipe)


def fenced_makefile(plain: str) -> str:
    """The Makefile ``plain`` with every recipe carrying the sentinel."""
    return "".join(
        f"\t{sentinel_recipe(line[1:].rstrip(chr(10)))}\n" if line.startswith("\t") else line
        for line in plain.splitlines(keepends=True)
    )


def prepare(variant: str, shape: str, n: int, workdir: Path) -> Path:
    """Generate one variant's workflow folder."""
    folder = workdir / f"{shape}-{n}" / variant
    shutil.rmtree(folder, ignore_errors=True)
    generate("marinbuild" if variant == "marinbuild" else "make", shape, n, folder)
    if variant == "make+sentinel":
        makefile = folder / "Makefile"
        makefile.write_text(fenced_makefile(makefile.read_text()))
        (folder / "gate").write_text(LEASE_SECONDS + "\n")
    return folder


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="fanout,diamonds")
    parser.add_argument("--sizes", default="10000")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--marinbuild", action="store_true", help="time marinbuild too")
    parser.add_argument("--marinbuild-venv", type=Path, default=DEFAULT_MARINBUILD_VENV)
    parser.add_argument("--workdir", type=Path, help="where the workflows run (default: a temporary folder)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", type=Path, help="write the raw times here")
    opts = parser.parse_args(argv)

    variants = [v for v in VARIANTS if v != "marinbuild" or opts.marinbuild]
    base = ensure_marinbuild(opts.marinbuild_venv) if opts.marinbuild else None
    workdir = opts.workdir or Path(tempfile.mkdtemp(prefix="fence-floor-"))
    results = []
    for shape in opts.shapes.split(","):
        for n in map(int, opts.sizes.split(",")):
            times: dict[str, list[float]] = {v: [] for v in variants}
            folders = {v: prepare(v, shape, n, workdir) for v in variants}
            for _ in range(opts.rounds):
                for variant in variants:
                    folder = folders[variant]
                    shutil.rmtree(folder / "out", ignore_errors=True)
                    tool = "marinbuild" if variant == "marinbuild" else "make"
                    command = tool_commands(tool, Path("-"), folder / "out", [], base)["execute"]
                    outcome = measure(command, folder, dict(os.environ), opts.timeout)
                    made = count_outputs(folder / "out")
                    if outcome.rc != 0 or made != n:
                        sys.exit(f"{variant} {shape} {n}: rc {outcome.rc}, {made} of {n} outputs\n{outcome.log_tail}")
                    times[variant].append(round(outcome.seconds, 3))
                    print(f"{shape} {n} {variant}: {outcome.seconds:.2f} s", file=sys.stderr, flush=True)
            results.append({"shape": shape, "n": n, "seconds": times})
    print(render(results))
    if opts.json:
        opts.json.write_text(json.dumps({"machine": machine_info(), "results": results}, indent=2) + "\n")


def render(results: list[dict]) -> str:
    """A Markdown table of median times and the ratios between the variants."""
    head = "| shape | N | make | make + sentinel | marinbuild | sentinel/make | marinbuild/make | marinbuild/(make + sentinel) |"
    lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in results:
        med = {v: statistics.median(t) for v, t in row["seconds"].items()}
        plain, fenced, mb = med["make"], med["make+sentinel"], med.get("marinbuild")
        cells = [
            row["shape"],
            f"{row['n']:,}",
            f"{plain:.2f} s",
            f"{fenced:.2f} s",
            f"{mb:.2f} s" if mb else "—",
            f"{fenced / plain:.2f}x",
            f"{mb / plain:.2f}x" if mb else "—",
            f"{mb / fenced:.2f}x" if mb else "—",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
