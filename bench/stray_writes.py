"""What watching for writes outside the output costs per step, on 10,000 steps.

Before each local step starts and after it ends, ``run`` looks at its dependencies' output
folders and at the folders holding outputs (:mod:`marinbuild.execution.stray_writes`). This
measures that work alone, step after step, on real folders shaped as ``bench.run``'s workflows
leave them: ``fanout`` (one root, 9,999 steps reading it, every output in the prefix itself:
a folder too big to list, so only the root's output is looked at) and ``sweep`` (100 folders of
100 outputs, each step reading one of 100 data outputs; another step's output appears beside
it while it runs, as with ``-j 2``, so its folder is listed again)::

    python -m bench.stray_writes --steps 10000 --workdir /dev/shm/stray

Prints seconds in all and microseconds per step for each shape (``--json FILE`` keeps them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

from marinbuild.execution.stray_writes import found_since, layout_of, take_snapshot
from marinbuild.store.storage import Storage


def _folders(prefix: str, shape: str, steps: int) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Every output (path -> name) and each step's (output, dependency), made on disk."""
    outputs: dict[str, str] = {}
    pairs: list[tuple[str, str]] = []
    if shape == "fanout":
        root = os.path.join(prefix, "root-0000000000000000")
        outputs[root] = "root"
        for i in range(steps - 1):
            outputs[os.path.join(prefix, f"leaf{i:05d}-{i:016x}")] = f"leaf{i:05d}"
        pairs = [(o, root) for o in outputs if o != root]
    else:
        data = [os.path.join(prefix, "data", f"d{i:03d}-{i:016x}") for i in range(100)]
        outputs.update({d: f"data/d{i:03d}" for i, d in enumerate(data)})
        for i in range(steps - len(data)):
            out = os.path.join(prefix, f"sweep{i % 100:03d}", f"p{i:05d}-{i:016x}")
            outputs[out] = f"sweep{i % 100:03d}/p{i:05d}"
            pairs.append((out, data[i % 100]))
    for out in outputs:
        os.makedirs(os.path.join(out, ".marinbuild"), exist_ok=True)
    for dep in {d for _, d in pairs}:
        for n in range(5):
            with open(os.path.join(dep, f"part{n}.bin"), "w") as f:
                f.write("x")
    return outputs, pairs


def measure(shape: str, steps: int, workdir: str) -> dict[str, float]:
    prefix = os.path.join(workdir, shape)
    shutil.rmtree(prefix, ignore_errors=True)
    outputs, pairs = _folders(prefix, shape, steps)
    storage = Storage.for_prefix(prefix)
    # The steps' own work (a file each, the next output appearing) alone, to subtract.
    started = time.perf_counter()
    for n, (out, _) in enumerate(pairs):
        with open(os.path.join(out, "baseline"), "w") as f:
            f.write("ok")
        if n + 1 < len(pairs):
            os.utime(os.path.dirname(pairs[n + 1][0]))
    baseline = time.perf_counter() - started
    started = time.perf_counter()
    layout = layout_of(outputs, prefix)  # once per run
    found = 0
    for n, (out, dep) in enumerate(pairs):
        before = take_snapshot(storage, prefix, out, [dep], layout.seen)
        with open(os.path.join(out, "result"), "w") as f:  # the step's own work
            f.write("ok")
        nxt = pairs[n + 1][0] if n + 1 < len(pairs) else None
        if nxt is not None:  # the next step's output appears meanwhile, as it does with -j 2
            os.utime(os.path.dirname(nxt))
        after = take_snapshot(storage, prefix, out, [dep], layout.seen)
        assert before is not None and after is not None
        found += len(found_since(before, after, layout))
    elapsed = time.perf_counter() - started - baseline
    assert found == 0, f"{found} false findings"
    shutil.rmtree(prefix, ignore_errors=True)
    return {"steps": len(pairs), "seconds": round(elapsed, 3), "us_per_step": round(elapsed / len(pairs) * 1e6, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--shapes", default="fanout,sweep")
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="stray-bench-")
    os.makedirs(workdir, exist_ok=True)
    results = {shape: measure(shape, args.steps, workdir) for shape in args.shapes.split(",")}
    for shape, r in results.items():
        print(f"{shape}: {r['steps']} steps, {r['seconds']} s in all, {r['us_per_step']} µs per step")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
