"""The exceptions marinbuild raises, as one small tree (defined in :mod:`marinbuild.store.errors`,
the bottom layer, so that the store can raise them too; this is their public name).

::

    MarinbuildError                 base; ``exit_code`` says how the CLI exits
    ├── UserError  (exit 2)         bad input: the user must change something
    │   ├── MarinfileError          missing file, syntax error, exception while loading
    │   ├── StepDefinitionError     bad name, duplicate name, bad template
    │   ├── IdentityError           a config value that cannot be hashed
    │   ├── TargetError             an unknown target
    │   ├── CycleError              the step graph has a cycle
    │   ├── ResourceError           a request no machine or slice could satisfy
    │   └── ClusterConfigError      a cluster file that does not validate
    ├── StorageError (exit 1)       the store failed after retries
    └── LeaseLost    (exit 1)       this runner no longer holds a step's lease

Every message is one line meant for a user; the CLI prints it without a traceback
unless ``-v`` is given.
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
