"""What building the identity payloads of a 10,000-step sweep costs, its configs' scans already made.

Every ``plan`` and ``run`` builds each step's payload from its versioned values
(:func:`marinbuild.identity.identity_payload`). Each step here is a training of a sweep whose
config holds what such configs hold: a dependency, versioned dicts of floats, ints, strings,
lists, ``None`` and an enum, a dataclass, a path, a tuple, and plain fields outside the
identity. Timed over all the steps, ``--rounds`` times; the best and the median are printed in
milliseconds and per step in microseconds (``--json FILE`` keeps them). Another checkout is
measured by putting it first on ``PYTHONPATH``::

    python -m bench.identity_payloads --steps 10000 --rounds 15
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import json
import pathlib
import statistics
import time
from typing import Any

from marinbuild.identity import identity_payload
from marinbuild.steps import ConfigScan, Step, scan_config, step, versioned


class _Optimizer(enum.Enum):
    ADAM = "adam"


@dataclasses.dataclass(frozen=True)
class _Schedule:
    warmup: int
    decay: float
    kind: str = "cosine"


def sweep_configs(steps: int) -> tuple[list[tuple[str, Any, ConfigScan]], dict[Step, str]]:
    """``(name, config, scan)`` of each step of the sweep, and the identity of the step they read."""
    data = step("data", cmd="true")
    out = []
    for i in range(steps):
        config = {
            "data": data,
            "opt": versioned({"lr": 1e-4 * (i % 17 + 1), "betas": [0.9, 0.95], "eps": 1e-8, "wd": 0.1,
                              "name": _Optimizer.ADAM}),
            "model": versioned({"layers": 12 + i % 4, "width": 768, "act": "gelu", "tie": True, "dropout": None}),
            "schedule": versioned(_Schedule(1000, 0.1)),
            "seed": versioned(i),
            "tokenizer": versioned(pathlib.PurePosixPath("gs://bucket/tokenizer")),
            "tags": versioned(("a", "b", "c")),
            "workers": 4,
        }
        out.append((f"train/{i:05d}", config, scan_config(config)))
    return out, {data: "data-0123456789abcdef"}


def measure(steps: int, rounds: int) -> dict[str, float]:
    """Seconds each round took to build every payload: the best and the median, and per step."""
    configs, dep_ids = sweep_configs(steps)
    took = []
    for _ in range(rounds):
        start = time.perf_counter()
        for name, config, scan in configs:
            identity_payload(name, config, dep_ids, scan)
        took.append(time.perf_counter() - start)
    best, median = min(took), statistics.median(took)
    return {"steps": steps, "rounds": rounds, "best_s": best, "median_s": median, "best_us_per_step": best / steps * 1e6}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--json", help="write the figures to this file too")
    args = parser.parse_args(argv)
    result = measure(args.steps, args.rounds)
    print(f"{args.steps} payloads: best {result['best_s'] * 1000:.1f} ms, median {result['median_s'] * 1000:.1f} ms "
          f"({result['best_us_per_step']:.1f} µs a step)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
