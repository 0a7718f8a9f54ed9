"""Unit tests of marinbuild.cli.logs: a step's log by attempt and by host, through the command line."""

from __future__ import annotations

from pathlib import Path

from marinbuild.store.step_logs import attempt_header
from tests.helpers import marinbuild, marinbuild_in_process, plan_json, write_marinfile

MARINFILE = """
from marinbuild import step
step("flaky", cmd='echo "try $MARINBUILD_ATTEMPT"; test "$MARINBUILD_ATTEMPT" = 2', max_retries_failure=1)
step("never", cmd="true")
"""


def _lines(result) -> list[str]:  # type: ignore[no-untyped-def]
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_latest_attempt_or_the_one_asked_for(tmp_path: Path) -> None:
    write_marinfile(tmp_path, MARINFILE)
    assert marinbuild("run", "flaky", cwd=tmp_path, env={"MARINBUILD_RETRY_BASE_DELAY": "0.01"}).returncode == 0
    latest = _lines(marinbuild_in_process("logs", "flaky", cwd=tmp_path))
    assert latest[0].startswith("=== marinbuild attempt 2 ") and latest[1:] == ["try 2"]
    first = _lines(marinbuild_in_process("logs", "flaky", "--attempt", "1", cwd=tmp_path))
    assert first[0].startswith("=== marinbuild attempt 1 ") and first[1] == "try 1"
    assert first[2].startswith("marinbuild: attempt 1 failed (exit status 1); failure retry 1 of 1")
    missing = marinbuild_in_process("logs", "flaky", "--attempt", "7", cwd=tmp_path)
    assert missing.returncode != 0 and "no attempt 7 in the logs of flaky; attempts logged: 1, 2" in missing.stderr


def test_a_step_that_never_ran_and_a_glob_of_several_are_one_line(tmp_path: Path) -> None:
    write_marinfile(tmp_path, MARINFILE)
    never = marinbuild_in_process("logs", "never", cwd=tmp_path)
    assert never.returncode != 0 and "no log of step never: it never ran under" in never.stderr
    several = marinbuild_in_process("logs", "*", cwd=tmp_path)
    assert several.returncode != 0 and "names 2 steps; logs shows one" in several.stderr


def test_per_host_logs_of_a_tpu_step(tmp_path: Path) -> None:
    write_marinfile(tmp_path, 'from marinbuild import step\nstep("tpu", cmd="true")\n')
    logs = Path(plan_json(tmp_path)["tpu"]["output_path"]) / "logs"
    logs.mkdir(parents=True)
    for worker, host in ((0, "10.0.0.2"), (1, "10.0.0.3")):
        (logs / f"slice_00_worker_{worker:02d}.log").write_text(attempt_header(1, 0, host, "tpu") + f"hello from {worker}\n")
    both = _lines(marinbuild_in_process("logs", "tpu", cwd=tmp_path))
    assert both[0] == "--- host 10.0.0.2 (slice_00_worker_00) ---" and "hello from 0" in both
    assert "--- host 10.0.0.3 (slice_00_worker_01) ---" in both and both[-1] == "hello from 1"
    one = _lines(marinbuild_in_process("logs", "tpu", "--host", "10.0.0.3", cwd=tmp_path))
    assert one[-1] == "hello from 1" and "hello from 0" not in one
    by_slot = _lines(marinbuild_in_process("logs", "tpu", "--host", "slice_00_worker_00", cwd=tmp_path))
    assert by_slot[-1] == "hello from 0"
    unknown = marinbuild_in_process("logs", "tpu", "--host", "10.9.9.9", cwd=tmp_path)
    assert unknown.returncode != 0 and "hosts: 10.0.0.2, 10.0.0.3, slice_00_worker_00, slice_00_worker_01" in unknown.stderr
