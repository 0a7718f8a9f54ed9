"""Accelerator slices in a pool: which free slices a request gets, the variables naming them,
and the pool with them taken out or put back.

Slices are handed out by name, all of one type, in the order the pool lists them (the
cluster file's). The allocator (:mod:`marinbuild.execution.allocator`) calls these for a
request's ``slices``; they are the resource language's, as :mod:`marinbuild.resources` is.
"""

from __future__ import annotations

from collections.abc import Mapping

from marinbuild.capacity import Capacity
from marinbuild.resources import Request, Slices

__all__ = ["SHORTAGE_WORDS", "fit_slices", "move_slices", "slice_env"]

SHORTAGE_WORDS = ("tpu", "a TPU slice")
"""What a slice request's refusal mentions, and the words a waiting step's shortage is told in."""


def slice_env(request: Request) -> dict[str, str]:
    """The variables naming an allocated request's slices (none when it holds none)."""
    if request.slices is None:
        return {}
    return {"MARINBUILD_TPU_TYPE": request.slices.tpu_type, "MARINBUILD_TPU_SLICES": ",".join(request.slice_names)}


def fit_slices(slices: Slices, pool: Capacity) -> Slices | str:
    """The slices ``slices`` gets from ``pool``, or why not (a phrase following "step 'x' ...")."""
    if slices.names is not None:
        free = pool.slices.get(slices.tpu_type, ())
        if set(slices.names) <= set(free):
            return slices
    else:
        for tpu_type in slices.tpu_types:
            free = pool.slices.get(tpu_type, ())
            if slices.among is not None:
                free = tuple(name for name in free if name in slices.among)
            if len(free) >= slices.n:
                return Slices(tpu_type, names=free[: slices.n])
    wanted = " or ".join(slices.tpu_types)
    known = ", ".join(f"{t} x {len(names)}" for t, names in pool.slices.items()) or "none"
    if slices.names is not None:
        return f"asks for tpu slices {list(slices.names)} of {wanted}, which are not offered (known slices: {known})"
    most = max(len(pool.slices.get(t, ())) for t in slices.tpu_types)
    shortfall = f"only {most} of one type are offered" if most else f"no slice of type {wanted} is known"
    hint = "; name a cluster file with --cluster" if not pool.slices else ""
    count = f"{slices.n} slice{'' if slices.n == 1 else 's'}"
    return f"asks for tpu={wanted} x {count} but {shortfall} (known slices: {known}{hint})"


def move_slices(pool: Mapping[str, tuple[str, ...]], request: Request, sign: int,
                whole: Mapping[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """``pool``'s slices with an allocated request's taken out (sign -1) or put back (sign +1).

    Slices put back return to their place in ``whole``, so the hand-out order stays the
    cluster file's.
    """
    slices = dict(pool)
    if request.slices is None:
        return slices
    kind, names = request.slices.tpu_type, request.slice_names
    if sign < 0:
        gone = set(names)
        slices[kind] = tuple(n for n in slices[kind] if n not in gone)
    else:
        back = {*slices[kind], *names}
        slices[kind] = tuple(n for n in whole[kind] if n in back)
    return slices
