"""How long starting a step's shell blocks the runner, with the machine's CPUs busy or not.

``posix_spawn`` returns once the child has reached ``exec``. With every CPU busy, a child the
kernel starts on another CPU waits there for its turn while the caller's own CPU, left by the
blocked caller, stands idle. :func:`marinbuild.backends.local.spawn.spawn` keeps the caller on
its CPU for the call, so the child starts where the caller stopped. This times it against a
plain ``os.posix_spawn`` of the same shell, with 0, 1 and as many busy processes as CPUs::

    python -m bench.spawn_latency --spawns 300 --shell /bin/bash

Prints the median, 90th percentile and mean microseconds of each (``--json FILE`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import time

from marinbuild.backends.local.spawn import Environment, spawn


def _busy(count: int) -> list[int]:
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the busy child
            while True:
                pass
        pids.append(pid)
    return pids


def _time(start, spawns: int) -> list[float]:  # type: ignore[no-untyped-def]
    took = []
    for _ in range(spawns):
        began = time.perf_counter()
        pid = start()
        took.append(time.perf_counter() - began)
        os.waitpid(pid, 0)
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=300)
    parser.add_argument("--shell", default="/bin/bash")
    parser.add_argument("--json")
    args = parser.parse_args()
    argv = [args.shell, "-c", ":"]
    env = Environment(os.environ)
    ways = {
        "os.posix_spawn": lambda: os.posix_spawn(args.shell, argv, os.environ),
        "marinbuild spawn": lambda: spawn(args.shell, argv, env),
    }
    results = []
    for busy in sorted({0, 1, os.cpu_count() or 1}):
        pids = _busy(busy)
        try:
            for _ in range(2):  # in turns, twice: the machine's other work moves each round
                for name, start in ways.items():
                    took = sorted(_time(start, args.spawns))
                    row = {"busy": busy, "way": name, "median_us": statistics.median(took) * 1e6,
                           "p90_us": took[int(len(took) * 0.9)] * 1e6, "mean_us": statistics.fmean(took) * 1e6}
                    results.append(row)
                    print(f"{busy} busy  {name:17s} median {row['median_us']:7.0f} us  p90 {row['p90_us']:7.0f} us  "
                          f"mean {row['mean_us']:7.0f} us")
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shell": args.shell, "spawns": args.spawns, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
