"""Unit tests of marinbuild.removal: what ``clean`` removes, and what it leaves alone and why."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from marinbuild.errors import UserError
from marinbuild.graph import StepGraph, build_graph
from marinbuild.removal import (
    check_prefix,
    containment_problem,
    find_orphans,
    inside_prefix,
    live_lease,
    outputs_of,
    plan_clean,
    remove_output,
)
from marinbuild.steps import step, versioned
from marinbuild.store.lease import LeaseRecord, Owner, lease_path
from marinbuild.store.markers import SUCCESS, info_path, info_text, write_status
from marinbuild.store.storage import Storage


def _fn(cfg: object) -> None:
    pass


def _graph(prefix: str, n: int = 1, **kw: object) -> StepGraph:
    return build_graph([step("a", _fn, {"n": versioned(n)}, **kw)], prefix)  # type: ignore[arg-type]


def _built(storage: Storage, output: str, name: str = "a", identity: str | None = None) -> None:
    write_status(storage, output, SUCCESS, name=name, identity=identity or output.rsplit("-", 1)[1])
    storage.write_atomic(Storage.join(output, "data"), "x")


@pytest.fixture
def storage(tmp_path: Path) -> Storage:
    return Storage.for_prefix(str(tmp_path / "prefix"))


def test_a_filesystem_root_is_no_prefix() -> None:
    with pytest.raises(UserError, match="filesystem root"):
        check_prefix("/")
    check_prefix("gs://bucket")
    check_prefix("/data/exp")


def test_inside_prefix_is_strict_and_lexical() -> None:
    assert inside_prefix("/p/a", "/p")
    assert not inside_prefix("/p", "/p")
    assert not inside_prefix("/px/a", "/p")
    assert not inside_prefix("/p/../q", "/p")
    assert not inside_prefix("gs://p/a", "/p")


def test_containment_problem_names_the_reason(tmp_path: Path) -> None:
    prefix = tmp_path / "p"
    (prefix / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (prefix / "link").symlink_to(tmp_path / "elsewhere")
    assert containment_problem(str(prefix / "real"), str(prefix)) is None
    assert containment_problem(str(prefix / "link"), str(prefix)) == "it is reached through a symlink"
    assert containment_problem(str(prefix), str(prefix)) == "it is the prefix itself"
    assert containment_problem(str(tmp_path / "elsewhere"), str(prefix)) == "it is outside the prefix"


def test_outputs_outside_the_prefix_need_the_flag(tmp_path: Path, storage: Storage) -> None:
    outside = str(tmp_path / "shared")
    graph = build_graph([step("a", _fn, {}, override_output_path=str(storage.prefix) + "/x")], storage.prefix)
    assert outputs_of(graph, ["a"]) == ([str(storage.prefix) + "/x"], [])
    graph = build_graph([step("b", _fn, {})], storage.prefix)
    object.__setattr__(graph.nodes["b"], "output_path", outside)  # as an absolute override outside would
    chosen, skipped = outputs_of(graph, ["b"])
    assert chosen == [] and "--outside-prefix" in skipped[0].why
    assert outputs_of(graph, ["b"], outside=["b"]) == ([outside], [])


def test_plan_clean_of_named_steps(storage: Storage) -> None:
    graph = _graph(storage.prefix)
    out = graph.nodes["a"].output_path
    assert plan_clean(storage, graph, ["a"]).remove == []  # nothing there
    _built(storage, out)
    assert plan_clean(storage, graph, ["a"]).remove == [out]


def test_another_identitys_status_is_left_alone(storage: Storage) -> None:
    graph = _graph(storage.prefix)
    out = graph.nodes["a"].output_path
    _built(storage, out, identity="0123456789abcdef")
    plan = plan_clean(storage, graph, ["a"])
    assert plan.remove == [] and "it holds the SUCCESS of a" in plan.skipped[0].why


def test_orphans_are_old_identities_of_this_marinfiles_steps(storage: Storage) -> None:
    old, new = _graph(storage.prefix, 1), _graph(storage.prefix, 2)
    _built(storage, old.nodes["a"].output_path)
    _built(storage, new.nodes["a"].output_path)
    os.makedirs(Storage.join(storage.prefix, "a-0123456789abcdef"))  # no markers: not an output
    os.makedirs(Storage.join(storage.prefix, "zzz-0123456789abcdef", ".marinbuild"))  # not a step of this file
    orphans, skipped = find_orphans(storage, new)
    assert orphans == [old.nodes["a"].output_path] and skipped == []
    any_orphans, _ = find_orphans(storage, new, any_shape=True)
    assert sorted(any_orphans) == sorted([old.nodes["a"].output_path, Storage.join(storage.prefix, "zzz-0123456789abcdef")])


def test_orphans_written_from_another_marinfile_are_left_alone(storage: Storage) -> None:
    old, new = _graph(storage.prefix, 1), _graph(storage.prefix, 2)
    out = old.nodes["a"].output_path
    _built(storage, out)
    storage.write_atomic(info_path(out), info_text({"marinfile": "/other/Marinfile.py"}))
    orphans, skipped = find_orphans(storage, new, marinfile="/mine/Marinfile.py")
    assert orphans == [] and "written from /other/Marinfile.py" in skipped[0].why


def test_live_lease_keeps_a_running_output(storage: Storage) -> None:
    graph = _graph(storage.prefix)
    out = graph.nodes["a"].output_path
    _built(storage, out)
    me = Owner.current()
    storage.write_atomic(lease_path(out), LeaseRecord(me, time.time(), time.time()).to_json())
    assert live_lease(storage, out) is not None
    plan = plan_clean(storage, graph, ["a"])
    assert plan.remove == [] and "it is running" in plan.skipped[0].why
    assert plan_clean(storage, graph, ["a"], force=True).remove == [out]
    assert remove_output(storage, out) is not None  # the lease is held: left alone
    assert Path(out, "data").exists()


def test_a_dead_runners_lease_does_not_keep_it(storage: Storage) -> None:
    out = _graph(storage.prefix).nodes["a"].output_path
    _built(storage, out)
    dead = Owner(host=Owner.current().host, pid=Owner.current().pid, started="not-its-start", nonce="n",
                 machine=Owner.current().machine)
    storage.write_atomic(lease_path(out), LeaseRecord(dead, 1.0, 1.0).to_json())
    assert live_lease(storage, out) is None


def test_remove_output_takes_the_lease_and_removes_all(storage: Storage) -> None:
    out = _graph(storage.prefix).nodes["a"].output_path
    _built(storage, out)
    assert remove_output(storage, out) is None
    assert not Path(out).exists()
    _built(storage, out)
    assert remove_output(storage, out, force=True) is None
    assert not Path(out).exists()
