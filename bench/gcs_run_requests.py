"""Requests per step of a real ``marinbuild run`` of N trivial steps on ``gs://``, by kind.

Starts ``gcp-storage-emulator`` on loopback, runs N independent ``true`` steps with
``marinbuild run -j 4`` and sorts the emulator's log by what each request touched (lease,
status marker, summary entry, info JSON, log, attempt ledger...). ``--round-trips`` instead
times a run of one step with and without a proxy that adds ``--delay`` seconds to every
request: the difference over the delay is how many round trips lie one after another on
the path of a run (the plan's listings included). The emulator ignores
generation preconditions, so there a lease write is checked by reading it back after a
pause (see docs/leases.md); on GCS the same write is one request. ``--compare DIR`` runs
another checkout (e.g. an older commit from ``git archive``) the same way first.

    python -m bench.gcs_run_requests -n 1000
    python -m bench.gcs_run_requests -n 200 --compare /tmp/before --json bench/results/gcs_run_requests.json
    python -m bench.gcs_run_requests -n 200 -j 8 --delay 0.05 --compare /tmp/before
    python -m bench.gcs_run_requests --round-trips --delay 0.2 --compare /tmp/before
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency_proxy import start_proxy
from tests.fixtures_gcs import start_emulator

ROOT = Path(__file__).resolve().parent.parent
_LINE = re.compile(r'"(GET|POST|PUT|PATCH|DELETE) (\S*)')


def kind_of(method: str, url: str) -> str:
    """What a request touched, from its method and URL."""
    if "/upload/" in url:
        return f"{method} upload (lease, marker, summary entry, info, log, ledger)"
    if "delimiter=" in url or ("/o?" in url and "prefix=" in url):
        return f"{method} listing"
    parts = re.sub(r"\?.*", "", url).split("%2F")
    name = parts[-1]
    if "@" in name or (len(parts) > 1 and "@" in parts[-2]):
        name = "summary entry"
    elif name.startswith("precondition-probe"):
        name = "precondition probe (once)"
    return f"{method} {name}"


def run_once(root: Path, n: int, workdir: Path, jobs: int, delay: float = 0.0) -> dict[str, Any]:
    emulator = start_emulator(workdir / f"emu-{root.name}")
    proxy = start_proxy(emulator.endpoint, delay) if delay else None
    try:
        wf = workdir / f"wf-{root.name}"
        wf.mkdir()
        (wf / "Marinfile.py").write_text(
            f"from marinbuild import step\n\nSTEPS = [step(f'data/s{{i:05d}}', cmd='true') for i in range({n})]\n"
        )
        env = {**os.environ, **emulator.env, "PYTHONPATH": str(root)}
        if proxy is not None:
            env["STORAGE_EMULATOR_HOST"] = proxy.endpoint
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "marinbuild", "run", "-q", "-j", str(jobs), "--prefix", emulator.prefix()],
            cwd=wf, env=env, capture_output=True, text=True,
        )
        seconds = time.perf_counter() - start
        time.sleep(0.5)
        kinds: collections.Counter[str] = collections.Counter()
        for line in emulator.log.read_text(errors="replace").splitlines():
            m = _LINE.search(line)
            if m:
                kinds[kind_of(m.group(1), m.group(2))] += 1
        total = sum(kinds.values())
        return {"checkout": str(root), "steps": n, "jobs": jobs, "delay": delay, "rc": done.returncode,
                "seconds": round(seconds, 1), "requests": total, "per_step": round(total / n, 2),
                "kinds": dict(kinds.most_common())}
    finally:
        if proxy is not None:
            proxy.stop()
        emulator.stop()


def round_trips(root: Path, workdir: Path, delay: float, repeats: int) -> dict[str, Any]:
    """Sequential round trips of a one-step run: (time with the proxy - time without) / delay, medians."""
    emulator = start_emulator(workdir / f"emu-rt-{root.name}")
    proxy = start_proxy(emulator.endpoint, delay)
    try:
        times: dict[float, list[float]] = {0.0: [], delay: []}
        for turn in range(repeats):
            for d in (0.0, delay):
                wf = workdir / f"rt-{root.name}-{turn}-{d}"
                wf.mkdir()
                (wf / "Marinfile.py").write_text("from marinbuild import step\n\none = step('one', cmd='true')\n")
                env = {**os.environ, **emulator.env, "PYTHONPATH": str(root)}
                if d:
                    env["STORAGE_EMULATOR_HOST"] = proxy.endpoint
                prefix = f"{emulator.prefix()}/rt-{turn}-{int(d * 1000)}"
                start = time.perf_counter()
                done = subprocess.run([sys.executable, "-m", "marinbuild", "run", "-q", "--prefix", prefix],
                                      cwd=wf, env=env, capture_output=True, text=True)
                times[d].append(time.perf_counter() - start)
                if done.returncode != 0:
                    raise SystemExit(f"{root}: run failed: {(done.stdout + done.stderr)[-400:]}")
        base, slow = sorted(times[0.0])[repeats // 2], sorted(times[delay])[repeats // 2]
        return {"checkout": str(root), "delay": delay, "seconds_without": round(base, 2), "seconds_with": round(slow, 2),
                "round_trips": round((slow - base) / delay, 1)}
    finally:
        proxy.stop()
        emulator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="steps (default 1000)")
    parser.add_argument("-j", type=int, default=4, help="parallel steps (default 4)")
    parser.add_argument("--compare", type=Path, help="run this other checkout first, the same way")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--round-trips", action="store_true", help="count sequential round trips of a one-step run")
    parser.add_argument("--delay", type=float, default=None,
                        help="seconds a proxy adds to each request (default: no proxy; 0.2 with --round-trips)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each kind (with --round-trips)")
    args = parser.parse_args()
    results = []
    if args.round_trips:
        with tempfile.TemporaryDirectory() as tmp:
            for root in ([args.compare] if args.compare else []) + [ROOT]:
                result = round_trips(root, Path(tmp), args.delay or 0.2, args.repeats)
                results.append(result)
                print(f"{result['checkout']}: {result['seconds_without']} s without, {result['seconds_with']} s with "
                      f"{args.delay or 0.2} s a request: {result['round_trips']} round trips one after another", flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
        return
    with tempfile.TemporaryDirectory() as tmp:
        for root in ([args.compare] if args.compare else []) + [ROOT]:
            result = run_once(root, args.n, Path(tmp), args.j, args.delay or 0.0)
            results.append(result)
            print(f"{result['checkout']}: rc={result['rc']} {result['seconds']} s, {result['requests']} requests, "
                  f"{result['per_step']} per step", flush=True)
            for kind, count in result["kinds"].items():
                print(f"  {count / args.n:7.2f} per step  {kind}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
