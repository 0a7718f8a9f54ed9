"""Two steps on a local store, for the unit tests of one attempt: ``a`` (a function) and ``b``
(a command reading ``a``'s output), with the run's context over them."""

from __future__ import annotations

from pathlib import Path

from marinbuild.execution.run_context import RunContext
from marinbuild.graph import StepGraph, build_graph
from marinbuild.steps import step, this_output_path, versioned
from marinbuild.store.markers import SUCCESS, write_status
from marinbuild.store.storage import Storage


def noop(cfg: object) -> None:
    pass


def two_steps(storage: Storage) -> StepGraph:
    a = step("a", noop, {"n": versioned(1)})
    b = step("b", cmd="echo {a} > {output}/x", config={"a": a, "out": this_output_path()}, env={"MY_VAR": "1"})
    return build_graph([b], storage.prefix)


def context(storage: Storage, graph: StepGraph, tmp_path: Path, **kw: object) -> RunContext:
    return RunContext(
        storage=storage,
        workdir=str(tmp_path),
        marinfile=str(tmp_path / "Marinfile.py"),
        outputs={n: node.output_path for n, node in graph.nodes.items()},
        identities={n: node.identity for n, node in graph.nodes.items()},
        **kw,  # type: ignore[arg-type]
    )


def succeed(storage: Storage, graph: StepGraph, name: str) -> None:
    node = graph.nodes[name]
    write_status(storage, node.output_path, SUCCESS, name=name, identity=node.identity)
