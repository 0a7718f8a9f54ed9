"""The shipped examples run, and a second run finds nothing to do."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from .helpers import REPO, copy_example, marinbuild, plan_json


def test_root_marinfile_is_the_hello_world(tmp_path):
    assert (REPO / "Marinfile.py").read_text() == (REPO / "examples/hello_world/Marinfile.py").read_text()


@pytest.mark.parametrize("name", ["hello_world", "diamond"])
def test_example_runs_then_is_up_to_date(tmp_path, name):
    folder = copy_example(name, tmp_path)
    first = marinbuild("run", "-j", "2", cwd=folder)
    assert first.returncode == 0, first.stdout + first.stderr
    second = marinbuild("run", cwd=folder)
    assert second.returncode == 0 and "nothing to do" in second.stdout


def test_hello_world_statistics(tmp_path):
    folder = copy_example("hello_world", tmp_path)
    assert marinbuild("run", cwd=folder).returncode == 0
    stats = json.loads((Path(plan_json(folder)["hello/stats"]["output_path"]) / "stats.json").read_text())
    assert stats["count"] == 1000 and abs(stats["mean"]) < 0.2 and 0.8 < stats["std"] < 1.2


def test_diamond_total_and_single_corpus_run(tmp_path):
    folder = copy_example("diamond", tmp_path)
    assert marinbuild("run", "-j", "3", cwd=folder).returncode == 0
    rows = plan_json(folder)
    total = json.loads((Path(rows["merge"]["output_path"]) / "total.json").read_text())
    assert total == {"total": sum(range(1, 301)), "shards": 3}
    forced = marinbuild("run", "--force", "corpus", cwd=folder)
    assert forced.returncode == 0
    assert forced.stdout.count("start corpus") == 1 and forced.stdout.count("start shard/") == 3


def test_jax_training_writes_checkpoint_and_eval_reads_it(tmp_path):
    folder = copy_example("jax_train", tmp_path)
    result = marinbuild("run", cwd=folder, env={"JAX_PLATFORMS": "cpu"}, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = plan_json(folder)
    assert (Path(rows["jax/train"]["output_path"]) / "checkpoint.npz").exists()
    metrics = json.loads((Path(rows["jax/eval"]["output_path"]) / "eval.json").read_text())
    assert metrics["trained_steps"] == 300 and metrics["mse"] < 0.01


def test_outputs_of_a_run_inside_an_example_are_ignored_by_git(tmp_path):
    # `cd examples/diamond && marinbuild run` leaves marinbuild-out/ there; git must not see it.
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / ".gitignore").write_text((REPO / ".gitignore").read_text())
    for path in ("marinbuild-out/x-1/out.txt", "examples/diamond/marinbuild-out/merge-1/total.json"):
        ignored = subprocess.run(["git", "check-ignore", "-q", path], cwd=tmp_path)
        assert ignored.returncode == 0, path


def test_tests_copy_only_the_examples_own_files(tmp_path):
    # A run made inside an example folder must not travel into the copy a test runs.
    examples = tmp_path / "examples"
    (examples / "diamond").mkdir(parents=True)
    (examples / "diamond" / "Marinfile.py").write_text((REPO / "examples/diamond/Marinfile.py").read_text())
    cd_and_run = marinbuild("run", cwd=examples / "diamond")
    assert cd_and_run.returncode == 0 and (examples / "diamond" / "marinbuild-out").is_dir()
    copied = copy_example("diamond", tmp_path / "copy", examples=examples)
    assert sorted(p.name for p in copied.iterdir()) == ["Marinfile.py"]
    assert "nothing to do" not in marinbuild("run", cwd=copied).stdout
