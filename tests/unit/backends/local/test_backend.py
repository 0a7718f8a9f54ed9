"""The local backend (marinbuild.backends.local.backend): real steps, each with its own sentinel."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from marinbuild.backends.base import Job, Outcome
from marinbuild.backends.local.backend import KILL_GRACE, LocalBackend, kill_grace
from marinbuild.backends.local.fence import PORTABLE, find_shell
from marinbuild.store.errors import UserError
from tests.helpers import REPO, wait_dead


def _in_a_fresh_interpreter(body: Callable[[Path], None], tmp_path: Path) -> None:
    """Run ``body``, whose function steps fork this process, in a new interpreter.

    A pytest worker may hold gRPC's threads, started by an earlier test's ``gs://`` client, and
    gRPC's at-fork handlers then close and remake descriptors of the process forking. A runner
    holding gRPC never forks its function steps (``marinbuild.backends.environments``); this
    backend alone, as tested here, would.
    """
    code = (f"import sys; from pathlib import Path; from {body.__module__} import {body.__name__} as body; "
            "body(Path(sys.argv[1]))")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_function_step_starts_its_sentinel_before_it_runs(tmp_path: Path) -> None:
    _in_a_fresh_interpreter(_a_function_step_starts_its_sentinel_before_it_runs, tmp_path)


def test_a_steps_env_cannot_replace_its_token(tmp_path: Path) -> None:
    _in_a_fresh_interpreter(_a_steps_env_cannot_replace_its_token, tmp_path)


def test_a_function_steps_sentinel_runs_under_the_backends_shell(tmp_path: Path) -> None:
    _in_a_fresh_interpreter(_a_function_steps_sentinel_runs_under_the_backends_shell, tmp_path)


def _run(job: Job, backend: LocalBackend | None = None) -> Outcome:
    done = threading.Event()
    result: list[Outcome] = []

    def on_done(outcome: Outcome) -> None:
        result.append(outcome)
        done.set()

    (backend or LocalBackend()).start(job, on_done)
    assert done.wait(60), "the step never ended"
    return result[0]


def _job(tmp_path: Path, **kw: object) -> Job:
    return Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "log.txt"),
               workdir=str(tmp_path), env={}, **kw)  # type: ignore[arg-type]


def test_a_shell_step_runs_behind_its_gate_with_its_sentinel_in_its_group(tmp_path):
    # The sentinel runs `sleep` for the lease's time only where there is a lease; here it
    # holds the pipe alone. It is in the step's group: the step sees it there.
    outcome = _run(_job(tmp_path, command="ps -ww -o pgid= -o args= -g $(ps -o pgid= -p $$) > group.txt; echo ok"))
    assert outcome.ok, outcome.error
    group = (tmp_path / "group.txt").read_text()
    assert "HUP INT TERM" in group, group  # the sentinel's loop, beside the step
    assert (tmp_path / "log.txt").read_text() == "ok\n"


def test_what_a_step_left_in_its_group_without_its_environment_dies_when_it_ends(tmp_path):
    outcome = _run(_job(tmp_path, command="env -i /bin/sleep 300 & echo $! > left.pid"))
    assert outcome.ok, outcome.error
    assert wait_dead(int((tmp_path / "left.pid").read_text()), 20)


def _group_fellows() -> list[int]:
    """The other processes in the calling process's group."""
    pgid, fellows = os.getpgid(0), []
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != os.getpid():
            try:
                if os.getpgid(int(name)) == pgid:
                    fellows.append(int(name))
            except OSError:
                continue
    return fellows


def _sentinel_among(pids: list[int]) -> int | None:
    # posix_spawn returns once the sentinel's exec has replaced its memory, which is before
    # the kernel fills in its command line: poll that, the process itself was there already.
    for _ in range(1000):
        for pid in pids:
            try:
                if b"step-fence" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        time.sleep(0.01)
    return None


def _a_function_step_starts_its_sentinel_before_it_runs(tmp_path: Path) -> None:
    def fn(config: object) -> None:
        fellows = _group_fellows()  # taken first: the sentinel is there before the step runs
        Path("sentinel.txt").write_text(str(_sentinel_among(fellows)))

    outcome = _run(_job(tmp_path, fn=fn))
    assert outcome.ok, outcome.error
    assert (tmp_path / "sentinel.txt").read_text().isdigit()


def test_a_failing_step_says_its_exit_status(tmp_path):
    outcome = _run(_job(tmp_path, command="exit 3"))
    assert not outcome.ok and outcome.returncode == 3 and outcome.error == "exit status 3"



def _token_into_file(config: dict[str, str]) -> None:
    Path(config["file"]).write_text(os.environ.get("MARINBUILD_STEP_TOKEN", ""))


def _a_steps_env_cannot_replace_its_token(tmp_path: Path) -> None:
    # The token is how a step's leftovers are found; shell and function steps alike keep it.
    env = {"MARINBUILD_STEP_TOKEN": "forged"}
    shell = _run(Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "log.txt"),
                     workdir=str(tmp_path), env=env, command='printf %s "$MARINBUILD_STEP_TOKEN" > sh.txt'))
    function = _run(Job(name="s", output_path=str(tmp_path / "out"), log_file=str(tmp_path / "log.txt"),
                        workdir=str(tmp_path), env=env, fn=_token_into_file,
                        config={"file": str(tmp_path / "fn.txt")}))
    assert shell.ok and function.ok, (shell.error, function.error)
    tokens = {(tmp_path / "sh.txt").read_text(), (tmp_path / "fn.txt").read_text()}
    assert len(tokens) == 1 and "forged" not in tokens and tokens != {""}


def test_shell_steps_run_under_bash_where_it_is_found_and_under_sh_when_told(tmp_path):
    command = "readlink /proc/$$/exe > exe.txt; ps -ww -o args= -g $(ps -o pgid= -p $$) > group.txt"
    found = find_shell()
    outcome = _run(_job(tmp_path, command=command))
    assert outcome.ok, outcome.error
    assert (tmp_path / "exe.txt").read_text().strip() == os.path.realpath(found.path)
    portable = tmp_path / "portable"
    portable.mkdir()
    outcome = _run(_job(portable, command=command), LocalBackend(shell=PORTABLE))
    assert outcome.ok, outcome.error
    assert (portable / "exe.txt").read_text().strip() == os.path.realpath("/bin/sh")
    assert "HUP INT TERM" in (portable / "group.txt").read_text()


def _sentinel_exe(config: dict[str, str]) -> None:
    sentinel = _sentinel_among(_group_fellows())
    Path(config["file"]).write_text(os.readlink(f"/proc/{sentinel}/exe") if sentinel else "no sentinel")


def _a_function_steps_sentinel_runs_under_the_backends_shell(tmp_path: Path) -> None:
    for shell in (find_shell(), PORTABLE):
        folder = tmp_path / str(shell.bash)
        folder.mkdir()
        outcome = _run(_job(folder, fn=_sentinel_exe, config={"file": str(folder / "exe.txt")}), LocalBackend(shell=shell))
        assert outcome.ok, outcome.error
        assert (folder / "exe.txt").read_text() == os.path.realpath(shell.path)


def test_the_kill_grace_is_the_variable_or_the_default_and_refuses_what_is_not_seconds():
    assert kill_grace({}) == KILL_GRACE == 3.0
    assert kill_grace({"MARINBUILD_KILL_GRACE": " "}) == KILL_GRACE
    assert kill_grace({"MARINBUILD_KILL_GRACE": "0"}) == 0.0
    assert kill_grace({"MARINBUILD_KILL_GRACE": "2.5"}) == 2.5
    assert kill_grace({"MARINBUILD_KILL_GRACE": "3600"}) == 3600.0
    for bad in ("-0.5", "3600.5", "inf", "nan", "ten", "1s"):
        try:
            kill_grace({"MARINBUILD_KILL_GRACE": bad})
        except UserError as e:
            assert str(e) == f"MARINBUILD_KILL_GRACE={bad!r} must be seconds from 0 to 3600"
        else:
            raise AssertionError(f"{bad!r} was taken")
