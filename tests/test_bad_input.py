"""Bad input: exit 2, one line naming the problem, nothing written."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from .helpers import marinbuild, marinbuild_in_process, snapshot, write_marinfile

CASES = {
    "syntax": ("step(\n", "Marinfile.py:1: syntax error"),
    "exception": ("from marinbuild import step\nx = 1\nraise RuntimeError('nope')\n", "Marinfile.py:3: RuntimeError: nope"),
    "cycle": (
        "from marinbuild import step\ncfg = {}\na = step('a', cmd='true', config=cfg)\nb = step('b', cmd='true', config={'a': a})\ncfg['b'] = b\n",
        "cycle",
    ),
    "duplicate": (
        "from marinbuild import step, versioned\nstep('a', cmd='true', config={'v': versioned(1)})\nstep('a', cmd='true', config={'v': versioned(2)})\n",
        "two different steps are named 'a'",
    ),
    "unhashable": (
        "from marinbuild import step, versioned\nstep('a', cmd='true', config={'f': versioned(lambda: 1)})\n",
        "step 'a': versioned field 'f'",
    ),
    "empty_name": ("from marinbuild import step\nstep('', cmd='true')\n", "Marinfile.py:2: step name must be a non-empty string"),
    "absolute_name": ("from marinbuild import step\nstep('/etc/x', cmd='true')\n", "must be relative"),
    "dotdot_name": ("from marinbuild import step\nstep('a/../b', cmd='true')\n", "must not contain '..'"),
    "template": ("from marinbuild import step\nstep('a', cmd='echo {nope}', config={'yes': 1})\n", "names {nope}"),
}


def _refused_in_one_line(result, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("marinbuild: error:"), result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["run", "plan"])
def test_bad_marinfile(project, case, command):
    body, expected = CASES[case]
    write_marinfile(project, body)
    (project / "marinbuild-out").mkdir()
    before = snapshot(project)
    _refused_in_one_line(marinbuild_in_process(command, cwd=project), expected)
    assert snapshot(project) == before


@pytest.mark.parametrize("case", ["syntax", "exception", "cycle"])
def test_bad_marinfile_in_a_fresh_process(project, case):
    """As :func:`test_bad_marinfile`, for the exit status and stderr of a real ``marinbuild`` process."""
    body, expected = CASES[case]
    write_marinfile(project, body)
    (project / "marinbuild-out").mkdir()
    before = snapshot(project)
    _refused_in_one_line(marinbuild("run", cwd=project), expected)
    assert snapshot(project) == before


def test_missing_marinfile(project):
    result = marinbuild("run", cwd=project)
    assert result.returncode == 2
    assert "no Marinfile at" in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_unknown_target_suggests_close_names(project):
    write_marinfile(project, "from marinbuild import step\nstep('train_model', cmd='true')\n")
    result = marinbuild("run", "train_modle", cwd=project)
    assert result.returncode == 2
    assert "no step named 'train_modle'; did you mean train_model?" in result.stderr
    assert not (project / "marinbuild-out").exists()


def test_verbose_shows_traceback(project):
    write_marinfile(project, "raise RuntimeError('nope')\n")
    result = marinbuild_in_process("plan", "-v", cwd=project)
    assert result.returncode == 2 and "Traceback" in result.stderr


def test_usage_error_exits_2(project):
    result = marinbuild_in_process("plan", "--dag", "png", cwd=project)
    assert result.returncode == 2


@pytest.mark.parametrize(
    "args, expected",
    [
        (["plan", "--no-such-flag"], "marinbuild plan: error: No such option: --no-such-flag"),
        (["why"], "marinbuild why: error: Missing argument 'targets'"),
        (["run", "--jobs=x"], "marinbuild run: error: Invalid value for '-j'"),
        (["frobnicate"], "marinbuild: error: No such command 'frobnicate'"),
        (["plan", "--prefix", "gs://"], "names no bucket or folder"),
        (["plan", "--prefix", "gs:/b/x"], "prefix 'gs:/b/x' is not a URL (one slash missing?): write gs://b/x"),
        (["run", "--prefix", "gs:b/x"], "prefix 'gs:b/x' is not a URL (two slashes missing?): write gs://b/x"),
        (["run", "--prefix", "gcs://b/x"], "marinbuild names GCS prefixes gs://; write gs://b/x"),
        (["run", "--prefix", "gs:///x"], "prefix 'gs:///x' names no bucket (e.g. gs://bucket/x)"),
        (["status", "--prefix", "s3:/b"], "prefix 's3:/b' is not a URL (one slash missing?): write s3://b"),
        (["plan", "--prefix", "nosuchproto://x"], "Protocol not known: nosuchproto"),
        (["run", "--mem", "4zz"], "cannot read memory size '4zz'"),
        (["run", "--walltime", "soon"], "cannot read duration 'soon'"),
    ],
)
def test_usage_and_option_errors_are_one_line(project, args, expected):
    # In this process; test_usage_error_exits_2 and those around it run real ones.
    _one_line_usage_error(project, marinbuild_in_process, args, expected)


def _one_line_usage_error(project, run, args, expected):  # type: ignore[no-untyped-def]
    """``run`` (in this process or a fresh one) exits 2 with one line naming the problem, writing nothing."""
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='true')\n")
    before = snapshot(project)
    result = run(*args, cwd=project)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert snapshot(project) == before


@pytest.mark.parametrize("args, expected", [
    (["plan", "--no-such-flag"], "marinbuild plan: error: No such option: --no-such-flag"),
    (["run", "--prefix", "gcs://b/x"], "marinbuild names GCS prefixes gs://; write gs://b/x"),
])
def test_usage_and_option_errors_are_one_line_from_a_fresh_process(project, args, expected):
    _one_line_usage_error(project, marinbuild, args, expected)


# -- a prefix that is full or read-only -----------------------------------------------------


def _private_tmpfs_works() -> bool:
    """Whether this machine lets a test mount a tmpfs in a mount namespace of its own."""
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"], capture_output=True)
    return probe.returncode == 0


@pytest.fixture
def private_tmpfs() -> None:
    """The test mounts a tmpfs in a mount namespace of its own (skipped where it cannot; failed under strict CI)."""
    if not _private_tmpfs_works():
        from .helpers import missing_tool

        missing_tool("cannot mount a private tmpfs here (unshare -rm)")


def _in_small_prefix(project, script: str, size: str = "256k"):  # type: ignore[no-untyped-def]
    """Run ``script`` (sh) with a fresh tmpfs of ``size`` mounted at ``$P``, in a private mount namespace."""
    import subprocess
    import sys

    from .helpers import cli_env

    prefix = project / "small-prefix"
    prefix.mkdir()
    env = cli_env({"P": str(prefix), "MB": f"{sys.executable} -m marinbuild"})
    return subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={size} tmpfs "$P" && {script}'],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )


@pytest.mark.usefixtures("private_tmpfs")
def test_a_full_prefix_fails_the_step_naming_the_path_and_leaves_it_not_running(project):
    write_marinfile(project, "from marinbuild import step\nstep('fill', cmd='cat /dev/zero > {output}/fill 2>/dev/null; true')\n")
    result = _in_small_prefix(
        project,
        '$MB run --prefix "$P" > "$P.out" 2> "$P.err"; echo "rc=$?"; cat "$P.out" "$P.err"; '
        'echo; echo "status: $(cat "$P"/fill-*/.marinbuild/status 2>/dev/null || echo none)"',
    )
    out = result.stdout
    assert "rc=1" in out, out + result.stderr
    assert "internal error" not in out and "Traceback" not in out, out
    assert "FAILED fill: could not record SUCCESS in " in out and "No space left on device" in out, out
    assert str(project / "small-prefix") in out.split("FAILED fill:", 1)[1].splitlines()[0]
    status = out.rsplit("status: ", 1)[1].strip()
    assert "RUNNING" not in status, status  # FAILED if it fit, else no status at all


@pytest.mark.usefixtures("private_tmpfs")
def test_a_read_only_prefix_is_one_line_naming_it(project):
    write_marinfile(project, "from marinbuild import step\nstep('a', cmd='echo a > {output}/a.txt')\n")
    result = _in_small_prefix(
        project,
        '$MB run --prefix "$P" -q >/dev/null && mount -o remount,ro "$P" && '
        'cp "$P"/a-*/.marinbuild/status "$P.before"; '
        '$MB run --prefix "$P" --force a > "$P.out" 2> "$P.err"; echo "rc=$?"; '
        'echo "stderr: $(cat "$P.err")"; cmp "$P.before" "$P"/a-*/.marinbuild/status && echo unchanged',
    )
    out = result.stdout
    assert "rc=2" in out, out + result.stderr
    stderr = out.split("stderr: ", 1)[1].split("\n")
    assert stderr[0].startswith("marinbuild: error: ") and str(project / "small-prefix") in stderr[0], out
    assert "internal error" not in out and "Traceback" not in out
    assert out.strip().endswith("unchanged")  # still the earlier SUCCESS: nothing half-written


def test_two_partials_of_one_function_with_different_arguments_under_one_name_are_an_error(tmp_path: Path) -> None:
    write_marinfile(tmp_path, """
        import functools
        from marinbuild import step, versioned, this_output_path

        def write(cfg, word):
            open(cfg["output"] + "/" + word, "w").write(word)

        step("a", functools.partial(write, word="first"), {"n": versioned(1), "output": this_output_path()})
        step("a", functools.partial(write, word="second"), {"n": versioned(1), "output": this_output_path()})
    """)
    done = marinbuild("run", "--prefix", str(tmp_path / "out"), cwd=tmp_path)
    # One of them silently never ran: only "first" was written.
    assert done.returncode == 2, done.stdout + done.stderr + textwrap.shorten(str(list((tmp_path / "out").rglob("*"))), 300)
    assert done.stderr.startswith("marinbuild: error: ") and done.stderr.count("\n") == 1, done.stderr
    assert "'a'" in done.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("first"))
