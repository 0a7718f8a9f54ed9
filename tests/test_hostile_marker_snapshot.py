"""Hostile tests of the markers' snapshot (``PREFIX/.marinbuild/markers.snapshot``): real files,
the real command line, and for each attack the one oracle that matters:

- the plan with the snapshot present equals the plan with it moved away (the markers alone), and
- a step is planned ``skip`` only where a plain read of its marker says ``SUCCESS`` for its identity.

Each test starts from a project whose markers have settled (older than ``SETTLED_NS``) and whose
snapshot was saved by a no-op ``run`` and vouches for every marker (checked before the attack, so
that no test passes because the snapshot was never used). The projects are built together, in
parallel, by a module fixture, and wait for the markers to settle once.
"""

from __future__ import annotations

import json
import marshal
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import xxhash

from marinbuild.store import marker_snapshot
from marinbuild.store.marker_snapshot import SETTLED_NS, SNAPSHOT_FILE, MarkerSnapshot

from .helpers import marinbuild, marinbuild_in_process, missing_tool, plan_json, start_marinbuild, write_marinfile

pytestmark = pytest.mark.xdist_group("hostile-marker-snapshot")  # one worker builds the projects once

THREE = """
from marinbuild import step
a = step("a", cmd="echo a > {output}/a.txt", config={"n": 1})
c = step("c", cmd="echo c > {output}/c.txt", config={"n": 2})
b = step("b", cmd="cat {inp}/a.txt > {output}/b.txt", config={"inp": a})
"""

LEASE_ENV = {"MARINBUILD_LEASE_HEARTBEAT": "0.5", "MARINBUILD_LEASE_EXPIRY": "3"}

PROJECTS = ("swap", "cp_marker", "cp_folder", "reuse", "symlink", "foreign_src", "foreign_dst", "kill",
            "concurrent", "clean", "garbage", "owner")


# --- helpers ---------------------------------------------------------------------------------


def _out(project: Path) -> Path:
    return project / "marinbuild-out"


def _snapshot(project: Path) -> Path:
    return _out(project) / ".marinbuild" / SNAPSHOT_FILE


def _folders(project: Path) -> dict[str, Path]:
    """Each step's output folder, by step name."""
    return {p.name.rsplit("-", 1)[0]: p for p in _out(project).iterdir() if p.name != ".marinbuild" and p.is_dir()}


def _markers(project: Path) -> dict[str, Path]:
    return {name: folder / ".marinbuild" / "status" for name, folder in _folders(project).items()}


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    text = result.stdout + result.stderr
    assert result.returncode == 0, text
    assert "Traceback" not in text, text
    return text


def _vouched(project: Path) -> set[str]:
    """The outputs (by step name) whose marker the snapshot file on disk would answer for unread now."""
    entries = MarkerSnapshot(str(_out(project)))._loaded()
    names = {str(folder): name for name, folder in _folders(project).items()}
    out = set()
    for output, (key, _values) in entries.items():
        try:
            now = marker_snapshot._stat_key(os.stat(output + "/.marinbuild/status"))
        except OSError:
            continue
        if now == key and output in names:
            out.add(names[output])
    return out


def _plain(marker: Path) -> dict | None:
    """What a plain read of a marker says (None: absent or unusable)."""
    try:
        record = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def _oracle(project: Path) -> dict[str, dict]:
    """The plan with the snapshot as it is, checked against the plan without it and against the markers."""
    snapshot = _snapshot(project)
    aside = snapshot.with_name("aside-for-the-oracle")
    present = os.path.lexists(snapshot)
    with_snapshot = plan_json(project)
    if present:
        os.rename(snapshot, aside)
    try:
        without = plan_json(project)
    finally:
        if present:
            os.rename(aside, snapshot)
    assert with_snapshot == without, (with_snapshot, without)
    for name, row in with_snapshot.items():
        if row["action"] == "skip":
            record = _plain(Path(row["output_path"]) / ".marinbuild" / "status")
            assert record is not None and record.get("status") == "SUCCESS", (name, record)
            assert record.get("identity") in (None, row["identity"]), (name, record)
    return with_snapshot


def _rewrite(marker: Path, **fields: str) -> None:
    """Rewrite a marker in place (same inode) with ``fields`` changed, its mtime put back."""
    before = marker.stat()
    record = json.loads(marker.read_text())
    record.update(fields)
    with open(marker, "r+") as f:
        f.seek(0)
        f.truncate()
        f.write(json.dumps(record, sort_keys=True))
    os.utime(marker, ns=(before.st_atime_ns, before.st_mtime_ns))


def _same_size_identity(text: str, identity: str) -> str:
    other = "0" * len(identity) if identity != "0" * len(identity) else "1" * len(identity)
    return text.replace(identity, other)


def _settle(markers: list[Path]) -> None:
    newest = max(os.stat(m).st_ctime_ns for m in markers)
    while time.time_ns() - SETTLED_NS <= newest:
        time.sleep(0.05)


@pytest.fixture(scope="module")
def farm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One built project per test: built in parallel, settled once, each snapshot saved by a no-op run."""
    root = tmp_path_factory.mktemp("hostile-snapshot")
    projects = {}
    for name in PROJECTS:
        folder = root / name
        folder.mkdir()
        write_marinfile(folder, THREE)
        projects[name] = folder
    builds = [start_marinbuild("run", cwd=p) for p in projects.values()]
    for proc, project in zip(builds, projects.values(), strict=True):
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, (project, out, err)
    _settle([m for p in projects.values() for m in _markers(p).values()])
    for project in projects.values():
        assert "nothing to do: 3 steps up to date" in _ok(marinbuild_in_process("run", cwd=project))
        assert _snapshot(project).is_file()
        assert _vouched(project) == {"a", "b", "c"}, project
    return projects


# --- the attacks ------------------------------------------------------------------------------


def test_swapping_two_output_folders_with_mv(farm: dict[str, Path]) -> None:
    project = farm["swap"]
    folders = _folders(project)
    assert _vouched(project) == {"a", "b", "c"}
    a, c = folders["a"], folders["c"]
    tmp = a.with_name("swap-tmp")
    os.rename(a, tmp)
    os.rename(c, a)
    os.rename(tmp, c)
    assert _vouched(project) == {"b"}  # b untouched: still served from the snapshot
    rows = _oracle(project)
    assert rows["a"]["action"] != "skip" and rows["c"]["action"] != "skip", rows
    # Swap back: the snapshot's entries are the files' own again, and the plan is a no-op once more.
    os.rename(a, tmp)
    os.rename(c, a)
    os.rename(tmp, c)
    assert _vouched(project) == {"a", "b", "c"}
    assert {r["action"] for r in _oracle(project).values()} == {"skip"}


def test_cp_a_of_a_marker_over_another(farm: dict[str, Path]) -> None:
    project = farm["cp_marker"]
    markers = _markers(project)
    assert _vouched(project) == {"a", "b", "c"}
    inode = markers["c"].stat().st_ino
    subprocess.run(["cp", "-a", str(markers["a"]), str(markers["c"])], check=True)
    assert markers["c"].stat().st_ino == inode  # written over in place: same inode, a's mtime
    assert markers["c"].stat().st_mtime_ns == markers["a"].stat().st_mtime_ns
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows  # c's folder now holds a's status
    assert rows["a"]["action"] == "skip"


def test_cp_a_of_a_whole_output_folder_over_another(farm: dict[str, Path]) -> None:
    project = farm["cp_folder"]
    folders = _folders(project)
    assert _vouched(project) == {"a", "b", "c"}
    # `cp -a A/. C/` writes A's files over C's (same inodes where both have a file), times kept.
    subprocess.run(["cp", "-a", f"{folders['a']}/.", str(folders["c"])], check=True)
    assert _plain(folders["c"] / ".marinbuild" / "status")["name"] == "a"
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows
    # And a folder copied whole in place of another (`rm -r C; cp -a A C`).
    shutil.rmtree(folders["c"])
    subprocess.run(["cp", "-a", str(folders["a"]), str(folders["c"])], check=True)
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows


def test_a_marker_deleted_and_made_again_with_its_size_and_mtime(farm: dict[str, Path]) -> None:
    project = farm["reuse"]
    marker = _markers(project)["c"]
    assert _vouched(project) == {"a", "b", "c"}
    before = marker.stat()
    text = marker.read_text()
    identity = json.loads(text)["identity"]
    forged = _same_size_identity(text, identity)
    assert len(forged) == len(text) and forged != text
    reused = False
    for _ in range(20):  # ext4 tends to hand the freed inode to the next file made beside it
        marker.unlink()
        with open(marker, "w") as f:
            f.write(forged)
        os.utime(marker, ns=(before.st_atime_ns, before.st_mtime_ns))
        now = marker.stat()
        assert (now.st_size, now.st_mtime_ns, now.st_mode) == (before.st_size, before.st_mtime_ns, before.st_mode)
        if now.st_ino == before.st_ino:
            reused = True
            break
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", (rows, "inode reused" if reused else "inode not reused")


def test_a_marker_replaced_by_a_symlink_to_another_steps_marker(farm: dict[str, Path]) -> None:
    project = farm["symlink"]
    markers = _markers(project)
    assert _vouched(project) == {"a", "b", "c"}
    markers["c"].unlink()
    markers["c"].symlink_to(markers["a"])
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows
    # A run refuses to write through the link (c fails), but saves what it planned from: under c's
    # output, the record of the file the link leads to, a's settled marker.
    result = marinbuild_in_process("run", cwd=project)
    assert result.returncode == 1 and "is a symlink" in result.stdout + result.stderr, result
    assert "Traceback" not in result.stdout + result.stderr
    assert markers["c"].is_symlink()
    assert "c" in _vouched(project)
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows
    # The link led elsewhere: to a FAILED marker of c's own name and identity, and to b's marker.
    failed = project / "failed-status"
    record = json.loads(markers["a"].read_text())
    record.update(status="FAILED", name="c", identity=rows["c"]["identity"])
    failed.write_text(json.dumps(record, sort_keys=True))
    for target in (failed, markers["b"]):
        markers["c"].unlink()
        markers["c"].symlink_to(target)
        rows = _oracle(project)
        assert rows["c"]["action"] != "skip", (target, rows)
    # The link gone: c runs again and is done.
    markers["c"].unlink()
    _ok(marinbuild_in_process("run", cwd=project))
    assert {r["action"] for r in _oracle(project).values()} == {"skip"}


def test_a_snapshot_copied_from_another_prefix(farm: dict[str, Path]) -> None:
    src, dst = farm["foreign_src"], farm["foreign_dst"]
    assert _vouched(src) == {"a", "b", "c"}
    # The destination's c is FAILED (same inode, mtime put back), and the source's snapshot goes in.
    _rewrite(_markers(dst)["c"], status="FAILED")
    shutil.copy2(_snapshot(src), _snapshot(dst))
    rows = _oracle(dst)
    assert rows["c"]["action"] != "skip", rows
    # Harder: the other prefix moved to the very paths the source's snapshot names (the files keep
    # their inodes and settled change times), with the source's snapshot put in.
    saved = src.parent / "foreign-src-saved-snapshot"
    shutil.copy2(_snapshot(src), saved)
    os.rename(_out(src), src.parent / "foreign-src-old-out")
    os.rename(_out(dst), _out(src))
    shutil.copy2(saved, _snapshot(src))
    entries = MarkerSnapshot(str(_out(src)))._loaded()
    assert set(entries) >= {str(f) for f in _folders(src).values()}  # it names these very outputs
    assert _vouched(src) == set()  # and vouches for none of the files now there
    rows = _oracle(src)
    assert rows["c"]["action"] != "skip", rows


def test_sigkill_of_runs_while_they_save_the_snapshot(farm: dict[str, Path]) -> None:
    project = farm["kill"]
    folder = _out(project) / ".marinbuild"
    markers = _markers(project)
    assert _vouched(project) == {"a", "b", "c"}
    rng = random.Random(1234)
    caught_saving = 0
    deadline = time.monotonic() + 7
    rounds = 0
    while time.monotonic() < deadline and rounds < 6:
        rounds += 1
        if rounds % 2:
            _snapshot(project).unlink(missing_ok=True)  # the run reads every marker and saves
        elif markers["c"].is_file():
            _rewrite(markers["c"], status="FAILED")  # the run drops c's entry, saves, and reruns c
        left = set(os.listdir(folder)) if folder.is_dir() else set()
        proc = start_marinbuild("run", cwd=project)
        kill_at = time.monotonic() + rng.uniform(0.2, 1.6)
        killed_saving = False
        while time.monotonic() < kill_at and proc.poll() is None:
            try:
                names = os.listdir(folder)
            except FileNotFoundError:
                names = []
            if any(n.startswith(".snapshot-") and n not in left for n in names):
                killed_saving = True
                break
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
        caught_saving += killed_saving
        _oracle(project)
    # Whatever the kills left (a torn temporary, a stale snapshot, a RUNNING marker of a dead
    # runner), a run ends up with everything done and the snapshot agreeing.
    _ok(marinbuild("run", cwd=project))
    rows = _oracle(project)
    assert {r["action"] for r in rows.values()} == {"skip"}, (rows, caught_saving)


def test_two_concurrent_runs_on_one_project(farm: dict[str, Path]) -> None:
    project = farm["concurrent"]
    markers = _markers(project)
    assert _vouched(project) == {"a", "b", "c"}
    _rewrite(markers["a"], status="FAILED")  # a and, after it, b to run
    _rewrite(markers["c"], status="FAILED")
    first, second = (start_marinbuild("run", cwd=project, env=LEASE_ENV) for _ in range(2))
    results = []
    for proc in (first, second):
        out, err = proc.communicate(timeout=120)
        results.append((proc.returncode, out, err))
    assert any(rc == 0 for rc, _, _ in results), results
    for _, out, err in results:
        assert "Traceback" not in out + err, (out, err)
    _oracle(project)
    _ok(marinbuild_in_process("run", cwd=project))  # whichever lost the race: done now
    rows = _oracle(project)
    assert {r["action"] for r in rows.values()} == {"skip"}, rows


def test_clean_then_run(farm: dict[str, Path]) -> None:
    project = farm["clean"]
    assert _vouched(project) == {"a", "b", "c"}
    _ok(marinbuild_in_process("clean", "-y", "a", cwd=project))
    rows = _oracle(project)
    assert rows["a"]["action"] != "skip", rows
    _ok(marinbuild_in_process("clean", "-y", "--any-orphans", cwd=project))
    assert _snapshot(project).is_file()
    _ok(marinbuild("run", cwd=project))
    rows = _oracle(project)
    assert {r["action"] for r in rows.values()} == {"skip"}, rows
    _ok(marinbuild_in_process("clean", "-y", cwd=project))
    rows = _oracle(project)
    assert all(r["action"] != "skip" for r in rows.values()), rows


def _valid_body(path: Path) -> tuple:
    data = path.read_bytes()
    head = len(marker_snapshot._MAGIC) + marker_snapshot._DIGEST_LEN
    return marshal.loads(data[head:])


def _framed(body: tuple) -> bytes:
    raw = marshal.dumps(body)
    return marker_snapshot._MAGIC + xxhash.xxh3_64_digest(raw) + raw


def test_broken_snapshots_read_as_none(farm: dict[str, Path]) -> None:
    project = farm["garbage"]
    snapshot = _snapshot(project)
    assert _vouched(project) == {"a", "b", "c"}
    good = snapshot.read_bytes()
    key, outputs, stats, values = _valid_body(snapshot)
    c_output = str(_folders(project)["c"])
    marker = _markers(project)["c"]
    _rewrite(marker, status="FAILED")  # a snapshot read as valid below would say SUCCESS for c
    snapshot.unlink()
    baseline = plan_json(project)
    assert baseline["c"]["action"] != "skip", baseline
    # The snapshot's SUCCESS record for c, kept under the stat c's FAILED marker has now.
    i = outputs.index(c_output)
    size = marker_snapshot._STAT.size
    stats_now = stats[: i * size] + marker_snapshot._stat_key(os.stat(marker)) + stats[(i + 1) * size:]
    vouching = _framed((key, outputs, stats_now, values))
    head = len(marker_snapshot._MAGIC) + marker_snapshot._DIGEST_LEN
    variants = {
        "zero-length": b"",
        "garbage": os.urandom(700),
        "truncated": vouching[: len(vouching) // 2],
        "cut by one byte": vouching[:-1],
        "magic only": marker_snapshot._MAGIC,
        "one bit flipped": vouching[:-1] + bytes([vouching[-1] ^ 1]),
        "another file's digest": good[:head] + vouching[head:],
        "another version's parser": _framed((b"\0" * len(key), outputs, stats_now, values)),
        "stats of the wrong length": _framed((key, outputs, stats_now[:-1], values)),
        "records of the wrong width": _framed((key, outputs, stats_now, tuple(v[:-1] for v in values))),
        "not a tuple": _framed(key),
        "three fields": _framed((key, outputs, stats_now)),
    }
    for name, data in variants.items():
        snapshot.write_bytes(data)
        assert plan_json(project) == baseline, name
        _ok(marinbuild_in_process("plan", cwd=project))
        _ok(marinbuild_in_process("status", cwd=project))
        _ok(marinbuild_in_process("run", "--dry", cwd=project))
        assert snapshot.read_bytes() == data  # only run saves
    # The control: the body the variants spoil, framed as it should be, is trusted (and says c is done
    # although its marker says FAILED: what a forged snapshot of this very user can do, by design).
    snapshot.write_bytes(vouching)
    assert plan_json(project)["c"]["action"] == "skip"
    # A FIFO and a folder in its place: read as none; saving over the folder fails quietly.
    snapshot.unlink()
    os.mkfifo(snapshot)
    assert plan_json(project) == baseline
    _ok(marinbuild_in_process("run", "--dry", cwd=project))
    snapshot.unlink()
    snapshot.mkdir()
    assert plan_json(project) == baseline
    _ok(marinbuild("run", cwd=project))  # the real command line: reruns c, saves over a folder
    assert snapshot.is_dir()
    assert {r["action"] for r in _oracle(project).values()} == {"skip"}
    # Garbage again, and a run replaces it with a snapshot that is read.
    snapshot.rmdir()
    snapshot.write_bytes(os.urandom(300))
    _ok(marinbuild_in_process("run", cwd=project))
    assert MarkerSnapshot(str(_out(project)))._loaded()
    assert {r["action"] for r in _oracle(project).values()} == {"skip"}


def test_a_snapshot_owned_by_another_user_is_not_trusted(farm: dict[str, Path]) -> None:
    if os.geteuid() != 0:
        missing_tool("root, to give the snapshot to another user")
    project = farm["owner"]
    snapshot = _snapshot(project)
    assert _vouched(project) == {"a", "b", "c"}
    c_output = str(_folders(project)["c"])
    marker = _markers(project)["c"]
    _rewrite(marker, status="FAILED")
    key, outputs, stats, values = _valid_body(snapshot)
    i = outputs.index(c_output)
    size = marker_snapshot._STAT.size
    current = marker_snapshot._stat_key(os.stat(marker))
    forged = _framed((key, outputs, stats[: i * size] + current + stats[(i + 1) * size:], values))
    snapshot.write_bytes(forged)
    os.chown(snapshot, 65534, 65534)
    rows = _oracle(project)
    assert rows["c"]["action"] != "skip", rows
    os.chown(snapshot, 0, 0)  # the control: the same file, this user's, is trusted
    assert plan_json(project)["c"]["action"] == "skip"
    snapshot.unlink()
