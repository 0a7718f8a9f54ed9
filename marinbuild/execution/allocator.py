"""Hand out this machine's capacity to steps, all or nothing, and take it back.

An :class:`Allocator` holds what is free as a :class:`~marinbuild.capacity.Capacity`.
``try_allocate`` first works out the whole allocation against the free pool and only
then takes it, so a request that lacks one dimension takes nothing (there is never
anything to roll back). Cores go out as concrete ids (lowest first), GPUs as device
indices, accelerator slices by name, all slices of one type (:mod:`marinbuild.slice_fit`); memory and named resources are
counted; tokens must be offered and are not used up. Wall time is not counted here:
the runner enforces it.

``check_fits`` answers the plan-time question: could this request ever fit, even on an
idle machine? If not, the message names the step and the ``ResourceConfig`` field.

The allocator takes a lock around each change, so it may be shared between threads,
though the scheduler calls it from one.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, replace

from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError
from marinbuild.resources import Cores, Gpus, Request, ResourceLike, as_request
from marinbuild.slice_fit import SHORTAGE_WORDS, fit_slices, move_slices, slice_env
from marinbuild.units import format_bytes

__all__ = ["THREAD_ENV_VARS", "Allocation", "Allocator", "check_fits", "shortage"]

THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


@dataclass(frozen=True)
class Allocation:
    """What one step was given: an allocated request naming its cores, GPUs and slices.

    ``machine_has_gpus`` decides whether ``CUDA_VISIBLE_DEVICES`` is set: on a GPU machine
    a step sees exactly its GPUs (none when it asked for none); elsewhere the variable is
    left alone.

    >>> Allocation(Cores([0, 1]) & Gpus([1]), machine_has_gpus=True).env()["CUDA_VISIBLE_DEVICES"]
    '1'
    """

    request: Request
    machine_has_gpus: bool = False

    def env(self) -> dict[str, str]:
        """Environment variables for the step's process.

        Thread-pool sizes follow the core count (at least 1) so that numerical libraries
        do not each start one thread per machine core; ``MARINBUILD_CORES`` lists the ids.

        >>> Allocation(as_request(Cores([2, 3]))).env()["OMP_NUM_THREADS"]
        '2'
        """
        req = self.request
        env = dict.fromkeys(THREAD_ENV_VARS, str(max(1, req.N)))
        env["MARINBUILD_CORES"] = ",".join(map(str, req.core_ids))
        if req.memory is not None:
            env["MARINBUILD_MEMORY"] = str(req.nbytes)
        if self.machine_has_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, req.gpu_ids))
        env.update(slice_env(req))
        return env


class Allocator:
    """The free pools of one machine; ``try_allocate`` and ``release`` move capacity in and out.

    >>> alloc = Allocator(Capacity(cores=(0, 1), memory=2**30))
    >>> a = alloc.try_allocate(Cores(1))
    >>> a.request.core_ids, alloc.try_allocate(Cores(2))
    ((0,), None)
    >>> alloc.release(a); alloc.free == alloc.capacity
    True
    """

    def __init__(self, capacity: Capacity) -> None:
        self._capacity = capacity
        self._free = capacity
        self._live: Counter[Allocation] = Counter()
        self._lock = threading.Lock()

    @property
    def capacity(self) -> Capacity:
        """Everything this allocator can ever hand out."""
        return self._capacity

    @property
    def free(self) -> Capacity:
        """What is not handed out now (tokens are always all offered)."""
        return self._free

    @property
    def in_use(self) -> Capacity:
        """What is handed out now; ``free`` and ``in_use`` add up to ``capacity``."""
        cap, free = self._capacity, self._free
        return Capacity(
            cores=tuple(sorted(set(cap.cores) - set(free.cores))),
            memory=cap.memory - free.memory,
            gpus=tuple(sorted(set(cap.gpus) - set(free.gpus))),
            gpu_type=cap.gpu_type,
            custom={k: v - free.custom[k] for k, v in cap.custom.items() if v != free.custom[k]},
            slices={t: used for t, names in cap.slices.items() if (used := _minus(names, free.slices[t]))},
        )

    @property
    def allocations(self) -> tuple[Allocation, ...]:
        """The allocations not yet released."""
        return tuple(self._live.elements())

    def can_allocate(self, request: ResourceLike) -> bool:
        """Whether ``try_allocate(request)`` would succeed now; reserves nothing."""
        return isinstance(_fit(as_request(request), self._free), Request)

    def try_allocate(self, request: ResourceLike) -> Allocation | None:
        """Take everything ``request`` asks for, or nothing; None when anything is short now.

        An allocated request (from an earlier allocation) asks for exactly its ids.
        """
        req = as_request(request)
        with self._lock:
            fitted = _fit(req, self._free)
            if not isinstance(fitted, Request):
                return None
            self._free = _move(self._free, fitted, -1, self._capacity)
            allocation = Allocation(fitted, machine_has_gpus=bool(self._capacity.gpus))
            self._live[allocation] += 1
            return allocation

    def release(self, allocation: Allocation) -> None:
        """Give back what ``allocation`` holds; releasing one not held is a ValueError."""
        with self._lock:
            if self._live[allocation] == 0:
                raise ValueError(f"{allocation.request!r} is not held from this allocator")
            self._live[allocation] -= 1
            self._free = _move(self._free, allocation.request, +1, self._capacity)


def check_fits(step_name: str, request: ResourceLike, capacity: Capacity) -> None:
    """Raise ResourceError when ``request`` could never fit ``capacity``, naming the step and field.

    >>> check_fits("train", Cores(3), Capacity(cores=(0, 1)))
    Traceback (most recent call last):
    ...
    marinbuild.errors.ResourceError: step 'train' asks for cpu=3 but this machine offers 2 (use --cores to change)
    """
    fitted = _fit(as_request(request), capacity)
    if not isinstance(fitted, Request):
        raise ResourceError(f"step {step_name!r} {fitted}")


# ---------------------------------------------------------------------------------------
# Fitting a request into a pool: one pure function gives the allocation or the reason.


def _fit(req: Request, pool: Capacity) -> Request | str:
    """``req`` allocated from ``pool``, or why not (a phrase following "step 'x' ...")."""
    fitted = req
    if req.cores is not None:
        ids = _pick(pool.cores, req.cores.N, req.cores.ids)
        if ids is None:
            return _cores_reason(req.cores, pool)
        fitted = replace(fitted, cores=Cores(ids))
    if req.nbytes > pool.memory:
        return (
            f"asks for ram={format_bytes(req.nbytes)} but this machine offers "
            f"{format_bytes(pool.memory)} (use --mem to change)"
        )
    if req.gpus is not None:
        gpus = _fit_gpus(req.gpus, pool)
        if isinstance(gpus, str):
            return gpus
        fitted = replace(fitted, gpus=gpus)
    if req.slices is not None:
        slices = fit_slices(req.slices, pool)
        if isinstance(slices, str):
            return slices
        fitted = replace(fitted, slices=slices)
    for name, n in req.custom.items():
        if n > pool.custom.get(name, 0):
            return (
                f"asks for resources.{name}={n} but this machine offers {pool.custom.get(name, 0)} "
                f"(use --resources {name}=N to change)"
            )
    if not req.tokens <= pool.tokens:
        token = min(req.tokens - pool.tokens)
        return f"needs token {token!r}, which is not offered (use --token {token} to offer it)"
    return fitted


def shortage(request: ResourceLike, pool: Capacity) -> str:
    """What ``request`` lacks in ``pool``, in a word or two ("cores", "memory", "a GPU"); "" if it fits.

    >>> shortage(Cores(2), Capacity(cores=(0,)))
    'cores'
    """
    reason = _fit(as_request(request), pool)
    if isinstance(reason, Request):
        return ""
    for needle, word in (
        ("asks for cpu", "cores"), ("asks for cores", "cores"), ("asks for ram", "memory"),
        ("gpu", "a GPU"), ("GPU", "a GPU"), SHORTAGE_WORDS, ("token", "a token"),
    ):
        if needle in reason:
            return word
    if "resources." in reason:
        return reason.split("resources.", 1)[1].split("=", 1)[0]
    return "resources"


def _pick(free: tuple[int, ...], n: int, wanted: tuple[int, ...] | None) -> tuple[int, ...] | None:
    """The ``wanted`` ids if all are free, else the lowest ``n`` free ids; None if short."""
    if wanted is not None:
        return wanted if set(wanted) <= set(free) else None
    return free[:n] if len(free) >= n else None


def _cores_reason(cores: Cores, pool: Capacity) -> str:
    if cores.ids is not None:
        missing = sorted(set(cores.ids) - set(pool.cores))
        return f"asks for cores {missing} which this machine does not offer (it offers {list(pool.cores)})"
    return f"asks for cpu={cores.N} but this machine offers {len(pool.cores)} (use --cores to change)"


def _fit_gpus(gpus: Gpus, pool: Capacity) -> Gpus | str:
    if gpus.gpu_type is not None and not (pool.gpu_type and gpus.gpu_type.lower() in pool.gpu_type.lower()):
        offered = f"has {pool.gpu_type!r}" if pool.gpu_type else "has no GPUs of one known type"
        return f"asks for gpu_type={gpus.gpu_type!r} but this machine {offered}"
    ids = _pick(pool.gpus, gpus.n, gpus.ids)
    if ids is None:
        if gpus.ids is not None:
            return f"asks for GPUs {list(gpus.ids)} but this machine offers {list(pool.gpus)}"
        return f"asks for gpu count={gpus.n} but this machine offers {_plural(len(pool.gpus), 'GPU')}"
    return Gpus(ids, gpus.gpu_type)


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _minus(names: tuple[str, ...], taken: tuple[str, ...]) -> tuple[str, ...]:
    gone = set(taken)
    return tuple(n for n in names if n not in gone)


def _move(pool: Capacity, req: Request, sign: int, whole: Capacity) -> Capacity:
    """``pool`` with an allocated ``req`` taken out (sign -1) or put back (sign +1)."""
    slices = move_slices(pool.slices, req, sign, whole.slices)
    return replace(
        pool,
        cores=_shift(pool.cores, req.core_ids, sign),
        memory=pool.memory + sign * req.nbytes,
        gpus=_shift(pool.gpus, req.gpu_ids, sign),
        custom={k: n + sign * req.custom.get(k, 0) for k, n in pool.custom.items()},
        slices=slices,
    )


def _shift(ids: tuple[int, ...], moved: tuple[int, ...], sign: int) -> tuple[int, ...]:
    return tuple(sorted(set(ids) - set(moved))) if sign < 0 else tuple(sorted({*ids, *moved}))
