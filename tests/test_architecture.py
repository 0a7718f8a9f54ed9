"""The layout's rules (docs/architecture.md), checked on the source: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "marinbuild"

# Third-party packages each confined to one part of the tree.
CONFINED = {
    "typer": "cli/",
    "rich": "cli/",
    "click": "cli/",
    "fsspec": "store/",
    "gcsfs": "store/",
    "paramiko": "backends/tpu/",
    "ray": "backends/ray/",
    "jax": "(nowhere: steps import it, marinbuild does not)",
}

# The planning core decides; it never reaches into running steps or the terminal. (It may read
# stored records through store/: staleness is decided from status markers.)
CORE = ["steps.py", "config_walk.py", "identity.py", "graph.py", "staleness.py", "planner.py", "resources.py",
        "units.py", "tpu_types.py", "errors.py"]
EDGES = ("marinbuild.execution", "marinbuild.backends", "marinbuild.cli")


def _imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def test_optional_and_interface_packages_are_imported_only_where_they_belong():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for name in _imports(path):
            top = name.split(".")[0]
            if top in CONFINED and not where.startswith(CONFINED[top]):
                wrong.append(f"{where} imports {name} (allowed only in {CONFINED[top]})")
    assert wrong == []


def test_the_planning_core_does_not_import_the_edges():
    wrong = []
    for module in CORE:
        path = PACKAGE / module
        if not path.exists():
            continue
        for name in _imports(path):
            if name.startswith(EDGES):
                wrong.append(f"{module} imports {name}")
    assert wrong == []


def test_nothing_but_the_cli_imports_the_cli():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("cli/") or where in ("__main__.py", "api.py"):
            continue
        wrong += [f"{where} imports {n}" for n in _imports(path) if n.startswith("marinbuild.cli")]
    assert wrong == []
