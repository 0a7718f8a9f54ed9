"""A row of ``show`` and the report is a run of the chain: the versioned fields of the steps upstream of
a row, and the metrics of the step downstream that evaluates it.

A sweep declares its hyperparameters on the trainings and its metrics on the evaluations; one table
answers "which lr won" only when each eval row carries its training's ``lr`` and each training row
its eval's ``eval_loss``. Pure: everything here is read off the step graph (the metrics themselves
are read by :mod:`marinbuild.report.records`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import networkx as nx

from marinbuild.graph import StepGraph

if TYPE_CHECKING:
    from marinbuild.report.records import StepRecord

__all__ = ["DOWNSTREAM_DEPTH", "evaluators", "field_columns", "flat_versioned", "group_of", "upstream_fields"]

DOWNSTREAM_DEPTH = 3
"""Steps below a row looked at for its evaluation: an eval, or a step after a conversion or two."""


def group_of(name: str) -> str:
    """The name a step's fields go under beside another step's of the same name: its first path part
    (``train`` for ``train/lr0.1-seed0``), so that every row's training fills the same column.

    >>> group_of("train/lr0.1-seed0"), group_of("data")
    ('train', 'data')
    """
    return name.split("/", 1)[0]


def flat_versioned(payload: Mapping[str, Any]) -> dict[str, Any]:
    """A step's versioned config values by dotted path, from its identity payload."""
    from marinbuild.report.records import flatten

    versioned = payload.get("versioned")
    return flatten(dict(versioned)) if versioned else {}


def upstream_fields(graph: StepGraph, names: Iterable[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """For each named step, the versioned fields of every step upstream of it, by group (see
    :func:`group_of`; a step's full name where two upstream steps of one row share a group)."""
    dag = graph.dag
    index = graph.index
    out: dict[str, dict[str, dict[str, Any]]] = {}
    flat: dict[str, dict[str, Any]] = {}
    for name in names:
        ancestors = sorted(nx.ancestors(dag, name), key=index.__getitem__) if dag.in_degree(name) else []
        groups = [group_of(a) for a in ancestors]
        fields: dict[str, dict[str, Any]] = {}
        for ancestor, group in zip(ancestors, groups, strict=True):
            if ancestor not in flat:  # a step upstream of many rows is flattened once
                flat[ancestor] = flat_versioned(graph.nodes[ancestor].payload)
            values = flat[ancestor]
            if values:
                fields[ancestor if groups.count(group) > 1 else group] = values
        out[name] = fields
    return out


def evaluators(graph: StepGraph, names: Sequence[str]) -> dict[str, list[str]]:
    """For each named step, the steps downstream that evaluate it alone, nearest first: a descendant
    (within :data:`DOWNSTREAM_DEPTH` steps) none of whose other ancestors is among ``names``, but for
    the row's own upstream (``eval/lr0.1`` evaluates ``train/lr0.1``, beside ``data``; a summary over
    every training evaluates none)."""
    dag = graph.dag
    rows = set(names)
    out: dict[str, list[str]] = {}
    for name in names:
        found: list[str] = []
        frontier = [name]
        above = nx.ancestors(dag, name) | {name}  # rows upstream of this one (its data) are its own chain
        for _ in range(DOWNSTREAM_DEPTH):
            frontier = [s for f in frontier for s in dag.successors(f) if s not in rows]
            frontier = list(dict.fromkeys(frontier))
            found += [s for s in frontier if not (nx.ancestors(dag, s) & rows) - above]
        out[name] = list(dict.fromkeys(found))
    return out


def field_columns(records: Sequence[StepRecord], every: bool = False) -> tuple[list[str], list[dict[str, Any]]]:
    """The config columns of a table of ``records`` and each row's values in them.

    A row's own versioned fields come first, by dotted path; then the fields of the steps upstream,
    by dotted path too, or ``STEP.FIELD`` (``train.seed``) where another step of the rows' chains has
    a field of that name. Only the columns whose values differ between the rows are kept, unless
    ``every``.
    """
    own: dict[str, None] = {}
    for r in records:
        own.update(dict.fromkeys(r.versioned))
    upstream: dict[tuple[str, str], None] = {}
    for r in records:
        for group, theirs in r.upstream.items():
            upstream.update(dict.fromkeys((group, f) for f in theirs))
    by_field: dict[str, set[str]] = {}
    for group, f in upstream:
        by_field.setdefault(f, set()).add(group)
    named = {
        (group, f): f if len(by_field[f]) == 1 and f not in own else f"{group}.{f}" for group, f in upstream
    }
    columns = [*own, *(n for n in named.values() if n not in own)]
    values: list[dict[str, Any]] = []
    for r in records:
        row = {f: r.versioned.get(f) for f in own}
        for (group, f), column in named.items():
            if column not in row and f in r.upstream.get(group, {}):
                row[column] = r.upstream[group][f]
        values.append(row)
    if not every and len(records) > 1:
        columns = [c for c in columns if len({json.dumps(v.get(c), sort_keys=True) for v in values}) > 1]
    return columns, [{c: v.get(c) for c in columns} for v in values]
