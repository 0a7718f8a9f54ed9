"""The exceptions marinbuild raises, as one small tree (public as :mod:`marinbuild.errors`).

They live at the bottom of the layers, in the store package, the lowest one: every part of
marinbuild raises them, the store included, and the store imports nothing above it.

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


class MarinbuildError(Exception):
    """Base of every error marinbuild raises on purpose."""

    exit_code = 1


class UserError(MarinbuildError):
    """Bad input: the CLI prints one line and exits 2."""

    exit_code = 2


class MarinfileError(UserError):
    """The Marinfile is missing, does not parse, or raised while loading."""


class StepDefinitionError(UserError):
    """A step is declared wrongly (name, duplicate, template)."""


class IdentityError(UserError):
    """A config value cannot be encoded canonically, so it cannot be hashed."""


class TargetError(UserError):
    """A target names no declared step."""


class CycleError(UserError):
    """The step graph has a cycle."""


class ResourceError(UserError):
    """A resource request that nothing available could ever satisfy."""


class ClusterConfigError(UserError):
    """A cluster file that is missing, malformed or inconsistent."""


class StorageError(MarinbuildError):
    """A storage operation failed for good (after its retries)."""


class LeaseLost(MarinbuildError):
    """This runner lost the lease of a step it was running."""


EXTRAS = {"paramiko": "tpu", "gcsfs": "gcs", "jax": "jax", "jaxlib": "jax", "ray": "ray", "virtualenv": "ray"}
"""Optional packages and the extra of ``marinbuild`` that installs each."""


class MissingExtra(UserError):
    """An optional package is not installed; the message names the extra that installs it."""


def missing_extra(error: ImportError, needed_for: str = "this") -> MissingExtra | None:
    """One line naming the extra for a missing optional package, or None for any other import error.

    >>> print(missing_extra(ModuleNotFoundError("No module named 'paramiko'", name="paramiko"), "TPU steps"))
    TPU steps need paramiko, which is not installed: pip install 'marinbuild[tpu]' (in a checkout: pip install -e '.[tpu]')
    """
    name = (getattr(error, "name", None) or "").split(".")[0]
    extra = EXTRAS.get(name)
    if extra is None:
        return None
    verb = "need" if needed_for.endswith("steps") else "needs"
    return MissingExtra(
        f"{needed_for} {verb} {name}, which is not installed: pip install 'marinbuild[{extra}]' "
        f"(in a checkout: pip install -e '.[{extra}]')"
    )


# Tracebacks and reprs name them as users import them: marinbuild.errors.UserError.
for _public in (MarinbuildError, UserError, MarinfileError, StepDefinitionError, IdentityError, TargetError, CycleError,
                ResourceError, ClusterConfigError, StorageError, LeaseLost, MissingExtra):
    _public.__module__ = "marinbuild.errors"
