"""Time to the first byte of a step in a cached Python environment, against no environment.

    python -m bench.env_first_byte                # 9 rounds of every case
    python -m bench.env_first_byte --repeats 15

A one-step Marinfile is run with ``marinbuild run -q`` under a new prefix each time (so the
step always runs); the step's first act is to write
the wall-clock time into its output. The figure is that time minus the moment the command
was started: start-up, planning, lease, environment lookup and the step's own start-up,
everything a user waits for before their code runs. Cases:

* a function step and a shell step without an environment (the function step is a fork of
  the runner; the shell step a ``/bin/sh``);
* the same steps in a cached environment (``pip_dependency_groups`` naming a small wheel
  built here): the shell step runs with the environment first on PATH, the function step
  under the environment's interpreter (``python -m marinbuild.backends.worker``, which
  loads the Marinfile again);
* the first build: the same function step with an empty cache, so that uv creates the
  environment and installs the wheel (offline) before the step starts.

The cases run in turns (round after round), so that a busy moment of a shared machine
reaches each of them alike. Median, minimum and maximum per case, and the median CPU time
(user + system) of the whole run, which a busy machine stretches far less than wall time;
a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.wheels import direct_reference, make_wheel

REPO = Path(__file__).resolve().parent.parent

MARINFILE = """
import os, time
from marinbuild import step

def first(cfg):
    with open(os.path.join(os.environ["MARINBUILD_OUTPUT"], "t"), "w") as f:
        f.write(repr(time.time()))

groups = {groups!r}
if {kind!r} == "fn":
    step("s", first, pip_dependency_groups=groups)
else:
    step("s", cmd="python3 -c 'import time; print(repr(time.time()))' > {{output}}/t", pip_dependency_groups=groups)
"""


def first_byte(folder: Path, env: dict[str, str]) -> tuple[float, float]:
    """Seconds from starting ``marinbuild run`` to the step's first write (a new prefix each time),
    and the CPU seconds (user + system) the whole run used, its step and uv included."""
    out = Path(tempfile.mkdtemp(prefix="out-", dir=folder))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    result = subprocess.run([sys.executable, "-m", "marinbuild", "run", "-q", "--prefix", str(out)], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise SystemExit(f"run failed in {folder}: {result.stdout}{result.stderr}")
    stamps = list(out.glob("s-*/t"))
    if len(stamps) != 1:
        raise SystemExit(f"no timestamp under {out}: {result.stdout}{result.stderr}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return float(stamps[0].read_text()) - start, cpu


def prepare(root: Path, name: str, kind: str, groups: list[str]) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "Marinfile.py").write_text(MARINFILE.format(kind=kind, groups=groups))
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="mb-envbench-") as tmp:
        root = Path(tmp)
        wheel = make_wheel(root / "wheels")
        groups = [direct_reference(wheel)]
        base = {**os.environ, "PYTHONPATH": str(REPO)}
        warm = {**base, "MARINBUILD_ENV_CACHE": str(root / "cache")}
        cold_cache = root / "cold-cache"
        cold = {**base, "MARINBUILD_ENV_CACHE": str(cold_cache)}
        cases = [
            ("function step, no environment", prepare(root, "fn-none", "fn", []), warm),
            ("function step, cached environment", prepare(root, "fn-env", "fn", groups), warm),
            ("shell step, no environment", prepare(root, "cmd-none", "cmd", []), warm),
            ("shell step, cached environment", prepare(root, "cmd-env", "cmd", groups), warm),
            ("function step, first build (empty cache)", prepare(root, "fn-build", "fn", groups), cold),
        ]
        first_byte(cases[1][1], warm)  # builds the cached cases' environment once
        times: dict[str, list[tuple[float, float]]] = {label: [] for label, _, _ in cases}
        # In turns: a slow minute of a shared machine reaches every case alike.
        for _ in range(args.repeats):
            for label, folder, env in cases:
                if env is cold:
                    shutil.rmtree(cold_cache, ignore_errors=True)
                times[label].append(first_byte(folder, env))
    print("| case | first byte, median (ms) | min (ms) | max (ms) | CPU of the run, median (ms) |")
    print("|---|---:|---:|---:|---:|")
    for label, values in times.items():
        ms = [t * 1000 for t, _ in values]
        cpu = statistics.median(c * 1000 for _, c in values)
        print(f"| {label} | {statistics.median(ms):.0f} | {min(ms):.0f} | {max(ms):.0f} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
