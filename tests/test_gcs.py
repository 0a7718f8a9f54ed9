"""``gs://`` end to end through gcsfs, against the test GCS server on loopback (``tests/gcs_server.py``).

The server holds generation preconditions as GCS does, so leases here take the path a real
bucket takes (create with ``ifGenerationMatch=0``, swap and delete on a generation). The
last two tests use a server that ignores preconditions, as ``gcp-storage-emulator`` alone
does: marinbuild notices and falls back to check-write-settle-verify.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from marinbuild.graph import build_graph
from marinbuild.project import Project, probe
from marinbuild.steps import step
from marinbuild.store.conditional import GcsConditionalStore, conditional_store
from marinbuild.store.lease import Lease, LeaseRecord, LeaseSettings, Owner, lease_path, read_leases
from marinbuild.store.markers import SUCCESS, read_statuses, write_status
from marinbuild.store.storage import Storage

from .helpers import marinbuild, write_marinfile
from .test_concurrency import STEPS, events, run_six_runners

if TYPE_CHECKING:
    from .fixtures_gcs import Emulator

pytest_plugins = ["tests.fixtures_gcs"]

DAG = """
from marinbuild import step, versioned, output_path_of

LOG = "@LOG@"

def make(name, deps):
    config = {f"in{i}": output_path_of(d) for i, d in enumerate(deps)}
    config["v"] = versioned(1)
    return step(name, cmd=f"echo {name} $$ $PPID start >> {LOG}; sleep 0.05; echo {name} $$ $PPID end >> {LOG}",
                config=config)

root = make("root", [])
l1 = [make(f"l1_{i}", [root]) for i in range(8)]
l2 = [make(f"l2_{i}", [l1[i // 2], l1[(i + 1) % 8]]) for i in range(16)]
l3 = [make(f"l3_{i}", [l2[i], l2[(i + 5) % 16]]) for i in range(16)]
l4 = [make(f"l4_{i}", [l3[2 * i], l3[2 * i + 1]]) for i in range(8)]
sink = make("sink", l4)
"""


def test_conditional_writes_speak_gcs_preconditions(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    store = conditional_store(storage)
    assert isinstance(store, GcsConditionalStore)
    path = lease_path(f"{gcs_prefix}/train-0123456789abcdef")
    assert store.read(path) is None
    v1 = store.create(path, '{"a": 1}')
    assert v1 is not None and v1.isdigit()  # a generation number
    seen = store.read(path)
    assert seen is not None and (seen.text, seen.version) == ('{"a": 1}', v1)
    assert storage.read_text(path) == '{"a": 1}'  # the object's body is the lease too
    v2 = store.swap(path, v1, '{"a": 2}')
    assert v2 is not None and v2 != v1
    assert store.delete(path, v2)
    assert store.read(path) is None


def test_lease_lifecycle_on_gcs(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    out = f"{gcs_prefix}/train-0123456789abcdef"
    mine = Lease(conditional_store(storage), lease_path(out), Owner.current(), LeaseSettings(1, 3, 1))
    assert mine.try_acquire().acquired
    assert mine.renew() and mine.verify()
    assert read_leases(storage, [out])[out].beat == 1  # type: ignore[union-attr]
    theirs = Lease(conditional_store(storage), lease_path(out), Owner.current(), LeaseSettings(1, 3, 1))
    assert not theirs.try_acquire().acquired
    assert isinstance(mine.store, GcsConditionalStore) and mine.store.enforced  # the precondition path
    # An owner change by a plain write is refused by the generation of the renewal's swap.
    storage.write_atomic(lease_path(out), LeaseRecord(Owner("h", 1, "", "n"), 0, 0).to_json())
    assert not mine.renew() and not mine.held


def test_status_of_many_steps_takes_few_requests(gcs_emulator: Emulator, gcs_prefix: str) -> None:
    storage = Storage.for_prefix(gcs_prefix)
    steps = [step(f"s{i:03d}", cmd="true") for i in range(200)]
    graph = build_graph(steps, gcs_prefix)
    project = Project(marinfile=None, graph=graph, storage=storage)  # type: ignore[arg-type]
    names = list(graph.order)

    before = gcs_emulator.requests()
    assert probe(project, names) == {}
    assert gcs_emulator.requests() - before <= 2  # one listing rules every step out

    for n in names[:150]:
        write_status(storage, graph.nodes[n].output_path, SUCCESS)
    before = gcs_emulator.requests()
    found = probe(project, names)
    assert len(found) == 150
    assert gcs_emulator.requests() - before <= 150 + 2  # one read per step that ran, one listing
    statuses = read_statuses(storage, [graph.nodes[n].output_path for n in names[:150]])
    assert {r.status for r in statuses.values()} == {SUCCESS}


def test_six_runners_on_gcs_run_every_step_exactly_once(gcs_emulator: Emulator, project: Path) -> None:
    log = project.parent / "steps.log"
    write_marinfile(project, DAG.replace("@LOG@", str(log)))
    env = {**gcs_emulator.env, "MARIN_PREFIX": gcs_emulator.prefix(),
           "MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}
    run_six_runners(project, env, timeout=180)
    starts = Counter(name for name, _, _, what in events(log) if what == "start")
    assert len(starts) == STEPS and set(starts.values()) == {1}, starts
    status = marinbuild("status", "--json", cwd=project, env=env)
    rows = json.loads(status.stdout)
    assert len(rows) == STEPS and {r["status"] for r in rows} == {"SUCCESS"}
    assert all(r["lease"] is None for r in rows)
    plan = marinbuild("plan", "--json", cwd=project, env=env)
    assert {r["action"] for r in json.loads(plan.stdout)} == {"skip"}


def _without_preconditions(server: Emulator, prefix: str) -> Storage:
    import gcsfs

    from marinbuild.store.fsspec_store import FsspecStorage
    from marinbuild.store.gcs_session import single_attempt_session

    fs = gcsfs.GCSFileSystem(endpoint_url=server.endpoint, token="anon", skip_instance_cache=True,
                             session_kwargs=single_attempt_session())
    return FsspecStorage(prefix, fs)


def test_conditional_writes_fall_back_where_the_server_ignores_preconditions(
    gcs_emulator_without_preconditions: Emulator,
) -> None:
    prefix = gcs_emulator_without_preconditions.prefix()
    store = conditional_store(_without_preconditions(gcs_emulator_without_preconditions, prefix))
    assert isinstance(store, GcsConditionalStore) and not store.enforced
    path = lease_path(f"{prefix}/train-0123456789abcdef")
    v1 = store.create(path, "mine")
    assert v1 is not None and store.create(path, "theirs") is None  # checked first, then settled
    assert store.swap(path, "1", "stale") is None
    v2 = store.swap(path, v1, "mine again")
    assert v2 is not None and not store.delete(path, v1) and store.delete(path, v2)


def test_racing_leases_on_a_server_without_preconditions_leave_one_owner(
    gcs_emulator_without_preconditions: Emulator,
) -> None:
    import threading

    prefix = gcs_emulator_without_preconditions.prefix()
    storage = _without_preconditions(gcs_emulator_without_preconditions, prefix)
    path = lease_path(f"{prefix}/train-0123456789abcdef")
    gate = threading.Barrier(4)
    won: list[bool] = []

    def race(i: int) -> None:
        lease = Lease(conditional_store(storage), path, Owner("h", i, "", f"n{i}"), LeaseSettings(1, 3, 1))
        gate.wait()
        won.append(lease.try_acquire().acquired)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(won) == [False, False, False, True]
