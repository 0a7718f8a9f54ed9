"""A kind of backend added from outside marinbuild: registered, chosen with ``backend=``, and
running a pipeline with nothing under ``execution/`` edited for it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import marinbuild
from marinbuild import StepOutcome, step
from marinbuild.backends import registry
from marinbuild.backends.base import Backend, BackendHooks, BackendKind, Job, Outcome, PlacedKind, PlanInput, WireInput
from marinbuild.backends.registry import kind_names, register
from marinbuild.errors import ResourceError
from marinbuild.graph import StepNode
from marinbuild.resources import ResourceConfig


class _Thread(BackendHooks):
    """Runs a function step in a thread of this process, a shell step not at all: enough to see
    that the run goes through it."""

    label = "inthread"

    def __init__(self, ran: list[tuple[str, str]]) -> None:
        self.ran = ran
        self.ended: list[str] = []

    def start(self, job: Job, on_done: Callable[[Outcome], None]) -> _Thread:
        def work() -> None:
            began = time.time()
            try:
                assert job.fn is not None
                job.fn(job.config)
                self.ran.append((job.name, job.env["MARINBUILD_ATTEMPT"]))
                on_done(Outcome(ok=True, started=began, ended=time.time()))
            except Exception as e:
                on_done(Outcome(ok=False, started=began, ended=time.time(), error=str(e)))

        threading.Thread(target=work, daemon=True).start()
        return self

    def cancel(self, reason: str) -> None:
        pass

    def step_ended(self, job: Job) -> None:
        self.ended.append(job.name)


class _Placed(PlacedKind):
    name = "inthread"
    remote = True

    def __init__(self, backend: _Thread) -> None:
        self.thread = backend

    def takes(self, name: str, request):  # type: ignore[no-untyped-def]
        return name.startswith("far-")

    def backend(self, wire: WireInput, fallback: Callable[[StepNode], Backend]) -> Callable[[StepNode], Backend]:
        return lambda node: self.thread if node.name.startswith("far-") else fallback(node)


class _Kind(BackendKind):
    name = "inthread"
    help = "threads of the runner (a test's kind)"

    def __init__(self) -> None:
        self.ran: list[tuple[str, str]] = []
        self.backend_made = _Thread(self.ran)
        self.planned: list[tuple[str, ...]] = []

    def plan(self, given: PlanInput) -> PlacedKind:
        self.planned.append(given.to_run)
        return _Placed(self.backend_made)


@pytest.fixture(autouse=True)
def _registry_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test registers its kind in a copy of the registry: other tests see only the built-in kinds."""
    monkeypatch.setattr(registry, "_registered", {k.name: k for k in registry.kinds()})


def _write(cfg):  # type: ignore[no-untyped-def]
    Path(cfg["out"], "done.txt").write_text(cfg["text"])


def test_a_kind_registered_from_outside_runs_its_steps_and_leaves_the_rest_here(tmp_path: Path) -> None:
    kind = _Kind()
    register(kind)
    assert "inthread" in kind_names()
    prefix = str(tmp_path / "out")
    far = step("far-a", _write, config={"out": marinbuild.this_output_path(), "text": "far"},
               resources=ResourceConfig.with_cpu(64))  # more cores than here: a remote kind's steps are not fitted here
    near = step("near-b", cmd="cat {far}/done.txt > {output}/copy.txt", config={"far": far})
    summary = marinbuild.run(steps=[near], prefix=prefix, backend="inthread", quiet=True)
    assert summary.ok, str(summary)
    assert summary.steps["far-a"].outcome is StepOutcome.RAN and summary.steps["near-b"].outcome is StepOutcome.RAN
    assert kind.ran == [("far-a", "1")] and kind.backend_made.ended == ["far-a"]  # its hooks were called
    assert kind.planned == [("far-a", "near-b")]
    assert Path(summary.steps["near-b"].output_path, "copy.txt").read_text() == "far"
    ledger = json.loads(Path(summary.steps["far-a"].output_path, "attempts.json").read_text())
    assert [a["backend"] for a in ledger["attempts"]] == ["inthread"]


def test_a_kind_refuses_at_plan_time_what_it_cannot_honour(tmp_path: Path) -> None:
    register(_Kind())
    boxed = step("far-boxed", _write, config={"out": "x", "text": "y"},
                 resources=ResourceConfig.with_cpu(1, image="python:3.11"))
    with pytest.raises(ResourceError, match=r"'far-boxed'.*not supported on the inthread backend"):
        marinbuild.run(steps=[boxed], prefix=str(tmp_path), backend="inthread", dry=True)
    assert not (tmp_path / "far-boxed").exists()
