"""A diamond with a fan-out: shell and function steps mixed.

            ┌─ shard/0 ─┐
    corpus ─┼─ shard/1 ─┼─ merge ─ report
            └─ shard/2 ─┘

``corpus`` runs once even though three shards depend on it. Try::

    marinbuild run -j 3
    marinbuild plan --dag dot | dot -Tsvg > diamond.svg
    marinbuild run --force corpus     # reruns everything below it
"""

import json
import os

from marinbuild import output_path_of, step, this_output_path, versioned

SHARDS = 3

corpus = step(
    "corpus",
    cmd="seq 1 {n} > {output}/numbers.txt",
    config={"n": versioned(300)},
)

shards = [
    step(
        f"shard/{i}",
        cmd="awk -v k={k} -v i={i} 'NR % k == i {{ s += $1 }} END {{ print s + 0 }}' {numbers} > {output}/sum.txt",
        config={"numbers": output_path_of(corpus, "numbers.txt"), "k": versioned(SHARDS), "i": versioned(i)},
    )
    for i in range(SHARDS)
]


def merge(config: dict) -> None:
    total = 0
    for shard in config["shards"]:
        with open(os.path.join(shard, "sum.txt")) as f:
            total += int(f.read().strip())
    with open(os.path.join(config["output"], "total.json"), "w") as f:
        json.dump({"total": total, "shards": len(config["shards"])}, f)


merged = step("merge", merge, {"shards": shards, "output": this_output_path()})

report = step(
    "report",
    cmd="python3 -c 'import json,sys; print(\"total:\", json.load(open(sys.argv[1]))[\"total\"])' {total} | tee {output}/report.txt",
    config={"total": output_path_of(merged, "total.json")},
)
