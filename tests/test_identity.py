"""Identity: what enters the hash, what does not, and that it is stable across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass

import pytest

from marinbuild import identity as identity_mod
from marinbuild import output_path_of, step, versioned
from marinbuild.errors import IdentityError
from marinbuild.graph import build_graph

from .helpers import cli_env


@dataclass(frozen=True)
class Cfg:
    lr: object
    epochs: object
    note: str = "plain"


def pipeline(lr=0.1, a_n=1, note="plain", b_n=2):
    a = step("a", cmd="true", config={"n": versioned(a_n)})
    b = step("b", cmd="true", config={"n": versioned(b_n)})
    c = step("c", fn=print, config=Cfg(lr=versioned(lr), epochs=a, note=note))
    d = step("d", fn=print, config={"c": output_path_of(c, "model"), "b": b})
    return build_graph([a, b, c, d], "/prefix")


def ids(graph):
    return {n: node.identity for n, node in graph.nodes.items()}


def test_versioned_change_moves_that_step_and_downstream_only():
    base = ids(pipeline())
    changed = ids(pipeline(lr=0.2))
    assert changed["a"] == base["a"] and changed["b"] == base["b"]
    assert changed["c"] != base["c"] and changed["d"] != base["d"]
    upstream = ids(pipeline(a_n=5))
    assert upstream["b"] == base["b"]
    assert {n for n in base if upstream[n] != base[n]} == {"a", "c", "d"}


def test_plain_field_does_not_change_identity():
    assert ids(pipeline(note="other")) == ids(pipeline())


def test_changing_back_gives_the_same_identity():
    assert ids(pipeline(lr=0.1)) == ids(pipeline(lr=0.1))
    assert ids(pipeline(lr=0.3)) != ids(pipeline(lr=0.1))


def test_prefix_does_not_enter_identity():
    a = step("a", cmd="true", config={"n": versioned(1)})
    g1, g2 = build_graph([a], "/one"), build_graph([a], "gs://bucket/two")
    assert g1.nodes["a"].identity == g2.nodes["a"].identity
    assert g1.nodes["a"].output_path == f"/one/a-{g1.nodes['a'].identity}"
    assert g2.nodes["a"].output_path.startswith("gs://bucket/two/a-")


def test_override_output_path_keeps_downstream_identity():
    def build(override):
        a = step("a", cmd="true", config={"n": versioned(1)}, override_output_path=override)
        b = step("b", cmd="true", config={"a": a})
        return build_graph([b], "/p")

    plain, moved = build(None), build("/p/elsewhere/a")
    assert moved.nodes["a"].output_path == "/p/elsewhere/a"
    assert moved.nodes["b"].identity == plain.nodes["b"].identity


@pytest.mark.parametrize(
    "value, field",
    [
        (lambda x: x, "fn"),
        (object(), "fn"),
        ({1, "a"}, "fn"),
        ({"k": {1: 2}}, "fn"),
        (float("nan"), "fn"),
    ],
)
def test_unencodable_values_are_refused_with_step_and_field(value, field):
    s = step("bad", cmd="true", config={field: versioned(value)})
    with pytest.raises(IdentityError) as e:
        build_graph([s], "/p")
    assert "'bad'" in str(e.value) and f"'{field}" in str(e.value)


def test_nested_field_path_is_named():
    s = step("bad", cmd="true", config={"opt": versioned({"sched": [1, object()]})})
    with pytest.raises(IdentityError, match=r"opt\.sched\.1"):
        build_graph([s], "/p")


def test_sets_of_one_type_and_dataclasses_are_encoded():
    s = step("ok", fn=print, config=versioned({"tags": {"b", "a"}, "cfg": Cfg(lr=1, epochs=2)}))
    g = build_graph([s], "/p")
    assert g.nodes["ok"].payload["versioned"]["."]["tags"] == ["a", "b"]


SCRIPT = """
import json, sys
sys.path.insert(0, sys.argv[1])
from marinbuild.marinfile import load_marinfile
from marinbuild.graph import build_graph
mf = load_marinfile(sys.argv[2])
g = build_graph(mf.steps, sys.argv[3])
print(json.dumps({n: v.identity for n, v in g.nodes.items()}))
"""

MARINFILE = """
from dataclasses import dataclass
from marinbuild import step, versioned
@dataclass(frozen=True)
class C:
    x: object
    y: object
a = step("a", cmd="true", config={"s": versioned({"z": 1, "a": [1.5, "t", None, True]})})
b = step("b", fn=print, config=C(x=versioned(frozenset({"q", "p"})), y=a))
"""


def test_identity_is_stable_across_fresh_interpreters(tmp_path):
    from .helpers import REPO

    mf = tmp_path / "Marinfile.py"
    mf.write_text(MARINFILE)
    results = []
    for seed, cwd, prefix in (("1", tmp_path, "/x"), ("12345", "/", "gs://b/y")):
        env = cli_env({"PYTHONHASHSEED": seed})
        out = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(REPO), str(mf), prefix],
            cwd=cwd, env=env, capture_output=True, text=True, check=True,
        )
        results.append(json.loads(out.stdout))
    assert results[0] == results[1]
    assert all(len(v) >= 8 for v in results[0].values())


def test_hashing_is_linear_in_chain_length(monkeypatch):
    calls = []
    real = identity_mod.identity_payload

    def counting(name, config, dep_ids, scan=None):
        calls.append(name)
        return real(name, config, dep_ids, scan)

    monkeypatch.setattr("marinbuild.graph.identity_payload", counting)
    prev = step("s0", cmd="true")
    for i in range(1, 2000):
        prev = step(f"s{i}", cmd="true", config={"dep": prev})
    g = build_graph([prev], "/p")
    assert len(calls) == 2000
    # A step's payload names only its direct dependency: upstream payloads are never re-walked.
    assert len(json.dumps(g.nodes["s1999"].payload)) < 200
