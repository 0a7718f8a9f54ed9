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

__all__ = ["DOWNSTREAM_DEPTH", "evaluators", "field_columns", "flat_versioned", "group_of", "grouped", "upstream_fields"]

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
    :func:`group_of` and :func:`grouped`)."""
    dag = graph.dag
    index = graph.index
    out: dict[str, dict[str, dict[str, Any]]] = {}
    flat: dict[str, dict[str, Any]] = {}
    for name in names:
        ancestors = sorted(nx.ancestors(dag, name), key=index.__getitem__) if dag.in_degree(name) else []
        for ancestor in ancestors:
            if ancestor not in flat:  # a step upstream of many rows is flattened once
                flat[ancestor] = flat_versioned(graph.nodes[ancestor].payload)
        out[name] = grouped([(a, flat[a]) for a in ancestors])
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

    A field is one column wherever it comes from: a training row's own ``lr`` and an eval row's
    training's ``lr`` fill the same column, as the same run of the chain. Its name is the dotted
    path, or ``STEP.FIELD`` (``train.seed``, ``data.seed``) where steps of two groups (see
    :func:`group_of`) have a field of that name; where every row is of one group, that group's own
    fields keep the bare name. A row's own fields come first, then those upstream. Only the columns
    whose values differ between the rows are kept, unless ``every``: a column a step of another
    kind leaves empty (the data row of a table of trainings) does not differ for that.
    """
    # Without any step upstream (a sweep of single steps, named as they like) a field is one column.
    chain = any(r.upstream for r in records)

    def own_group(r: StepRecord) -> str:
        return group_of(r.name) if chain else ""

    keys: dict[tuple[str, str], None] = {}
    for r in records:
        keys.update(dict.fromkeys((own_group(r), f) for f in r.versioned))
    for r in records:
        for group, theirs in r.upstream.items():
            keys.update(dict.fromkeys((group, f) for f in theirs))
    by_field: dict[str, set[str]] = {}
    for group, f in keys:
        by_field.setdefault(f, set()).add(group)
    row_groups = {own_group(r) for r in records}
    home = next(iter(row_groups)) if len(row_groups) == 1 else None
    named = {(group, f): f if len(by_field[f]) == 1 or group == home else f"{group}.{f}" for group, f in keys}
    columns = list(dict.fromkeys(named.values()))
    values: list[dict[str, Any]] = []
    for r in records:
        row: dict[str, Any] = {}
        for (group, f), column in named.items():
            theirs = r.versioned if group == own_group(r) and f in r.versioned else r.upstream.get(group, {})
            if column not in row and f in theirs:
                row[column] = theirs[f]
        values.append(row)
    if not every and len(records) > 1:
        columns = [c for c in columns if _differs(c, [own_group(r) for r in records], values)]
    return columns, [{c: v.get(c) for c in columns} for v in values]


def _differs(column: str, groups: Sequence[str], values: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a column says something of the rows: two values, or a value some rows of one group
    have and others of that group lack (a field only some trainings declare)."""
    if len({json.dumps(v[column], sort_keys=True, default=str) for v in values if v.get(column) is not None}) > 1:
        return True
    by_group: dict[str, set[bool]] = {}
    for group, v in zip(groups, values, strict=True):
        by_group.setdefault(group, set()).add(v.get(column) is None)
    return any(len(seen) > 1 for seen in by_group.values())


def grouped(ancestors: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The versioned fields of a row's ``(step name, fields)`` upstream, by group. Where several
    steps upstream share a group (a summary over six trainings), the group holds the fields they
    all agree on (their ``hidden``, not their ``lr``: the summary has no one ``lr``).

    >>> grouped([("data", {"n": 1}), ("train/a", {"lr": 0.1, "hidden": 64}), ("train/b", {"lr": 0.2, "hidden": 64})])
    {'data': {'n': 1}, 'train': {'hidden': 64}}
    """
    by_group: dict[str, list[Mapping[str, Any]]] = {}
    for name, values in ancestors:
        by_group.setdefault(group_of(name), []).append(values)
    out: dict[str, dict[str, Any]] = {}
    for group, all_values in by_group.items():
        first, *rest = all_values
        agreed = {f: v for f, v in first.items()
                  if all(f in other and json.dumps(other[f], sort_keys=True, default=str) == json.dumps(v, sort_keys=True, default=str)
                         for other in rest)}
        if agreed:
            out[group] = agreed
    return out
