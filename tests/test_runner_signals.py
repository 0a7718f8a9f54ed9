"""SIGTERMs that reach a runner while it stops or exits end it as an interrupt, never as an internal error."""

from __future__ import annotations

import signal

from .helpers import alive, start_marinbuild, wait_dead, wait_for_text, write_marinfile


def test_sigterm_while_the_runner_exits_ends_it_without_a_traceback(project):
    # The Marinfile is Python run inside the runner: its atexit hook holds the runner in
    # interpreter shutdown (where logging's shutdown and thread joins run) until the signal came.
    write_marinfile(
        project,
        """
        import atexit, pathlib, sys, time
        from marinbuild import step

        def _hold_at_exit():
            pathlib.Path("exiting").write_text("yes")
            time.sleep(20)

        if "run" in sys.argv:
            atexit.register(_hold_at_exit)
        step("quick", cmd="echo done > {output}/out")
        """,
    )
    proc = start_marinbuild("run", cwd=project)
    wait_for_text(project / "exiting")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=15)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err and "internal error" not in err, err
    # The run itself had finished; the signal ends the process as SIGTERM does, at once.
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, out, err)


def test_a_second_sigterm_while_the_runner_stops_ends_it_and_its_steps(project):
    write_marinfile(
        project,
        """
        from marinbuild import step
        # Builtins only but `sleep`: a SIGTERM that killed a `$(seq …)` would leave the loop
        # nothing to count, and the shell would end on its own right after its trap.
        step("stubborn", cmd="trap 'echo yes > term.seen' TERM; echo $$ > shell.pid; "
                             "i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done")
        """,
    )
    # A grace no stall of a loaded machine outlasts: the stop is still waiting at the second signal.
    proc = start_marinbuild("run", cwd=project, env={"MARINBUILD_KILL_GRACE": "600"})
    shell = int(wait_for_text(project / "shell.pid"))
    proc.send_signal(signal.SIGTERM)
    wait_for_text(project / "term.seen")  # the stop has begun: the step got its SIGTERM and shrugged it off
    assert alive(shell)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert "Traceback" not in err and "internal error" not in err, err
    # Ended by the second signal, not by finishing the stop (which waits out the step's grace).
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, out, err)
    assert wait_dead(shell, 15)


def test_the_attempt_a_sigkilled_runner_started_keeps_its_number(project):
    # MARINBUILD_ATTEMPT names checkpoints and log folders: the attempt a SIGKILLed runner started
    # (never recorded in attempts.json) must not lend its number to the next run's attempt.
    import json
    from pathlib import Path

    from .helpers import marinbuild, plan_json

    write_marinfile(project, """
        from marinbuild import step
        step("train", cmd='echo $MARINBUILD_ATTEMPT >> {output}/seen; '
                          '[ -e {output}/go ] || {{ echo up > {output}/started; sleep 120; }}')
    """)
    out = Path(plan_json(project)["train"]["output_path"])
    runner = start_marinbuild("run", cwd=project)
    try:
        wait_for_text(out / "started")
    finally:
        runner.send_signal(signal.SIGKILL)
        runner.communicate()
    (out / "go").touch()
    again = marinbuild("run", cwd=project)
    assert again.returncode == 0, again.stdout + again.stderr
    assert (out / "seen").read_text().split() == ["1", "2"]
    assert [a["attempt"] for a in json.loads((out / "attempts.json").read_text())["attempts"]] == [2]
