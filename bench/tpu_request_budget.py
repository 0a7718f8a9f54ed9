"""Count the TPU API requests of steps waiting for capacity and of running steps watching their nodes.

Starts the TPU API emulator (loopback, the real google-cloud-tpu client over REST) with hosts
that never free up, so every step waits; ``--steps`` providers wait at once for ``--polls``
polls each, first sharing the run's :class:`~marinbuild.backends.tpu.polling.ZoneBoard` (as
``marinbuild run`` does), then each asking for its own queued resource (as before it). Then
``--steps`` steps on ACTIVE slices look for lost nodes ``--polls`` times each, sharing the
board's lists of queued resources and nodes (as a running gang's watch does), then each
asking for its queued resource and every node by name. Polls are scaled down to ``--poll``
seconds; the per-minute figures are for the real intervals, 30 s waiting and 45 s running::

    python -m bench.tpu_request_budget                   # 50 steps, 20 polls
    python -m bench.tpu_request_budget --steps 200 --page-size 100 --json /tmp/budget.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path

from marinbuild.backends.tpu.activation import CapacityUnavailable, ProvisionCancelled
from marinbuild.backends.tpu.cluster import parse_cluster
from marinbuild.backends.tpu.polling import ZoneBoard
from marinbuild.backends.tpu.provision import SliceProvider
from marinbuild.backends.tpu.provision_request import ProvisionRequest
from marinbuild.backends.tpu.tpu_api import TpuApi
from tests.tpu_api_emulator import EmulatedHost, TpuApiEmulator

REAL_POLL_S = 30.0
REAL_RUNNING_POLL_S = 45.0


def _measure(emulator: TpuApiEmulator, key_dir: Path, steps: int, polls: int, poll: float, shared: bool) -> dict[str, float]:
    (key_dir / "id.pub").write_text("ssh-ed25519 AAAAPUBLIC bench@here\n")
    table = {"project": "bench-project", "zone": "us-central2-b", "api_endpoint": emulator.endpoint,
             "provision_timeout": 3600}
    cluster = parse_cluster({"ssh": {"user": "bench", "identity_file": str(key_dir / "id")}, "gcp": table})
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    board = ZoneBoard(api, interval=poll) if shared else None
    cancel = threading.Event()
    providers = [
        SliceProvider(api, cluster, ProvisionRequest(f"s{i}", f"/bench/s{i}-00ff", "/bench", "v4-8", 1), poll=poll,
                      board=board)
        for i in range(steps)
    ]

    def wait(p: SliceProvider) -> None:
        try:
            p.acquire(cancel)
        except (ProvisionCancelled, CapacityUnavailable):
            pass

    threads = [threading.Thread(target=wait, args=(p,), daemon=True) for p in providers]
    for t in threads:
        t.start()
    while len(emulator.queued_resource_names()) < steps:
        time.sleep(0.01)
    start = len(emulator.log)
    time.sleep(polls * poll)
    window = emulator.log[start:]
    cancel.set()
    for t in threads:
        t.join()
    waiting = [r for r in window if r[0] == "GET" and "/queuedResources" in r[1]]
    per_poll = len(waiting) / polls
    return {"steps": steps, "requests_per_poll": round(per_poll, 2),
            "requests_per_minute_at_30s": round(per_poll * 60 / REAL_POLL_S, 1)}


def _measure_running(emulator: TpuApiEmulator, key_dir: Path, steps: int, polls: int, poll: float,
                     shared: bool) -> dict[str, float]:
    (key_dir / "id.pub").write_text("ssh-ed25519 AAAAPUBLIC bench@here\n")
    table = {"project": "bench-project", "zone": "us-central2-b", "api_endpoint": emulator.endpoint,
             "provision_timeout": 3600}
    cluster = parse_cluster({"ssh": {"user": "bench", "identity_file": str(key_dir / "id")}, "gcp": table})
    assert cluster.gcp is not None
    api = TpuApi(cluster.gcp)
    board = ZoneBoard(api, interval=poll)
    providers = [
        SliceProvider(api, cluster, ProvisionRequest(f"r{i}", f"/bench/r{i}-00ff", "/bench", "v4-8", 2), poll=poll,
                      board=board, probe=lambda entry, spec, keys: None)
        for i in range(steps)
    ]
    cancel = threading.Event()
    for p in providers:
        p.acquire(cancel)
    start = len(emulator.log)
    for _ in range(polls):
        for p in providers:
            assert p.lost(shared=shared) == ()
        time.sleep(poll)
    window = emulator.log[start:]
    for p in providers:
        p.release()
    asked = [r for r in window if r[0] == "GET"]
    per_poll = len(asked) / polls
    return {"steps": steps, "requests_per_poll": round(per_poll, 2),
            "requests_per_minute_at_45s": round(per_poll * 60 / REAL_RUNNING_POLL_S, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--polls", type=int, default=20)
    ap.add_argument("--poll", type=float, default=0.2, help="the scaled-down poll interval, seconds")
    ap.add_argument("--page-size", type=int, default=0, help="items per list page (0: the API's default, all)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    never_free = [EmulatedHost("10.255.0.1", "ssh-ed25519 AAAA", lambda: None, lambda: None, lambda: False)]
    results = {}
    for shared in (True, False):
        with TpuApiEmulator(never_free, waiting_s=0.0) as emulator, tempfile.TemporaryDirectory() as tmp:
            emulator.page_size = args.page_size
            results["shared" if shared else "per_step"] = _measure(emulator, Path(tmp), args.steps, args.polls,
                                                                    args.poll, shared)
    for name, r in results.items():
        print(f"{name:9s} {r['steps']} waiting steps: {r['requests_per_poll']} requests a poll, "
              f"{r['requests_per_minute_at_30s']} a minute at a 30 s poll")
    free = [EmulatedHost(f"10.254.{i // 250}.{i % 250 + 1}", "ssh-ed25519 AAAA", lambda: None, lambda: None)
            for i in range(2 * args.steps)]
    for shared in (True, False):
        with TpuApiEmulator(free, waiting_s=0.0) as emulator, tempfile.TemporaryDirectory() as tmp:
            emulator.page_size = args.page_size
            name = "running_shared" if shared else "running_per_step"
            results[name] = r = _measure_running(emulator, Path(tmp), args.steps, args.polls, args.poll, shared)
        print(f"{name:16s} {r['steps']} running steps (2 nodes each): {r['requests_per_poll']} requests a poll, "
              f"{r['requests_per_minute_at_45s']} a minute at a 45 s poll")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
