"""Rerun means rerun on ``gs://``: a forced step restarts in an emptied folder, and a dependency rerun
since is told from the status summary, within the request budget of an up-to-date plan.

Real runs against the GCS emulator (``tests/fixtures_gcs.py``) through gcsfs; requests are
counted at the emulator.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import marinbuild
from marinbuild.store.storage import Storage

from .helpers import write_marinfile

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

PIPELINE = """
import fsspec
from marinbuild import step, versioned, this_output_path

def train(cfg):
    # Continues from the checkpoint folder it finds, as a training step resumes: +3 a run.
    fs, path = fsspec.core.url_to_fs(cfg["output"])
    try:
        n = int(fs.cat_file(path + "/ckpt/step").decode())
    except FileNotFoundError:
        n = 0
    fs.pipe_file(path + "/ckpt/step", str(n + 3).encode())

def evaluate(cfg):
    fs, path = fsspec.core.url_to_fs(cfg["output"])
    fs.pipe_file(path + "/score", fs.cat_file(fsspec.core.url_to_fs(cfg["model"])[1] + "/ckpt/step"))

models = [step(f"train/lr{lr}", train, {"lr": versioned(lr), "output": this_output_path()}) for lr in (0.1, 0.2)]
ev = step("eval", evaluate, {"model": models[0], "others": models[1], "output": this_output_path()})
step("summary", evaluate, {"model": models[0], "ev": ev, "output": this_output_path()})
"""


def count(emulator: Emulator, fn: Any) -> tuple[Any, int]:
    before = emulator.requests()
    result = fn()
    time.sleep(0.2)  # the emulator logs a request once it has answered it
    return result, emulator.requests() - before


def test_forced_restart_keep_output_and_rerun_dependencies_on_gcs(gcs_emulator: Emulator, gcs_prefix: str,
                                                                   project: Path) -> None:
    file = str(write_marinfile(project, PIPELINE))
    storage = Storage.for_prefix(gcs_prefix)
    assert marinbuild.run(file=file, prefix=gcs_prefix, quiet=True).ok
    plan = marinbuild.plan(file=file, prefix=gcs_prefix)
    out = plan.node("train/lr0.1").output_path
    step_of = lambda: storage.read_text(Storage.join(out, "ckpt", "step"))  # noqa: E731
    assert step_of() == "3"

    # Up to date, dependencies and all: the summary answers, no marker is read.
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts() == {"skip": 4} and requests <= 4, requests

    # A forced rerun starts from an emptied folder (the old checkpoint set aside, then dropped).
    assert marinbuild.run("train/lr0.1", file=file, prefix=gcs_prefix, force=["train/lr0.1"], quiet=True).ok
    assert step_of() == "3"
    assert not [n for n in storage.list_names(Storage.join(out, ".marinbuild")) if n.startswith("aside-")]
    # ... or resumes in place when asked.
    assert marinbuild.run("train/lr0.1", file=file, prefix=gcs_prefix, force=["train/lr0.1"], keep_output=True,
                          quiet=True).ok
    assert step_of() == "6"

    # eval and summary read the old train/lr0.1: both are planned to run, for one marker read.
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    reasons = {n: plan.decisions[n].reason for n in plan.order}
    assert reasons["eval"] == "dependency train/lr0.1 rerun since this step ran"
    assert reasons["summary"] in ("dependency train/lr0.1 rerun since this step ran",
                                  "upstream train/lr0.1 rerun since this step ran")
    assert reasons["train/lr0.2"] == "up to date"
    assert requests <= 4 + 2, requests  # the two dependants' markers, where the summary's digest differs
    summary = marinbuild.run(file=file, prefix=gcs_prefix, quiet=True)
    assert summary.ok and set(summary.names(marinbuild.StepOutcome.RAN)) == {"eval", "summary"}
    plan, requests = count(gcs_emulator, lambda: marinbuild.plan(file=file, prefix=gcs_prefix))
    assert plan.counts() == {"skip": 4} and requests <= 4, requests
    assert storage.read_text(Storage.join(plan.node("eval").output_path, "score")) == "6"
