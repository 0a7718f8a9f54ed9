"""The package itself: `import marinbuild` loads nothing else; its public names come from their modules."""

from __future__ import annotations

import pytest

import marinbuild
from tests.helpers import python_code


def test_importing_the_package_loads_none_of_its_modules() -> None:
    done = python_code("""
        import sys
        import marinbuild
        print(sorted(m for m in sys.modules if m.startswith("marinbuild.")))
    """)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_public_name_is_the_one_its_module_defines() -> None:
    import importlib

    assert sorted(marinbuild._HOMES) == sorted(marinbuild.__all__)  # one list of public names, kept whole
    for name in marinbuild.__all__:
        value = getattr(marinbuild, name)
        assert value is getattr(importlib.import_module(marinbuild._HOMES[name]), name)
        assert name in dir(marinbuild)
    with pytest.raises(AttributeError, match="no attribute 'stepz'"):
        marinbuild.stepz  # noqa: B018
    with pytest.raises(ImportError, match="cannot import name 'stepz'"):
        exec("from marinbuild import stepz")
