"""Requests and seconds of ``plan``, ``status`` and a no-op ``run`` of N steps on ``gs://``.

Starts ``gcp-storage-emulator`` on loopback and, unless ``--delay 0``, the latency proxy of
:mod:`bench.latency_proxy` in front of it (50 ms per request by default), writes a
Marinfile of N independent shell steps, and times the three commands as a user runs them
(``python -m marinbuild ...`` subprocesses) in three states of the store: no step ran yet,
every step up to date, every step RUNNING under a live lease of another host. Requests are
counted in the emulator's own log. ``--local`` times the same on a local prefix.

The up-to-date state is written the way a runner leaves it (status marker, then the
summary entry of :mod:`marinbuild.store.index` when that module exists), in bulk, so that
10,000 steps take seconds to set up; ``--real-run`` runs the steps instead and reports the
requests of that run too.

    python -m bench.gcs_noop -n 10000
    python -m bench.gcs_noop -n 1000 --real-run --json bench/results/gcs_noop-1000.json
    # the no-op run of an older commit and of this checkout in turns, on one store:
    git archive COMMIT | tar -x -C /tmp/before && python -m bench.gcs_noop -n 10000 --compare /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.latency_proxy import start_proxy
from tests.fixtures_gcs import Emulator, point_gcsfs_at, start_emulator

ROOT = Path(__file__).resolve().parent.parent


def write_marinfile(folder: Path, n: int) -> Path:
    path = folder / "Marinfile.py"
    path.write_text(
        "from marinbuild import step\n\n"
        f"STEPS = [step(f'data/s{{i:05d}}', cmd='true') for i in range({n})]\n"
    )
    return path


def marinbuild(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "marinbuild", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    return time.perf_counter() - start, done.returncode, (done.stdout + done.stderr)[-400:]


def populate(prefix: str, marinfile: Path, state: str) -> None:
    """Leave every step ``state`` (SUCCESS, or RUNNING under a live lease) as a runner does."""
    from marinbuild.graph import build_graph
    from marinbuild.marinfile import load_marinfile
    from marinbuild.store.markers import StatusRecord, status_path
    from marinbuild.store.storage import Storage

    storage = Storage.for_prefix(prefix)
    graph = build_graph(load_marinfile(str(marinfile)).steps, prefix)
    nodes = list(graph.nodes.values())
    files: dict[str, str] = {}
    records = []
    try:
        from marinbuild.drift import code_record, drift_digest  # what this version records

        def digest(step: Any) -> dict[str, Any]:
            return {"drift": drift_digest(code_record(step))} if state == "SUCCESS" else {}
    except ImportError:

        def digest(step: Any) -> dict[str, Any]:
            return {}

    for node in nodes:
        record = StatusRecord(state, time.time(), duration=0.01 if state == "SUCCESS" else None, name=node.name,
                              identity=node.identity, **digest(node.step))
        records.append((node.output_path, node.identity, record))
        files[status_path(node.output_path)] = record.to_json()
    if state == "RUNNING":
        from marinbuild.store.lease import LeaseRecord, Owner, lease_path

        now = time.time()
        lease = LeaseRecord(Owner("elsewhere", 1, "", "bench"), now, now + 3600).to_json()
        for node in nodes:
            files[lease_path(node.output_path)] = lease
    try:
        from marinbuild.store import index  # the summary, where this version has one
    except ImportError:
        index = None  # type: ignore[assignment]
    bulk_write(storage, files)
    if index is not None:
        if state == "RUNNING":  # the summary entries of the SUCCESS state before are retired
            storage.remove(storage.join(storage.prefix, index.INDEX_DIR))
        bulk_write(storage, {p: "" for p in index.entry_names(storage, records)})


def bulk_write(storage: Any, files: dict[str, str]) -> None:
    if "://" not in storage.prefix:
        for path, text in files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            Path(path).write_text(text)
        return
    import fsspec

    fs, _ = fsspec.core.url_to_fs(storage.prefix)
    fs.pipe({fs._strip_protocol(p): t.encode() for p, t in files.items()})


def bench(
    n: int, workdir: Path, delay: float, local: bool, real_run: bool, compare: Path | None = None, repeats: int = 3
) -> list[dict[str, Any]]:
    emulator: Emulator | None = None
    proxy = None
    rows: list[dict[str, Any]] = []
    wf = workdir / "wf"
    wf.mkdir()
    marinfile = write_marinfile(wf, n)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        if local:
            prefix = str(workdir / "out")
        else:
            emulator = start_emulator(workdir / "emu")
            point_gcsfs_at(emulator)
            env.update(emulator.env)
            prefix = emulator.prefix()
            if delay > 0:
                proxy = start_proxy(emulator.endpoint, delay)
                env["STORAGE_EMULATOR_HOST"] = proxy.endpoint

        def measure(args: list[str]) -> None:
            before = emulator.requests() if emulator else 0
            seconds, rc, tail = marinbuild([*args, "-f", str(marinfile), "--prefix", prefix], env, wf)
            time.sleep(0.3)  # the emulator logs a request after answering it
            requests = emulator.requests() - before if emulator else None
            row = {"state": state, "command": args[0], "steps": n, "seconds": round(seconds, 2),
                   "requests": requests, "rc": rc}
            rows.append(row)
            print(f"{state:<10} {' '.join(args):<14} {seconds:8.2f} s  {requests if requests is not None else '-':>7} requests  rc={rc}",
                  flush=True)
            if rc not in (0, 1):
                print(tail, flush=True)

        if compare is not None:
            # Side by side: the same store, every step up to date (markers and summary entries,
            # which an older checkout simply does not read), each checkout's no-op run in turns.
            populate(prefix, marinfile, "SUCCESS")
            for turn in range(repeats):
                for label, root in (("before", compare), ("after", ROOT)):
                    before = emulator.requests() if emulator else 0
                    seconds, rc, _ = marinbuild(["run", "-q", "-f", str(marinfile), "--prefix", prefix],
                                                {**env, "PYTHONPATH": str(root)}, wf)
                    time.sleep(0.3)
                    requests = emulator.requests() - before if emulator else None
                    rows.append({"state": "done", "command": "run", "checkout": label, "turn": turn, "steps": n,
                                 "seconds": round(seconds, 2), "requests": requests, "rc": rc})
                    print(f"{label:<7} no-op run {seconds:8.2f} s  {requests if requests is not None else '-':>7} requests"
                          f"  rc={rc}", flush=True)
            return rows
        state = "never-run"
        measure(["plan"])
        measure(["status"])
        if real_run:
            measure(["run", "-q", "-j", "8"])
            rows[-1]["state"] = "real run"
        else:
            populate(prefix, marinfile, "SUCCESS")
        state = "done"
        measure(["plan"])
        measure(["status"])
        measure(["run", "-q"])
        if not local:
            populate(prefix, marinfile, "RUNNING")
            state = "running"
            measure(["plan"])
            measure(["status"])
        return rows
    finally:
        if proxy is not None:
            proxy.stop()
        if emulator is not None:
            emulator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="steps (default 1000)")
    parser.add_argument("--delay", type=float, default=0.05, help="seconds the proxy adds per request; 0: no proxy")
    parser.add_argument("--local", action="store_true", help="a local prefix instead of gs://")
    parser.add_argument("--real-run", action="store_true", help="run the steps instead of writing their markers")
    parser.add_argument("--compare", type=Path, help="time the no-op run of this other checkout too, in turns")
    parser.add_argument("--repeats", type=int, default=3, help="turns with --compare (default 3)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(args.n, Path(tmp), args.delay, args.local, args.real_run, args.compare, args.repeats)
    if args.json:
        args.json.write_text(json.dumps({"steps": args.n, "delay": args.delay, "local": args.local, "rows": rows},
                                        indent=1) + "\n")


if __name__ == "__main__":
    main()
