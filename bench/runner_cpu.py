"""A marinbuild command's wall time beside the CPU of the runner itself and of what it started.

    python -m bench.runner_cpu -C /dev/shm/dia -- run -q -j 2

Runs the command in this interpreter (the runner's own CPU is this process's) and prints, at
exit, the wall time, the runner's user and system CPU, the CPU of its children that ended (the
steps' shells and sentinels, which the runner reaps), and the runner's voluntary and
involuntary context switches. Where the runner's own CPU is close to the wall time, the run
loop bounds the run, not the machine.
"""

from __future__ import annotations

import argparse
import atexit
import os
import resource
import runpy
import sys
import time


def _report(began: float) -> None:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    sys.stderr.write(
        f"wall {time.monotonic() - began:.2f} s; runner {own.ru_utime + own.ru_stime:.2f} s CPU "
        f"(user {own.ru_utime:.2f}, system {own.ru_stime:.2f}); children {kids.ru_utime + kids.ru_stime:.2f} s CPU; "
        f"context switches {own.ru_nvcsw} voluntary, {own.ru_nivcsw} involuntary\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.runner_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("-C", "--directory", default=".", help="the project folder to run in")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="marinbuild's arguments, after --")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    os.chdir(args.directory)
    atexit.register(_report, time.monotonic())
    sys.argv = ["marinbuild", *command]
    runpy.run_module("marinbuild", run_name="__main__")


if __name__ == "__main__":
    main()
