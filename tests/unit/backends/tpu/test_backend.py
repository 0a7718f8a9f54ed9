"""The TPU backend's view of a scheduler job: slices, environment, command, hang timeout, per-step state."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from marinbuild.backends.base import Job
from marinbuild.backends.environments import DECLARED_ENV_EXTRA
from marinbuild.backends.tpu.backend import CREATED_PROGRESS_TIMEOUT, TpuDispatch
from marinbuild.backends.tpu.cluster import parse_cluster


def dispatch(tmp_path: Path, **top: object) -> TpuDispatch:
    cluster = parse_cluster({"slices": [{"name": "a", "tpu_type": "v4-8", "hosts": ["127.0.0.1:1"],
                                         "ssh": {"python": "/opt/py/bin/python3"}}], **top})
    return TpuDispatch(cluster, marinfile=str(tmp_path / "Marinfile.py"), prefix=str(tmp_path / "out"), sync=True,
                       console=lambda line: None)


def job(tmp_path: Path, **kw: object) -> Job:
    env = {"MARINBUILD_TPU_SLICES": "a", "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "SEED": "1",
           "MARINBUILD_ATTEMPT": "3", "MARINBUILD_PROGRESS": "/local/progress"}
    return Job(name="train", output_path=str(tmp_path / "out" / "train-1"), log_file=str(tmp_path / "step.log"),
               workdir=str(tmp_path), env=env, **kw)  # type: ignore[arg-type]


def test_a_job_becomes_a_tpu_job_without_this_machines_variables(tmp_path: Path) -> None:
    tpu = dispatch(tmp_path).tpu_job(job(tmp_path, command="python train.py", extra={DECLARED_ENV_EXTRA: {"MKL_NUM_THREADS"}}))
    assert tpu.slices == ("a",) and tpu.command == "python train.py" and tpu.setup == ""
    # Thread counts derived for this machine are dropped unless the step set them itself; the
    # attempt number and progress file are set per host and attempt.
    assert tpu.env == {"MARINBUILD_TPU_SLICES": "a", "MKL_NUM_THREADS": "2", "SEED": "1"}


def test_a_function_step_runs_the_worker_with_the_slices_python(tmp_path: Path) -> None:
    tpu = dispatch(tmp_path).tpu_job(job(tmp_path, fn=print))
    assert tpu.command.startswith("/opt/py/bin/python3 -m marinbuild.backends.worker --file Marinfile.py --step train")


def test_the_hang_timeout_is_the_steps_else_the_cluster_files(tmp_path: Path) -> None:
    assert dispatch(tmp_path).tpu_job(job(tmp_path, command="true")).progress_timeout is None
    with_default = dispatch(tmp_path, progress_timeout="15m")
    assert with_default.tpu_job(job(tmp_path, command="true")).progress_timeout == 900.0
    assert with_default.tpu_job(job(tmp_path, command="true", progress_timeout=30.0)).progress_timeout == 30.0


def test_a_step_on_created_slices_gets_a_hang_timeout_unless_one_is_set(tmp_path: Path) -> None:
    cluster = parse_cluster({"gcp": {"project": "my-project", "zone": "us-central2-b"}})
    created = TpuDispatch(cluster, marinfile=str(tmp_path / "Marinfile.py"), prefix=str(tmp_path / "out"), sync=True,
                          console=lambda line: None)
    on_created = job(tmp_path, command="true")
    on_created.env["MARINBUILD_TPU_SLICES"] = "@gcp/0/0"
    assert created.tpu_job(on_created).progress_timeout == CREATED_PROGRESS_TIMEOUT == 1800.0
    assert created.tpu_job(replace(on_created, progress_timeout=60.0)).progress_timeout == 60.0
    assert dispatch(tmp_path).tpu_job(job(tmp_path, command="true")).progress_timeout is None  # static: none


def test_a_steps_state_lasts_across_attempts_and_goes_when_it_ended(tmp_path: Path) -> None:
    (tmp_path / "Marinfile.py").write_text("# the project\n")
    backend = dispatch(tmp_path)
    first = job(tmp_path, command="true")
    step = backend.step(first)
    assert backend.step(job(tmp_path, command="true", attempt=2)) is step
    assert backend.ledger_head(first)["slices"] == [{"name": "a", "tpu_type": "v4-8", "hosts": ["127.0.0.1:1"]}]
    backend.step_ended(first)
    assert backend.step(first) is not step
    assert "0 attempt(s): none finished" in (tmp_path / "step.log").read_text()
    assert not Path(step.staging_dir).exists()
