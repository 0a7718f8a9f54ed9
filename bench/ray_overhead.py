"""Per-step overhead of the Ray backend against the local backend, on N trivial steps.

    python -m bench.ray_overhead                  # 1,000 function steps
    python -m bench.ray_overhead -n 200 --kind cmd

Each backend runs a fresh Marinfile of N independent steps that do nothing
(``def noop(cfg): pass``, or ``cmd="true"``) with ``marinbuild run -q``, and once more
with a single step. The per-step overhead is ``(T(N) - T(1)) / (N - 1)``: the fixed cost
of starting marinbuild (and joining Ray) cancels out. The Ray runs go to a cluster this
script starts on the machine (a head with as many CPUs as the machine has cores, token
authentication off), the same shape as the tests' cluster; it is stopped afterwards.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fixtures_ray import short_root, start_cluster, stop_cluster

REPO = Path(__file__).resolve().parent.parent

MARINFILE = """
from marinbuild import step, versioned

def noop(cfg):
    pass

for i in range({n}):
    {declare}
"""
DECLARE = {
    "fn": 'step(f"s{i}", noop, {"i": versioned(i)})',
    "cmd": 'step(f"s{i}", cmd="true", config={"i": versioned(i)})',
}


def timed_run(folder: Path, n: int, kind: str, extra: list[str], env: dict[str, str]) -> float:
    """Seconds one ``marinbuild run`` of ``n`` fresh steps takes, start-up included."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / "Marinfile.py").write_text(MARINFILE.format(n=n, declare=DECLARE[kind]))
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "marinbuild", "run", "-q", *extra],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    elapsed = time.perf_counter() - start
    if result.returncode != 0:
        raise RuntimeError(f"marinbuild run failed ({result.returncode}): {result.stdout}{result.stderr}")
    return elapsed


def measure(root: Path, n: int, kind: str, extra: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """T(1), T(N) and the per-step overhead in milliseconds."""
    one = timed_run(root / "one", 1, kind, extra, env)
    many = timed_run(root / "many", n, kind, extra, env)
    return one, many, (many - one) / (n - 1) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ray_overhead", description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="steps per run (default %(default)s)")
    parser.add_argument("--kind", choices=sorted(DECLARE), default="fn", help="function or shell steps")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    env.pop("MARIN_PREFIX", None)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    work = Path(tempfile.mkdtemp(prefix="mb-ray-bench-"))
    cluster = start_cluster(short_root("mbrayb-"), extra_node=False, cpus=os.cpu_count() or 2)
    try:
        rows = {
            "local": measure(work / "local", args.n, args.kind, [], env),
            "ray": measure(
                work / "ray",
                args.n,
                args.kind,
                ["--backend", "ray", "--ray-address", cluster.address],
                {**env, **cluster.env},
            ),
        }
    finally:
        stop_cluster(cluster)
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.n} trivial {args.kind} steps, {os.cpu_count()} cores")
    print("| backend | 1 step (s) | N steps (s) | per-step overhead (ms) |")
    print("|---|---:|---:|---:|")
    for name, (one, many, per_step) in rows.items():
        print(f"| {name} | {one:.2f} | {many:.2f} | {per_step:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
