"""Starting processes through libc's posix_spawn without the GIL, and the fallback."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from marinbuild.backends.local import spawn as spawn_module
from marinbuild.backends.local.spawn import Environment, spawn


@pytest.fixture(params=["libc", "os.posix_spawn"])
def implementation(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "libc":
        if spawn_module._libc is None:
            pytest.fail("this machine's libc should be usable through ctypes (glibc 2.26 or later)")
    else:
        monkeypatch.setattr(spawn_module, "_libc", None)
    return str(request.param)


def _run(script: str, env: Environment, extra: dict[str, str] | None = None, **kwargs: object) -> tuple[str, int]:
    r, w = os.pipe()
    try:
        pid = spawn("/bin/sh", ["/bin/sh", "-c", script], env, extra, dup2s=[(w, 1), (w, 2)], **kwargs)  # type: ignore[arg-type]
    finally:
        os.close(w)
    with os.fdopen(r, "rb") as f:
        out = f.read().decode()
    _, status = os.waitpid(pid, 0)
    return out, os.waitstatus_to_exitcode(status)


def test_environment_overrides_and_additions(implementation: str) -> None:
    env = Environment({"PATH": os.environ["PATH"], "KEEP": "base", "OVER": "base"})
    out, code = _run('echo "$KEEP $OVER $NEW"; env | grep -c "^OVER="', env, {"OVER": "step", "NEW": "x y"})
    assert code == 0
    assert out.splitlines() == ["base step x y", "1"]


def test_environment_is_encoded_once_and_not_changed_by_a_spawn() -> None:
    env = Environment({"A": "1"})
    assert env.entries({"A": "2", "B": "3"}) == [b"A=2", b"B=3"]
    assert env.entries({}) == [b"A=1"]


def test_opens_dup2s_session_and_signals(implementation: str, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("from stdin\n")
    env = Environment({"PATH": os.environ["PATH"]})
    # Inherited as ignored, a signal stays ignored through exec unless reset.
    previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    try:
        out, code = _run(
            # grep reads its own status: exec keeps the shell's mask and ignored signals, and
            # the shell's own status would show what dash blocks while it waits for a child.
            "read line; echo \"$line\"; ps -o sid=,pgid= -p $$; exec grep -E '^Sig(Blk|Ign)' /proc/self/status",
            env, opens=[(0, str(source), os.O_RDONLY)], setsid=True, default_signals=[signal.SIGUSR1],
        )
    finally:
        signal.signal(signal.SIGUSR1, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "from stdin"
    sid, pgid = lines[1].split()
    assert sid == pgid  # a session (and process group) of its own
    masks = dict(line.split(":") for line in lines[2:])
    assert int(masks["SigBlk"], 16) == 0  # nothing blocked, whatever the spawning thread blocks
    assert not int(masks["SigIgn"], 16) & (1 << (signal.SIGUSR1 - 1))


def test_a_missing_program_is_an_oserror_naming_it(implementation: str, tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-program")
    with pytest.raises(OSError) as raised:
        spawn(missing, [missing], Environment({}))
    assert raised.value.errno == 2 and missing in str(raised.value)
