"""Requests and seconds to read the status of many steps on ``gs://`` (the storage emulator).

Starts ``gcp-storage-emulator`` on loopback, builds a graph of N steps under a ``gs://``
prefix and times :func:`marinbuild.project.probe` (what ``plan``, ``run`` and ``status``
read) in three states: nothing ran yet, every step ran, and every step RUNNING under a
lease, each left as runners leave it (markers and the status summary of
``marinbuild/store/index.py``). Requests are counted from the emulator's own log, one line per request. For
contrast it also times one sequential read per step, the way a tool checking files one
after another would. The emulator answers one request at a time on this machine, so the
seconds are an upper bound for it; the request counts carry over to GCS unchanged.

    python -m bench.gcs_status                 # N = 1000
    python -m bench.gcs_status -n 200 --json bench/results/gcs_status.json
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from marinbuild.graph import build_graph
from marinbuild.project import Project, probe
from marinbuild.steps import step
from marinbuild.store.index import INDEX_DIR, entry_names
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import RUNNING, SUCCESS, StatusRecord, status_path
from marinbuild.store.storage import Storage
from tests.fixtures_gcs import Emulator, point_gcsfs_at, start_emulator


def measure(emulator: Emulator, label: str, fn: Callable[[], Any]) -> dict[str, Any]:
    before = emulator.requests()
    start = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - start
    time.sleep(0.2)  # let the emulator's log catch up with its last answer
    row = {"case": label, "requests": emulator.requests() - before, "seconds": round(seconds, 3)}
    if isinstance(result, dict):
        row["found"] = len(result)
    print(f"{label:<48} {row['requests']:>6} requests {row['seconds']:>8.3f} s  found {row.get('found', '-')}")
    return row


def bench(n: int, workdir: Path) -> list[dict[str, Any]]:
    emulator = start_emulator(workdir)
    try:
        point_gcsfs_at(emulator)
        prefix = emulator.prefix()
        storage = Storage.for_prefix(prefix)
        graph = build_graph([step(f"data/s{i:05d}", cmd="true") for i in range(n)], prefix)
        project = Project(marinfile=None, graph=graph, storage=storage)  # type: ignore[arg-type]
        names = list(graph.order)
        outputs = [graph.nodes[name].output_path for name in names]
        rows = [measure(emulator, f"probe {n} steps, none ran yet", lambda: probe(project, names))]

        # As runners leave them: each marker, then its entry in the status summary.
        nodes = [graph.nodes[name] for name in names]
        records = {n.output_path: StatusRecord(SUCCESS, time.time(), duration=1.0, name=n.name, identity=n.identity)
                   for n in nodes}
        storage.write_many({status_path(o): r.to_json() for o, r in records.items()})
        storage.write_many(dict.fromkeys(entry_names(storage, [(n.output_path, n.identity, records[n.output_path])
                                                               for n in nodes]), ""))
        rows.append(measure(emulator, f"probe {n} steps, all SUCCESS", lambda: probe(project, names)))
        rows.append(
            measure(
                emulator,
                f"one read after another, {n} steps (contrast)",
                lambda: {o: storage.read_text(status_path(o)) for o in outputs},
            )
        )

        lease = LeaseRecord(Owner("elsewhere", 1, "", "bench"), time.time(), time.time()).to_json()
        storage.remove(storage.join(prefix, INDEX_DIR))
        records = {n.output_path: StatusRecord(RUNNING, time.time(), name=n.name, identity=n.identity) for n in nodes}
        storage.write_many({status_path(o): r.to_json() for o, r in records.items()})
        storage.write_many({lease_path(o): lease for o in outputs})
        storage.write_many(dict.fromkeys(entry_names(storage, [(n.output_path, n.identity, records[n.output_path])
                                                               for n in nodes]), ""))
        rows.append(measure(emulator, f"probe {n} steps, all RUNNING with a lease", lambda: probe(project, names)))
        return rows
    finally:
        emulator.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=1000, help="steps (default 1000)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = bench(args.n, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps({"steps": args.n, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
