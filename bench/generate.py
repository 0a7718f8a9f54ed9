"""Write equivalent N-step benchmark workflows for marinbuild, Snakemake and GNU make."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from pathlib import Path

TOOLS = ("marinbuild", "snakemake", "make")
SHAPES = ("chain", "fanout", "diamonds", "groups")
WORKFLOW_FILE = {
    "marinbuild": "Marinfile.py",
    "snakemake": "Snakefile",
    "make": "Makefile",
}

# Each shape is a snippet of plain Python defining deps(i, n) -> list of step indices.
# The same text is pasted into the Marinfile and the Snakefile and executed here to
# write the Makefile, so the three workflows cannot drift apart.
SHAPE_CODE = {
    "chain": '''
def deps(i, n):
    """Step i depends on step i - 1."""
    return [i - 1] if i else []
''',
    "fanout": '''
def deps(i, n):
    """One root, n - 2 independent middles, one final step gathering all middles."""
    if i == 0:
        return []
    if i < n - 1:
        return [0]
    return list(range(1, n - 1))
''',
    "diamonds": '''
from math import isqrt


def width(n):
    """Layer width: about sqrt(n), so depth and breadth both grow with n."""
    return max(4, isqrt(n))


def deps(i, n):
    """Layered diamonds: step (layer, pos) needs pos and pos + 1 of the previous layer."""
    w = width(n)
    layer, pos = divmod(i, w)
    if layer == 0:
        return []
    base = (layer - 1) * w
    return [base + pos, base + (pos + 1) % w]
''',
    "groups": '''
def deps(i, n):
    """Independent diamonds of four: a; b and c reading a; d reading b and c."""
    group, role = divmod(i, 4)
    a = 4 * group
    return [[], [a], [a], [a + 1, a + 2]][role]
''',
}

SINKS_CODE = '''
def sinks(n):
    """Steps nothing depends on: the natural targets of a run."""
    used = set()
    for i in range(n):
        used.update(deps(i, n))
    return [i for i in range(n) if i not in used]
'''

MIN_STEPS = {"chain": 1, "fanout": 3, "diamonds": 1, "groups": 1}

MARINFILE = '''"""Benchmark workflow: @SHAPE@ shape, @N@ steps (written by bench.generate)."""

from marinbuild import step

N = @N@

@CODE@

CMD = "echo {i} > {output}/out.txt"
steps = []
for i in range(N):
    parents = [steps[j] for j in deps(i, N)]
    if len(parents) == 1:
        config = {"dep": parents[0], "i": i}
    elif parents:
        config = {"deps": parents, "i": i}
    else:
        config = {"i": i}
    steps.append(step(f"s{i:0@W@d}", cmd=CMD, config=config))
'''

# One wildcard rule whose inputs come from a Python lookup: the idiomatic Snakemake
# form, and far cheaper for Snakemake to parse than N literal rules.
SNAKEFILE = '''"""Benchmark workflow: @SHAPE@ shape, @N@ steps (written by bench.generate)."""

N = @N@

@CODE@

def target(i):
    return f"out/s{i:0@W@d}/out.txt"


wildcard_constraints:
    i=r"\\d+",


rule all:
    input:
        [target(i) for i in sinks(N)],


rule step:
    input:
        lambda wc: [target(j) for j in deps(int(wc.i), N)],
    output:
        "out/s{i}/out.txt",
    params:
        v=lambda wc: int(wc.i),
    shell:
        "echo {params.v} > {output}"
'''


def name_width(n: int) -> int:
    """Zero-padding width of step numbers: at least 5, enough for n - 1."""
    return max(5, len(str(max(n - 1, 0))))


def shape_functions(
    shape: str,
) -> tuple[Callable[[int, int], list[int]], Callable[[int], list[int]]]:
    """Return (deps, sinks) for a shape by executing the very snippet the workflows embed."""
    namespace: dict[str, object] = {}
    exec(SHAPE_CODE[shape] + SINKS_CODE, namespace)  # our own constant text
    return namespace["deps"], namespace["sinks"]  # type: ignore[return-value]


def _fill(template: str, shape: str, n: int, code: str) -> str:
    """Substitute @-placeholders (str.format would fight the braces of the templates)."""
    text = template.replace("@CODE@", code.strip("\n") + "\n")
    return text.replace("@SHAPE@", shape).replace("@N@", str(n)).replace("@W@", str(name_width(n)))


def makefile_lines(shape: str, n: int) -> Iterator[str]:
    """Stream an explicit Makefile: one target per step, `all` over the sinks."""
    deps, sinks = shape_functions(shape)
    width = name_width(n)

    def target(i: int) -> str:
        return f"out/s{i:0{width}d}/out.txt"

    yield f"# Benchmark workflow: {shape} shape, {n} steps (written by bench.generate).\n"
    yield ".PHONY: all\n"
    yield "all: " + " ".join(target(i) for i in sinks(n)) + "\n"
    for i in range(n):
        prereqs = " ".join(target(j) for j in deps(i, n))
        yield f"{target(i)}: {prereqs}\n\tmkdir -p $(@D) && echo {i} > $@\n"


def generate(tool: str, shape: str, n: int, dest_dir: str | Path) -> Path:
    """Write the workflow of `n` steps in `shape` for `tool` into dest_dir; return its path."""
    if tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; expected one of {TOOLS}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; expected one of {SHAPES}")
    if n < MIN_STEPS[shape]:
        raise ValueError(f"shape {shape!r} needs at least {MIN_STEPS[shape]} steps, got {n}")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / WORKFLOW_FILE[tool]
    with path.open("w", buffering=1 << 20) as out:
        if tool == "make":
            out.writelines(makefile_lines(shape, n))
        elif tool == "marinbuild":
            out.write(_fill(MARINFILE, shape, n, SHAPE_CODE[shape]))
        else:
            out.write(_fill(SNAKEFILE, shape, n, SHAPE_CODE[shape] + SINKS_CODE))
    return path


def main(argv: list[str] | None = None) -> None:
    """CLI: python -m bench.generate --tool make --shape chain -n 1000 DEST."""
    parser = argparse.ArgumentParser(prog="python -m bench.generate", description=__doc__)
    parser.add_argument("--tool", choices=TOOLS, required=True)
    parser.add_argument("--shape", choices=SHAPES, required=True)
    parser.add_argument("-n", type=int, required=True, help="number of steps")
    parser.add_argument("dest", help="directory to write the workflow file into")
    args = parser.parse_args(argv)
    print(generate(args.tool, args.shape, args.n, args.dest))


if __name__ == "__main__":
    main()
