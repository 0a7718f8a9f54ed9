"""Hello world: generate a small data set, then compute statistics over it.

    marinbuild run            # runs both steps
    marinbuild run            # again: nothing to do
    marinbuild plan           # what would run, and why
"""

import json
import os
import random
from dataclasses import dataclass

from marinbuild import step, this_output_path, versioned


@dataclass(frozen=True)
class GenerateConfig:
    n: int
    seed: int
    output: str


@dataclass(frozen=True)
class StatsConfig:
    data: str
    output: str


def generate_data(config: GenerateConfig) -> None:
    rng = random.Random(config.seed)
    with open(os.path.join(config.output, "numbers.jsonl"), "w") as f:
        for i in range(config.n):
            f.write(json.dumps({"id": i, "value": rng.gauss(0.0, 1.0)}) + "\n")
    print(f"wrote {config.n} numbers")


def compute_stats(config: StatsConfig) -> None:
    with open(os.path.join(config.data, "numbers.jsonl")) as f:
        values = [json.loads(line)["value"] for line in f]
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    stats = {"count": len(values), "mean": mean, "std": var**0.5, "min": min(values), "max": max(values)}
    with open(os.path.join(config.output, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
    print(json.dumps(stats))


data = step(
    "hello/data",
    generate_data,
    GenerateConfig(n=versioned(1000), seed=versioned(0), output=this_output_path()),
    description="Draw numbers from a normal distribution",
)
stats = step(
    "hello/stats",
    compute_stats,
    StatsConfig(data=data, output=this_output_path()),
    description="Count, mean, std, min, max",
)
