"""Lease heartbeat and expiry are checked as they are parsed, with sane bounds, in one line.

A heartbeat of ``1e-9`` used to be accepted and fence every step; a bad pair was found only
once something ran. Each case runs the real command line on a Marinfile whose step would
run, and checks that nothing ran and nothing was written.
"""

from __future__ import annotations

import pytest

from marinbuild.errors import UserError
from marinbuild.store.lease_settings import MAX_EXPIRY, MIN_EXPIRY, MIN_HEARTBEAT, LeaseSettings

from .helpers import marinbuild, marinbuild_in_process, write_marinfile

MARINFILE = 'from marinbuild import step\nstep("a", cmd="echo ran > {output}/ran")\n'


@pytest.mark.parametrize(
    ("args", "env", "problem"),
    [
        (["--lease-heartbeat", "1e-9"], {}, "lease heartbeat (1e-09 s) must be at least 0.1 s"),
        (["--lease-heartbeat", "0"], {}, "lease heartbeat must be positive"),
        (["--lease-heartbeat", "nan"], {}, "lease heartbeat must be positive"),
        (["--lease-heartbeat", "-1"], {}, "lease heartbeat must be positive"),
        (["--lease-expiry", "0.5"], {}, "lease expiry (0.5 s) must be at least 1 s"),
        (["--lease-expiry", "1e9"], {}, "lease expiry (1e+09 s) must be at most 3600 s"),
        (["--lease-heartbeat", "5", "--lease-expiry", "6"], {}, "must be at least twice the heartbeat (5 s)"),
        (["--lease-expiry", "6", "--lease-heartbeat", "5"], {}, "must be at least twice the heartbeat (5 s)"),
        (["--lease-heartbeat", "40"], {}, "lease expiry (60 s) must be at least twice the heartbeat (40 s)"),  # the default expiry
        ([], {"MARINBUILD_LEASE_HEARTBEAT": "1e-9"}, "lease heartbeat (1e-09 s) must be at least 0.1 s"),
        ([], {"MARINBUILD_LEASE_HEARTBEAT": "2", "MARINBUILD_LEASE_EXPIRY": "3"}, "at least twice the heartbeat (2 s)"),
    ],
)
def test_out_of_bounds_lease_flags_are_one_line_before_anything_runs(project, args, env, problem):
    write_marinfile(project, MARINFILE)
    for extra in ([], ["-n"]):  # checked as parsed: a dry run refuses them too
        result = marinbuild_in_process("run", *args, *extra, cwd=project, env=env)
        assert result.returncode == 2, result.stdout + result.stderr
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith("marinbuild run: error: Invalid value for '--lease-") and problem in line, line
    assert not (project / "marinbuild-out").exists()


def test_lease_flags_within_bounds_run(project):
    write_marinfile(project, MARINFILE)
    result = marinbuild("run", "--lease-heartbeat", str(MIN_HEARTBEAT), "--lease-expiry", str(MIN_EXPIRY), cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [p.read_text() for p in (project / "marinbuild-out").glob("a-*/ran")] == ["ran\n"]


def test_the_library_holds_the_same_bounds():
    for kw in ({"heartbeat": MIN_HEARTBEAT / 2}, {"expiry": MIN_EXPIRY / 2}, {"expiry": MAX_EXPIRY * 2},
               {"heartbeat": 1, "expiry": 1.5}):
        with pytest.raises(UserError):
            LeaseSettings.resolve(env={}, **kw)
    assert LeaseSettings.resolve(heartbeat=MIN_HEARTBEAT, expiry=MIN_EXPIRY, env={}).heartbeat == MIN_HEARTBEAT
