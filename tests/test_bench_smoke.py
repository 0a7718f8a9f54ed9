"""Smoke tests for the benchmark generator and the side-by-side runner at N=20."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bench import run
from bench.generate import SHAPES, generate, shape_functions

N = 20


def name(i: int) -> str:
    return f"s{i:05d}"


def expected_graph(shape: str, n: int = N) -> dict[str, set[str]]:
    """Step name -> names of the steps it depends on, straight from the shape code."""
    deps, _ = shape_functions(shape)
    return {name(i): {name(j) for j in deps(i, n)} for i in range(n)}


def makefile_graph(path: Path) -> tuple[dict[str, set[str]], set[str]]:
    """Parse the generated Makefile into (step graph, steps named by `all`)."""
    graph: dict[str, set[str]] = {}
    targets: set[str] = set()
    step_of = re.compile(r"out/(s\d+)/out\.txt")
    for line in path.read_text().splitlines():
        if line.startswith(("#", "\t", ".PHONY")) or ":" not in line:
            continue
        head, _, tail = line.partition(":")
        prereqs = set(step_of.findall(tail))
        if head == "all":
            targets = prereqs
        else:
            graph[step_of.fullmatch(head).group(1)] = prereqs
    return graph, targets


class FakeStep:
    """Stands in for a marinbuild Step so the Marinfile can be loaded without the core."""

    def __init__(self, name: str, cmd: str, config: dict) -> None:
        self.name, self.cmd, self.config = name, cmd, config


def marinfile_graph(path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, set[str]]:
    """Execute the generated Marinfile against a recording `step` and return its graph."""
    declared: list[FakeStep] = []

    def step(name: str, cmd: str, config: dict | None = None) -> FakeStep:
        declared.append(FakeStep(name, cmd, config or {}))
        return declared[-1]

    fake = types.ModuleType("marinbuild")
    fake.step = step  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "marinbuild", fake)
    exec(compile(path.read_text(), str(path), "exec"), {"__name__": "marinfile"})
    graph = {}
    for s in declared:
        parents = s.config.get("deps", [])
        if "dep" in s.config:
            parents = [s.config["dep"]]
        graph[s.name] = {p.name for p in parents}
        assert s.cmd.format(output="OUT", **s.config) == f"echo {s.config['i']} > OUT/out.txt"
    return graph


def snakefile_namespace(path: Path) -> tuple[str, dict]:
    """Text of the Snakefile and the namespace of its plain-Python preamble."""
    text = path.read_text()
    namespace: dict = {}
    exec(text.split("\nwildcard_constraints:")[0], namespace)
    return text, namespace


@pytest.mark.parametrize("shape", SHAPES)
def test_generated_workflows_describe_the_same_graph(
    shape: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = expected_graph(shape)
    make_graph, make_all = makefile_graph(generate("make", shape, N, tmp_path / "make"))
    assert make_graph == want
    assert make_all and all(not any(t in d for d in want.values()) for t in make_all)

    assert marinfile_graph(generate("marinbuild", shape, N, tmp_path / "mb"), monkeypatch) == want

    text, ns = snakefile_namespace(generate("snakemake", shape, N, tmp_path / "smk"))
    assert re.findall(r"^rule (\w+):", text, flags=re.MULTILINE) == ["all", "step"]
    assert ns["N"] == N
    smk_graph = {name(i): {name(j) for j in ns["deps"](i, N)} for i in range(N)}
    assert smk_graph == want
    assert {ns["target"](i) for i in ns["sinks"](N)} == {f"out/{t}/out.txt" for t in make_all}


def test_generator_streams_large_makefiles_quickly(tmp_path: Path) -> None:
    path = generate("make", "fanout", 100_000, tmp_path)
    assert path.read_text().count("\tmkdir -p") == 100_000


def test_generator_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 3"):
        generate("make", "fanout", 2, tmp_path)
    with pytest.raises(ValueError, match="unknown tool"):
        generate("ninja", "chain", 5, tmp_path)


def outputs(root: Path) -> dict[str, str]:
    """Step name -> content of its out.txt, ignoring marinbuild's hash suffix on dirs."""
    found = {}
    for path in root.rglob("out.txt"):
        found[path.parent.name.split("-")[0]] = path.read_text()
    return found


def test_runner_make_and_marinbuild_agree(tmp_path: Path) -> None:
    work, doc, raw = tmp_path / "work", tmp_path / "bench.md", tmp_path / "raw.json"
    page = run.main(
        [
            "--tools",
            "make,marinbuild",
            "--sizes",
            str(N),
            "--workdir",
            str(work),
            "--keep",
            "--json",
            str(raw),
            "--doc",
            str(doc),
            "--timeout",
            "60",
            "--from-checkout",
        ]
    )
    results = run.load_results([str(raw)])
    bad = [r for r in results["records"] if r.status != "ok"]
    assert not bad, bad
    assert len(results["records"]) == len(SHAPES) * 2 * 3

    for shape in SHAPES:
        made = outputs(work / f"{shape}-{N}" / "make" / "out")
        assert made == {name(i): f"{i}\n" for i in range(N)}
        assert outputs(work / f"{shape}-{N}" / "marinbuild" / "out") == made

    assert doc.read_text() == page
    for title in run.PHASE_TITLES.values():
        section = page.split(f"### {title}")[1].split("###")[0]
        rows = [line for line in section.splitlines() if line.startswith("| ") and "---" not in line]
        assert [r.split(" | ")[0].strip("| ") for r in rows[1:]] == list(SHAPES)
        assert all(f"| {N} |" in r for r in rows[1:])

    again = run.main(["--from-json", str(raw), "--no-doc"])
    assert again == page


def test_fence_floor_runs_make_with_the_steps_own_sentinel(tmp_path: Path) -> None:
    """make carries the sentinel's text verbatim: it builds every output, and it is gated."""
    import json
    import subprocess

    from bench import fence_floor
    from marinbuild.backends.local.fence import find_shell

    raw = tmp_path / "floor.json"
    fence_floor.main(["--shapes", "fanout", "--sizes", str(N), "--rounds", "1", "--workdir", str(tmp_path), "--json", str(raw)])
    (result,) = json.loads(raw.read_text())["results"]
    assert set(result["seconds"]) == set(result["cpu_seconds"]) == {"make", "make+sentinel"}
    fenced = tmp_path / f"fanout-{N}" / "make+sentinel"
    assert len(list((fenced / "out").rglob("out.txt"))) == N
    recipes = [line for line in (fenced / "Makefile").read_text().splitlines() if line.startswith("\t")]
    # The sentinel a run uses here: bash's read -t where bash 4 is on PATH, else sh's sleep.
    timer = 'read -r -t "$$l"' if find_shell().bash else '(sleep "$$l"'
    assert len(recipes) == N and all("<&9" in r and timer in r and "8>&- &" in r for r in recipes)
    # Without its gate line a step never starts, as in a run whose runner died first.
    (fenced / "gate").write_text("")
    subprocess.run(["rm", "-rf", str(fenced / "out")], check=True)
    done = subprocess.run(["make", "-s", "-j2"], cwd=fenced, capture_output=True)
    assert done.returncode != 0 and not list((fenced / "out").rglob("out.txt"))


def test_runner_cpu_bench_runs_the_command_and_says_the_runners_own_cpu(tmp_path: Path) -> None:
    generate("marinbuild", "diamonds", N, tmp_path)
    done = subprocess.run([sys.executable, "-m", "bench.runner_cpu", "-C", str(tmp_path), "--", "run", "-q", "-j", "2"],
                          cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("marinbuild-out/*/.marinbuild/status"))) == N
    figures = re.search(r"wall ([\d.]+) s; runner ([\d.]+) s CPU .*children ([\d.]+) s CPU", done.stderr)
    assert figures is not None, done.stderr
    wall, runner, children = map(float, figures.groups())
    assert runner > 0 and children > 0 and wall > 0


def test_stray_writes_bench_measures_both_layouts_without_false_findings(tmp_path: Path) -> None:
    from bench.stray_writes import measure

    for shape in ("fanout", "sweep"):
        result = measure(shape, 300, str(tmp_path))
        assert result["steps"] == (299 if shape == "fanout" else 200)  # and measure() found no stray


def test_identity_payloads_bench_builds_a_payload_per_step_of_its_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.identity_payloads import main, sweep_configs
    from marinbuild.identity import identity_payload

    configs, dep_ids = sweep_configs(3)
    payloads = [identity_payload(name, config, dep_ids, scan) for name, config, scan in configs]
    assert [sorted(p["versioned"]) for p in payloads] == [["model", "opt", "schedule", "seed", "tags", "tokenizer"]] * 3
    assert payloads[1]["versioned"]["opt"]["name"] == "adam" and payloads[1]["dependencies"] == {"data": "data-0123456789abcdef"}
    assert len({json.dumps(p, sort_keys=True) for p in payloads}) == 3
    main(["--steps", "5", "--rounds", "2"])
    assert capsys.readouterr().out.startswith("5 payloads: best ")


def test_noop_side_by_side_times_each_checkout_and_make_on_a_built_workflow(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import noop_side_by_side

    generate("marinbuild", "chain", 3, tmp_path)
    generate("make", "chain", 3, tmp_path / "make")
    repo = str(Path(__file__).resolve().parent.parent)
    env = {**os.environ, "PYTHONPATH": repo}
    subprocess.run([sys.executable, "-m", "marinbuild", "run", "-q"], cwd=tmp_path, env=env, check=True)
    subprocess.run(["make", "-C", "make", "-s"], cwd=tmp_path, check=True)
    noop_side_by_side.main([str(tmp_path), repo, "--rounds", "2"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [repo, "make"]
    assert all("(2 runs)" in line for line in lines)


def test_noop_side_by_side_dry_run_plans_without_building(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from bench import noop_side_by_side

    generate("marinbuild", "fanout", 3, tmp_path)
    generate("make", "fanout", 3, tmp_path / "make")
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    repo = str(Path(__file__).resolve().parent.parent)
    noop_side_by_side.main([str(tmp_path), repo, "--rounds", "1", "--dry-run", "--python", sys.executable])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == [repo, "make"]
    # a dry run of either tool writes nothing beside the workflows (Python's caches aside)
    after = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if "__pycache__" not in p.parts)
    assert after == [p for p in before if "__pycache__" not in p.parts]
