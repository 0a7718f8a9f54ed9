"""The gang's launch script: the progress file set per host.

Running a gang against real hosts is the business of tests/test_ssh_gang.py and tests/test_hangs.py.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from marinbuild.backends.tpu.attempt_logs import AttemptLogs
from marinbuild.backends.tpu.cluster import SshSettings
from marinbuild.backends.tpu.gang import TOKEN_VAR, Gang, HostPlan
from marinbuild.backends.tpu.ssh import resolve_target


def test_every_host_gets_its_own_progress_file_in_its_attempt_directory(tmp_path: Path) -> None:
    settings = SshSettings(remote_workdir="/srv/mb")
    plan = HostPlan("a", 0, 0, "h0", resolve_target("127.0.0.1:1", settings), settings,
                    {TOKEN_VAR: "tok-a1-s0-w0", "MARINBUILD_PROGRESS": "/runner/local/progress"})
    gang = Gang([plan], command="true", logs=AttemptLogs(str(tmp_path), tmp_path / "staging"), progress_timeout=5.0)
    script = gang._launch_script(gang.hosts[0])
    # The runner's own path is exported first, then replaced by the host's, inside the attempt directory.
    runner_at = script.index("MARINBUILD_PROGRESS=" + shlex.quote("/runner/local/progress"))
    host_at = script.index('export MARINBUILD_PROGRESS="$att/progress"')
    assert runner_at < host_at
    assert "att=/srv/mb/attempts/tok-a1-s0-w0" in script


