"""Unit tests of marinbuild.store.errors: the error family, exit codes, the one line for a missing extra."""

from __future__ import annotations

import pytest

from marinbuild.store.errors import (
    EXTRAS,
    ClusterConfigError,
    CycleError,
    LeaseLost,
    MarinbuildError,
    MarinfileError,
    MissingExtra,
    StepDefinitionError,
    StorageError,
    UserError,
    missing_extra,
)


@pytest.mark.parametrize("cls", [MarinfileError, StepDefinitionError, CycleError, ClusterConfigError, MissingExtra])
def test_user_errors_are_marinbuild_errors(cls: type) -> None:
    assert issubclass(cls, UserError) and issubclass(cls, MarinbuildError)


def test_store_and_lease_errors_are_not_the_users_fault() -> None:
    assert not issubclass(StorageError, UserError)
    assert not issubclass(LeaseLost, UserError)


def test_exit_codes() -> None:
    assert (UserError.exit_code, CycleError.exit_code, StorageError.exit_code, LeaseLost.exit_code) == (2, 2, 1, 1)
    assert MarinbuildError("x").exit_code == 1


def test_the_public_names_are_these_classes() -> None:
    import marinbuild.errors as public
    import marinbuild.store.errors as own

    assert all(getattr(public, name) is getattr(own, name) for name in public.__all__)


@pytest.mark.parametrize(("package", "extra"), sorted(EXTRAS.items()))
def test_missing_extra_names_the_extra(package: str, extra: str) -> None:
    error = missing_extra(ModuleNotFoundError(f"No module named '{package}'", name=f"{package}.sub"), "TPU steps")
    assert isinstance(error, MissingExtra)
    assert f"TPU steps need {package}," in str(error)
    assert f"pip install 'marinbuild[{extra}]'" in str(error)
    assert "\n" not in str(error)


def test_missing_extra_singular_subject() -> None:
    error = missing_extra(ModuleNotFoundError("x", name="gcsfs"), "prefix 'gs://b'")
    assert str(error).startswith("prefix 'gs://b' needs gcsfs")


def test_other_import_errors_are_not_a_missing_extra() -> None:
    assert missing_extra(ModuleNotFoundError("x", name="numpy")) is None
    assert missing_extra(ImportError("cannot import name")) is None
