"""A Ray cluster as marinbuild sees it: reaching it, and where each step's request could ever fit.

Ray never refuses a task it cannot place: it waits, forever, for a node that will never
come. So before anything runs, every step's request is turned into the resources its Ray
task will claim and checked against each live node on its own. A request larger than
every single node is refused (``ResourceError``, exit 2) naming the step and the
resource, even when the cluster's total would cover it::

    nodes = connect("10.0.0.5:6379", capacity)
    placements = place(requests, nodes)     # step name -> Placement, or None: not for Ray

How a request maps (``Placement.options`` are the task's ``.options(...)``):

* ``cpu`` → ``num_cpus`` (always given, so ``cpu=0`` really claims nothing);
* ``ram`` → ``memory`` in bytes;
* GPUs → ``num_gpus``, plus ``accelerator_type`` when a type is named (matched against the
  nodes' ``accelerator_type:*`` resources ignoring case, as the local allocator does);
* ``Custom(name, n)`` → the custom resource ``name`` = n;
* ``Token(name)`` → the custom resource ``name`` = 0.001: matched, practically never used up;
* a TPU step → Ray only when it is one single-host slice and some node offers Ray's
  ``TPU-<type>-head`` resource (then ``TPU-<type>-head`` = 1 and ``TPU`` = its chips);
  every other TPU step is not placed here and keeps the backend ``run`` gives it without Ray.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from marinbuild.capacity import Capacity
from marinbuild.errors import ResourceError, UserError, missing_extra
from marinbuild.resources import FrozenMap, Request
from marinbuild.tpu_types import tpu_topology
from marinbuild.units import format_bytes

__all__ = [
    "TOKEN_SHARE",
    "Placement",
    "RayNode",
    "connect",
    "live_nodes",
    "place",
    "placement_of",
    "require_ray",
]

TOKEN_SHARE = 0.001
"""How much of a token's custom resource one step claims: a node offering ``{"gcs": 1}``
serves a thousand token-holding steps at once."""

ACCELERATOR_PREFIX = "accelerator_type:"
_FIXED = ("CPU", "memory", "GPU")


@dataclass(frozen=True)
class RayNode:
    """One live Ray node and the resources it offers in total."""

    node_id: str
    address: str
    resources: Mapping[str, float] = field(default_factory=FrozenMap)


@dataclass(frozen=True)
class Placement:
    """How a step goes to Ray: its task's options, and the node resources they claim."""

    options: Mapping[str, Any]
    demand: Mapping[str, float]


def require_ray() -> ModuleType:
    """The ``ray`` module, or one clear UserError when the optional extra is missing."""
    try:
        import ray
    except ImportError:
        # Whatever failed inside (a half-installed ray, say), the cure is the extra.
        extra = missing_extra(ModuleNotFoundError(name="ray"), "the Ray backend")
        assert extra is not None
        raise extra from None
    return ray


def connect(address: str | None, capacity: Capacity) -> tuple[RayNode, ...]:
    """Join the cluster at ``address`` (else ``$RAY_ADDRESS``, else start one here); its live nodes.

    A Ray started for the run offers what the local run would: the cores, GPUs, named
    resources and tokens of ``capacity``. Token authentication needs nothing from
    marinbuild: Ray reads ``RAY_AUTH_MODE`` and the token from the environment.
    """
    ray = require_ray()
    address = address or os.environ.get("RAY_ADDRESS") or None
    # Workers' prints go to each step's log, not the driver's terminal.
    common: dict[str, Any] = {"log_to_driver": False, "logging_level": logging.WARNING, "namespace": "marinbuild"}
    if not ray.is_initialized():
        try:
            if address is not None:
                ray.init(address=address, **common)
            else:
                # "local": a new Ray, even when a `ray start` cluster runs on this machine.
                ray.init(
                    address="local",
                    num_cpus=len(capacity.cores),
                    num_gpus=len(capacity.gpus),
                    resources={**capacity.custom, **dict.fromkeys(capacity.tokens, 1.0)},
                    include_dashboard=False,
                    **common,
                )
        except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as e:
            raise UserError(_connect_error(address, e)) from None
    return live_nodes()


def _connect_error(address: str | None, e: BaseException) -> str:
    where = f"the Ray cluster at {address}" if address else "a local Ray"
    text = " ".join(str(x) for x in (e, e.__cause__) if x is not None)
    if "InvalidAuthToken" in text or "AuthenticationError" in text or "Authentication token" in text:
        return (
            f"cannot join {where}: it requires a token; set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH) to the cluster's token"
        )
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"cannot join {where}: {first}"


def live_nodes() -> tuple[RayNode, ...]:
    """The nodes of the connected cluster that are alive now."""
    ray = require_ray()
    return tuple(
        RayNode(str(n["NodeID"]), str(n.get("NodeManagerAddress", "")), FrozenMap(n.get("Resources", {})))
        for n in ray.nodes()
        if n.get("Alive")
    )


def place(requests: Mapping[str, Request], nodes: Iterable[RayNode]) -> dict[str, Placement | None]:
    """Each step's placement (None: not for Ray); ResourceError for the first that fits no node."""
    nodes = tuple(nodes)
    placements: dict[str, Placement | None] = {}
    for name, request in requests.items():
        placement = placement_of(name, request, nodes)
        if placement is not None:
            _check_fits(name, placement.demand, nodes)
        placements[name] = placement
    return placements


def placement_of(name: str, request: Request, nodes: Iterable[RayNode]) -> Placement | None:
    """The task options for ``request``; None for a TPU step Ray cannot take whole.

    >>> placement_of("s", Request(), []).options["num_cpus"]
    0
    """
    nodes = tuple(nodes)
    demand: dict[str, float] = {}
    options: dict[str, Any] = {"num_cpus": request.N}
    if request.N:
        demand["CPU"] = request.N
    if request.nbytes:
        options["memory"] = demand["memory"] = request.nbytes
    if request.gpus is not None:
        options["num_gpus"] = demand["GPU"] = request.gpus.n
        if request.gpus.gpu_type is not None:
            kind = _accelerator(name, request.gpus.gpu_type, nodes)
            options["accelerator_type"] = kind
            demand[ACCELERATOR_PREFIX + kind] = TOKEN_SHARE
    resources: dict[str, float] = {k: float(v) for k, v in request.custom.items()}
    resources.update(dict.fromkeys(sorted(request.tokens), TOKEN_SHARE))
    if request.slices is not None:
        tpu = _tpu_resources(request, nodes)
        if tpu is None:
            return None
        resources.update(tpu)
    reserved = sorted(set(resources) & {*_FIXED, "object_store_memory"})
    if reserved:
        raise ResourceError(f"step {name!r}: {reserved[0]!r} is Ray's own resource; it cannot be a custom resource or token")
    if resources:
        options["resources"] = resources
        demand.update(resources)
    return Placement(FrozenMap(options), FrozenMap(demand))


def _accelerator(name: str, gpu_type: str, nodes: tuple[RayNode, ...]) -> str:
    """The cluster's accelerator type matching ``gpu_type``: an exact match first, else the first by name."""
    offered = sorted({k[len(ACCELERATOR_PREFIX) :] for n in nodes for k in n.resources if k.startswith(ACCELERATOR_PREFIX)})
    wanted = gpu_type.lower()
    exact = [k for k in offered if k.lower() == wanted]
    close = [k for k in offered if wanted in k.lower() or k.lower() in wanted]
    if exact or close:
        return (exact or close)[0]
    known = ", ".join(offered) or "none"
    raise ResourceError(f"step {name!r} asks for gpu_type={gpu_type!r} but no live Ray node has it (accelerator types: {known})")


def _tpu_resources(request: Request, nodes: tuple[RayNode, ...]) -> dict[str, float] | None:
    """Ray's TPU resources for a single-host, single-slice step whose type some node heads."""
    slices = request.slices
    assert slices is not None
    if slices.n != 1:
        return None  # multislice needs the MEGASCALE gang the SSH backend builds
    for tpu_type in slices.tpu_types:
        topology = tpu_topology(tpu_type)
        head = f"TPU-{tpu_type}-head"
        if topology.vm_count == 1 and any(head in n.resources for n in nodes):
            return {head: 1.0, "TPU": float(topology.chips_per_vm)}
    return None


def _check_fits(name: str, demand: Mapping[str, float], nodes: tuple[RayNode, ...]) -> None:
    if any(all(n.resources.get(k, 0.0) >= v for k, v in demand.items()) for n in nodes):
        return
    for key in sorted(demand, key=_order):
        best = max((n.resources.get(key, 0.0) for n in nodes), default=0.0)
        if best < demand[key]:
            raise ResourceError(
                f"step {name!r} asks for {_field(key, demand[key])} but no live Ray node offers that "
                f"(the largest offers {_amount(key, best)}); Ray would wait for it forever"
            )
    wanted = ", ".join(_field(k, v) for k, v in sorted(demand.items(), key=lambda kv: _order(kv[0])))
    raise ResourceError(
        f"step {name!r} asks for {wanted} but no single live Ray node offers all of them together; "
        "Ray would wait for it forever"
    )


def _order(key: str) -> tuple[int, str]:
    return (_FIXED.index(key), key) if key in _FIXED else (len(_FIXED), key)


def _field(key: str, value: float) -> str:
    """A Ray resource amount in the words of ResourceConfig."""
    if key == "CPU":
        return f"cpu={value:g}"
    if key == "memory":
        return f"ram={format_bytes(int(value))}"
    if key == "GPU":
        return f"gpu count={value:g}"
    if key.startswith(ACCELERATOR_PREFIX):
        return f"gpu_type={key[len(ACCELERATOR_PREFIX) :]!r}"
    if value == TOKEN_SHARE:
        return f"token {key!r}"
    return f"resources.{key}={value:g}"


def _amount(key: str, value: float) -> str:
    if key == "memory":
        return format_bytes(int(value))
    if value == 0:
        return "none"
    return f"{value:g}"
