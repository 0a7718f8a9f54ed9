"""A no-op run of checkouts side by side on one built workflow, in turns, with make's no-op beside them.

Each round runs ``marinbuild run -q`` in FOLDER once per checkout (``PYTHONPATH`` set to it),
then ``make -j2 -s`` in ``FOLDER/make`` where a Makefile is there, and records each command's
wall and CPU time (user + system of the process and its children). CPU time is the figure to
compare on a shared machine: wall time moves with whatever else runs. ``--dry-run`` runs
``marinbuild plan`` and ``make -n`` instead, on a workflow not built.

    python -m bench.generate --tool marinbuild --shape fanout -n 10000 /dev/shm/noop
    python -m bench.generate --tool make --shape fanout -n 10000 /dev/shm/noop/make
    (cd /dev/shm/noop && marinbuild run -q -j 2 && make -C make -j2 -s)   # build once
    python -m bench.noop_side_by_side /dev/shm/noop --rounds 7 BEFORE_CHECKOUT AFTER_CHECKOUT

On a shared machine whose speed drifts from minute to minute (CPU medians moving by a
third), ``--instructions`` counts instead the instructions each no-op executes, under
valgrind's cachegrind without its cache simulation (about 15x slower, and the same count
within 0.3% from run to run): the figure to compare two checkouts by when the seconds are noise.

Each measured ``marinbuild`` command follows one unmeasured run of it from the same checkout.
A no-op keeps a snapshot of the markers it parsed, keyed by the code that parsed them
(``store/marker_snapshot.py``); two checkouts whose parsers differ, measured in turns, each
found the other's snapshot and paid for parsing every marker again (a fanout no-op counted 3.9 G
instructions instead of 2.7 G). The unmeasured run writes the checkout's own.

``--python`` names the interpreter, a virtual environment's for instance: a venv's Python
imports at start-up only what ``site`` needs, where a system Python may import more from its
own ``.pth`` files (certifi's, say), and that moves standard modules' imports out of the count.
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path


def timed(command: list[str], folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of ``command`` run to its end in ``folder``; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} in {folder} failed ({done.returncode}): {done.stderr[-500:]}")
    return wall, after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def instructions(command: list[str], folder: Path, env: dict[str, str]) -> int:
    """Instructions ``command`` executes in user space, counted by cachegrind; it must succeed."""
    counted = ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null", *command]
    done = subprocess.run(counted, cwd=folder, env=env, capture_output=True, text=True)
    found = re.search(r"I\s+refs:\s+([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(counted)} in {folder} failed ({done.returncode}): {done.stderr[-500:]}")
    return int(found[1].replace(",", ""))


def commands(dry_run: bool, python: str) -> tuple[list[str], list[str]]:
    """The marinbuild and make commands one round runs."""
    if dry_run:
        return [python, "-m", "marinbuild", "plan"], ["make", "-C", "make", "-n"]
    return [python, "-m", "marinbuild", "run", "-q"], ["make", "-C", "make", "-j2", "-s"]


def side_by_side(
    folder: Path, checkouts: list[str], rounds: int, dry_run: bool = False, python: str = sys.executable
) -> dict[str, list[tuple[float, float]]]:
    """Each checkout's and make's (wall, CPU) per round."""
    marinbuild, make = commands(dry_run, python)
    results: dict[str, list[tuple[float, float]]] = {c: [] for c in checkouts}
    makefile = folder / "make" / "Makefile"
    if makefile.is_file():
        results["make"] = []
    for _ in range(rounds):
        for checkout in checkouts:
            env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
            timed(marinbuild, folder, env)  # unmeasured: see the module's docstring
            results[checkout].append(timed(marinbuild, folder, env))
        if makefile.is_file():
            results["make"].append(timed(make, folder, dict(os.environ)))
    return results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", type=Path, help="a built workflow (Marinfile.py, and make/Makefile for make)")
    parser.add_argument("checkouts", nargs="+", help="marinbuild checkouts to run, each from its own tree")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--instructions", action="store_true", help="count instructions (valgrind) instead of seconds")
    parser.add_argument("--dry-run", action="store_true", help="`marinbuild plan` and `make -n` instead of the no-op")
    parser.add_argument("--python", default=sys.executable, help="the interpreter marinbuild runs under (default: this one)")
    args = parser.parse_args(argv)
    marinbuild, _ = commands(args.dry_run, args.python)
    if args.instructions:
        for _ in range(args.rounds):
            for checkout in args.checkouts:
                env = {**os.environ, "PYTHONPATH": os.path.abspath(checkout)}
                timed(marinbuild, args.folder, env)  # unmeasured: see the module's docstring
                count = instructions(marinbuild, args.folder, env)
                print(f"{checkout}: {count:,} instructions")
        return
    for name, runs in side_by_side(args.folder, args.checkouts, args.rounds, args.dry_run, args.python).items():
        wall = statistics.median(w for w, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        least = min(c for _, c in runs)
        print(f"{name}: CPU median {cpu:.3f} s, min {least:.3f} s, wall median {wall:.3f} s ({len(runs)} runs)")


if __name__ == "__main__":
    main()
