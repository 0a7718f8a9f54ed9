"""The long torture: real runners under many random signals on a disk that fills up.

    python -m bench.torture --kills 1000 --steps 120 --runners 6

The same machinery as ``tests/test_torture.py`` (:mod:`tests.torture_lib`), run longer:
rounds of a fresh generated Marinfile follow each other until ``--kills`` signals were
sent. Prints the figures; exits 1 when any promise was broken (an overlap, an incomplete
output, a bad marker, a leftover process, ...), listing each.
"""

from __future__ import annotations

import argparse
import platform
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from tests.torture_lib import Torture, TortureSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.torture", description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, default=1000, help="signals to send to runners in all (default 1000)")
    parser.add_argument("--steps", type=int, default=120, help="steps per round (default 120)")
    parser.add_argument("--runners", type=int, default=6, help="concurrent runners (default 6)")
    parser.add_argument("--minutes", type=float, default=40.0, help="no new round after this long (default 40)")
    parser.add_argument("--round-minutes", type=float, default=10.0,
                        help="signals per round stop after this long, then the round finishes (default 10)")
    parser.add_argument("--heartbeat", type=float, default=0.5)
    parser.add_argument("--expiry", type=float, default=3.0)
    parser.add_argument("--slow", type=float, default=1.0, help="multiply every step's duration")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", help="keep everything here (default: a temporary folder, removed)")
    args = parser.parse_args(argv)
    settings = TortureSettings(
        steps=args.steps, runners=args.runners, min_events=args.kills, heartbeat=args.heartbeat,
        expiry=args.expiry, chaos_seconds=args.round_minutes * 60, total_seconds=args.minutes * 60,
        slow=args.slow, seed=args.seed,
        event_gap=(0.2, 0.7),  # the long variant's rhythm, as documented in docs/benchmarks.md
    )
    # SIGTERM ends the run like Ctrl-C: runners stopped, the tmpfs unmounted.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="marinbuild-torture-"))
    work.mkdir(parents=True, exist_ok=True)
    figures = Torture(work, settings, progress=True).run()
    print(f"\nmachine: {platform.node()}, {platform.machine()}, Python {platform.python_version()}")
    print(figures.summary())
    violations = figures.violations()
    for v in violations:
        print("VIOLATION", v)
    if not args.workdir:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
