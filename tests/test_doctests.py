"""Every docstring example in the package runs, as written, and shows what it says."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import marinbuild

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(marinbuild.__path__, "marinbuild.") if not m.name.endswith("__main__")
)


def test_the_package_has_examples_to_run():
    found = 0
    for name in MODULES:
        found += len([t for t in doctest.DocTestFinder().find(importlib.import_module(name)) if t.examples])
    assert found >= 40


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # an example that writes (a default prefix, say) writes here
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False)
    if result.failed:
        # Run again, verbose about the failures only, so the report shows them.
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        out: list[str] = []
        for test in doctest.DocTestFinder().find(module):
            runner.run(test, out=out.append)
        pytest.fail(f"{result.failed} of {result.attempted} examples failed in {name}:\n" + "".join(out))
