"""The exceptions marinbuild raises: their public name.

They are defined in :mod:`marinbuild.store.errors`, the bottom layer, so that the store can raise
them too; the tree of classes and what each means is drawn in that module's docstring.
"""

from __future__ import annotations

from marinbuild.store.errors import (
    EXTRAS,
    ClusterConfigError,
    CycleError,
    IdentityError,
    LeaseLost,
    MarinbuildError,
    MarinfileError,
    MissingExtra,
    ResourceError,
    StepDefinitionError,
    StorageError,
    TargetError,
    UserError,
    missing_extra,
)

__all__ = [
    "EXTRAS",
    "ClusterConfigError",
    "CycleError",
    "IdentityError",
    "LeaseLost",
    "MarinbuildError",
    "MarinfileError",
    "MissingExtra",
    "ResourceError",
    "StepDefinitionError",
    "StorageError",
    "TargetError",
    "UserError",
    "missing_extra",
]
