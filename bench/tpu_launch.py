"""Time the TPU backend on fake SSH hosts: launch latency (16 hosts vs 1) and teardown after a failure.

Runs real sshd processes on 127.0.0.2 upwards (the test fixture's code), so it needs
``openssh-server`` and root (sshd's privilege separation)::

    python -m bench.tpu_launch                 # 5 repeats, 16 hosts
    python -m bench.tpu_launch --repeats 9 --hosts 16 --json /tmp/tpu_launch.json

Launch latency is the time from calling ``run_tpu_step`` until the last host's command
has started (each host records its own start time).  Teardown is the time from one host
exiting 1 to ``run_tpu_step`` returning with every other host's processes gone.  All fake
hosts share this machine's cores, so the CPU their sshd spend is printed beside ours: on
a real cluster each host brings its own.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from marinbuild.backends.tpu.attempts import TpuJob, run_tpu_step
from marinbuild.backends.tpu.cluster import load_cluster
from tests.fixtures_ssh import FakeFleet, start_fleet, stop_fleet

# tpu types whose VM count matches the host counts measured here
_TYPES = {1: "v4-8", 2: "v4-16", 4: "v4-32", 8: "v4-64", 16: "v4-128", 32: "v4-256"}


def _run(fleet: FakeFleet, work: Path, n: int, command: str, workdir: str | None = None) -> tuple[float, Path, object]:
    out = work / f"out-{time.monotonic_ns()}"
    out.mkdir()
    cluster = load_cluster(fleet.write_cluster(work / "cluster.toml", [("s", _TYPES[n], list(range(n)))]))
    job = TpuJob(name="bench", output_path=str(out), command=command, slices=("s",))
    t0 = time.time()
    result = run_tpu_step(job, cluster, workdir=workdir, cancel=threading.Event(), console=lambda s: None)
    return t0, out, result


def _sshd_cpu(fleet: FakeFleet) -> float:
    """CPU seconds the fake hosts' sshd processes and their finished sessions have used."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for h in fleet.hosts:
        if h.proc is not None:
            fields = Path(f"/proc/{h.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(f) for f in fields[11:15])  # utime stime cutime cstime
    return total / tick


def launch_latency(fleet: FakeFleet, work: Path, n: int, workdir: str | None) -> tuple[float, float, float, float]:
    """Seconds until the last host started, for the whole trivial step, and the CPU
    seconds spent by marinbuild (this process) and by the fake hosts' sshd."""
    cpu0, sshd0 = time.process_time(), _sshd_cpu(fleet)
    t0, out, result = _run(fleet, work, n, 'date +%s.%N > "$MARINBUILD_OUTPUT/start_$MARINBUILD_PROCESS_ID"', workdir)
    total = time.time() - t0
    assert getattr(result, "status", None) == "SUCCESS", result
    starts = [float((out / f"start_{i}").read_text()) for i in range(n)]
    return max(starts) - t0, total, time.process_time() - cpu0, _sshd_cpu(fleet) - sshd0


def teardown_after_failure(fleet: FakeFleet, work: Path, n: int) -> tuple[float, float]:
    """(seconds from the failure to the run returning, the gang's own teardown seconds)."""
    command = (
        'if [ "$MARINBUILD_PROCESS_ID" = 1 ]; then sleep 2; date +%s.%N > "$MARINBUILD_OUTPUT/failed"; exit 1; fi; '
        "exec sleep 3999"
    )
    _, out, result = _run(fleet, work, n, command)
    returned = time.time()
    ps = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    left = [ln for ln in ps.splitlines() if "sleep 3999" in ln and not ln.startswith("Z")]
    assert not left, left
    assert getattr(result, "status", None) == "FAILED", result
    attempt = result.attempts[0]  # type: ignore[attr-defined]
    return returned - float((out / "failed").read_text()), attempt.teardown_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=16, choices=sorted(_TYPES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    repo = Path(__file__).resolve().parent.parent
    results: dict[str, object] = {"hosts": args.hosts, "repeats": args.repeats}
    with tempfile.TemporaryDirectory(prefix="marinbuild-bench-tpu-") as tmp:
        work = Path(tmp)
        fleet = start_fleet(args.hosts, work / "fleet")
        try:
            launch_latency(fleet, work, 1, None)  # warm-up: imports, key loading
            for label, workdir in (("no sync", None), ("sync examples/tpu", str(repo / "examples" / "tpu"))):
                rows = {}
                for n in (1, args.hosts):
                    samples = [launch_latency(fleet, work, n, workdir) for _ in range(args.repeats)]
                    rows[n] = tuple(statistics.median(s[i] for s in samples) for i in range(4))
                ratio = rows[args.hosts][0] / rows[1][0]
                one, many = rows[1], rows[args.hosts]
                print(
                    f"launch ({label}): 1 host {one[0] * 1000:.0f} ms, {args.hosts} hosts {many[0] * 1000:.0f} ms, "
                    f"ratio {ratio:.2f}x; whole step {one[1] * 1000:.0f} / {many[1] * 1000:.0f} ms; "
                    f"CPU marinbuild {one[2] * 1000:.0f} / {many[2] * 1000:.0f} ms, "
                    f"fake hosts' sshd {one[3] * 1000:.0f} / {many[3] * 1000:.0f} ms"
                )
                results[f"launch {label}"] = {
                    "1": dict(zip(("launch_s", "step_s", "client_cpu_s", "sshd_cpu_s"), one, strict=True)),
                    str(args.hosts): dict(zip(("launch_s", "step_s", "client_cpu_s", "sshd_cpu_s"), many, strict=True)),
                    "ratio": ratio,
                }
            tears = [teardown_after_failure(fleet, work, args.hosts) for _ in range(max(1, args.repeats // 2))]
            to_return = statistics.median(t[0] for t in tears)
            gang = statistics.median(t[1] for t in tears)
            print(
                f"teardown ({args.hosts} hosts): failure -> all killed and run returned {to_return * 1000:.0f} ms "
                f"(kill + survivor check {gang * 1000:.0f} ms)"
            )
            results["teardown"] = {"failure_to_return_s": to_return, "gang_teardown_s": gang}
        finally:
            stop_fleet(fleet)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
