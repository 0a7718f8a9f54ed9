"""Every module of marinbuild over 100 lines has a unit-test file beside the scenario suites.

``marinbuild/store/lease.py`` is tested by ``tests/unit/store/test_lease.py``, a top-level
``marinbuild/graph.py`` by ``tests/unit/test_graph.py`` (a package's ``__init__.py`` by
``test_<package>.py`` in the package's folder). Each folder under ``tests/unit`` has an
``__init__.py``, so that two test files may share a base name.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "marinbuild"
UNIT = REPO / "tests" / "unit"
LIMIT = 100
"""Modules longer than this many lines need a unit-test file."""


def _lines(path: Path) -> int:
    with path.open("rb") as f:
        return sum(1 for _ in f)


def expected_test_file(module: Path) -> Path:
    """Where the unit tests of ``module`` (a file under marinbuild/) live."""
    rel = module.relative_to(PACKAGE)
    if rel.name == "__init__.py":
        folder = rel.parent
        name = folder.name or PACKAGE.name
        return UNIT / folder / f"test_{name}.py"
    return UNIT / rel.parent / f"test_{rel.stem}.py"


def _has_tests(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    return any(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test")
               for n in ast.walk(tree))


def test_the_check_finds_modules() -> None:
    modules = list(PACKAGE.rglob("*.py"))
    assert len(modules) > 20
    assert expected_test_file(PACKAGE / "store" / "lease.py") == UNIT / "store" / "test_lease.py"
    assert expected_test_file(PACKAGE / "graph.py") == UNIT / "test_graph.py"
    assert expected_test_file(PACKAGE / "cli" / "__init__.py") == UNIT / "cli" / "test_cli.py"


def test_every_module_over_100_lines_has_a_unit_test_file() -> None:
    missing = []
    for module in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in module.parts or _lines(module) <= LIMIT:
            continue
        wanted = expected_test_file(module)
        if not wanted.is_file():
            missing.append(f"{module.relative_to(REPO)} ({_lines(module)} lines) has no {wanted.relative_to(REPO)}")
        elif not _has_tests(wanted):
            missing.append(f"{wanted.relative_to(REPO)} (for {module.relative_to(REPO)}) defines no test")
    assert not missing, "modules over 100 lines without a unit-test file:\n" + "\n".join(missing)


def test_every_unit_test_folder_is_a_package() -> None:
    folders = [UNIT, *(p for p in UNIT.rglob("*") if p.is_dir() and p.name != "__pycache__")]
    missing = [str(f.relative_to(REPO)) for f in folders if not (f / "__init__.py").is_file()]
    assert not missing, "unit-test folders without an __init__.py (test files sharing a name would clash): " + ", ".join(missing)


NAMED_AFTER_A_MODULE: set[str] = set()
"""Scenario suites in tests/ still named after a module; empty, and it stays so."""


def test_no_scenario_suite_is_named_after_a_module() -> None:
    """A module's tests live in its unit file: a file directly in tests/ is named for the behaviour it tests."""
    modules = {p.stem for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    modules |= {p.name for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"}  # packages too
    named = {p.name for p in (REPO / "tests").glob("test_*.py") if p.stem.removeprefix("test_") in modules}
    assert sorted(named - NAMED_AFTER_A_MODULE) == [], "merge these into tests/unit/ or name them for what they test"
    assert sorted(NAMED_AFTER_A_MODULE - named) == [], "renamed or merged: strike them out of NAMED_AFTER_A_MODULE"
