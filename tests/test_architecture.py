"""The layout's rules (docs/architecture.md), checked on the source: who may import what, and names.

Imports are read with ``ast`` everywhere in a module: at the top, inside functions, and under
``if TYPE_CHECKING:`` (a type-only import is still a dependency a reader must follow).
"""

from __future__ import annotations

import ast
import collections
import functools
import io
import re
import tokenize
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
CORE = ["steps.py", "config_walk.py", "identity.py", "graph.py", "staleness.py", "planner.py", "resources.py", "resource_parts.py",
        "units.py", "tpu_types.py", "slice_fit.py", "accounting.py", "errors.py"]
EDGES = ("marinbuild.execution", "marinbuild.backends", "marinbuild.cli")

PACKAGES = ("store", "execution", "backends", "report", "pyenv", "cli")
"""The packages of marinbuild; every other module at the top level belongs to the core."""
FACADE = ("__init__.py", "__main__.py", "api.py")
"""The public face above every layer: it may import any of them, and none imports it back."""
LAYERS = ("store", "core", "pyenv", "backends", "execution", "report", "cli")
"""Lowest first: a package imports only packages at or below its own layer."""


@functools.cache
def _source(path: Path) -> str:
    """The text of a package file, read once for every test."""
    return path.read_text()


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The syntax tree of a package file, parsed once for every test (read, never changed)."""
    return ast.parse(_source(path), str(path))


@functools.cache
def _imports(path: Path) -> tuple[str, ...]:
    """Every module ``path`` imports, wherever the import statement stands."""
    names: list[str] = []
    for node in ast.walk(_tree(path)):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
            if node.module == "marinbuild":  # `from marinbuild import x` may name a module
                names.extend(f"marinbuild.{alias.name}" for alias in node.names)
    return tuple(names)


def _package_of(module: str) -> str | None:
    """The layer a ``marinbuild.…`` module belongs to; None for the facade and other libraries."""
    parts = module.split(".")
    if parts[0] != "marinbuild":
        return None
    if len(parts) == 1 or parts[1] in ("api", "__main__"):
        return None
    return parts[1] if parts[1] in PACKAGES else "core"


def _where(path: Path) -> str:
    rel = path.relative_to(PACKAGE)
    return "facade" if rel.as_posix() in FACADE else (rel.parts[0] if len(rel.parts) > 1 else "core")


def _package_edges() -> dict[tuple[str, str], list[str]]:
    edges: dict[tuple[str, str], list[str]] = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        source = _where(path)
        if source == "facade":
            continue
        for name in _imports(path):
            target = _package_of(name)
            if target is not None and target != source:
                edges[(source, target)].append(f"{path.relative_to(PACKAGE).as_posix()} imports {name}")
    return edges


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
    missing = [m for m in CORE if not (PACKAGE / m).exists()]
    assert missing == [], f"renamed or removed core modules: update CORE and docs/architecture.md: {missing}"
    wrong = []
    for module in CORE:
        for name in _imports(PACKAGE / module):
            if name.startswith(EDGES):
                wrong.append(f"{module} imports {name}")
    assert wrong == []


def test_every_package_and_the_facade_exist():
    missing = [p for p in PACKAGES if not (PACKAGE / p / "__init__.py").exists()]
    missing += [f for f in FACADE if not (PACKAGE / f).exists()]
    assert missing == []
    found = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert found == set(PACKAGES), "a new package must be given its layer in LAYERS and docs/architecture.md"


def test_no_package_imports_a_package_above_it():
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    upward = [why for (a, b), whys in sorted(_package_edges().items()) if rank[b] > rank[a] for why in whys]
    assert upward == []


def test_no_cycle_between_packages():
    edges = _package_edges()
    graph: dict[str, set[str]] = collections.defaultdict(set)
    for a, b in edges:
        graph[a].add(b)
    cycles = []
    for a, b in edges:
        # b reaches a again: a cycle through the edge a -> b
        seen, todo = {b}, [b]
        while todo:
            for nxt in graph[todo.pop()]:
                if nxt == a:
                    cycles.append(f"{a} -> {b} ({edges[(a, b)][0]}) and back")
                    todo = []
                    break
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
    assert cycles == []


def test_nothing_imports_the_facade():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if _where(path) == "facade":
            continue
        wrong += [f"{path.relative_to(PACKAGE).as_posix()} imports {n}" for n in _imports(path)
                  if n in ("marinbuild.api", "marinbuild.__main__")]
    assert wrong == []


def test_nothing_but_the_cli_imports_the_cli():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("cli/") or where in FACADE:
            continue
        wrong += [f"{where} imports {n}" for n in _imports(path) if n.startswith("marinbuild.cli")]
    assert wrong == []


def test_only_the_store_asks_whether_it_is_local():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith("store/"):
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Attribute) and node.attr == "is_local":
                wrong.append(f"{where}:{node.lineno}")
    assert wrong == []


def test_no_two_classes_or_functions_share_a_name():
    defined: dict[str, list[str]] = collections.defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in _tree(path).body:
            # A module's own hooks (`__getattr__`) are named by the language, not by us.
            if isinstance(node, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and not (
                node.name.startswith("__") and node.name.endswith("__")
            ):
                defined[node.name].append(path.relative_to(PACKAGE).as_posix())
    clashes = {name: where for name, where in sorted(defined.items()) if len(where) > 1}
    assert clashes == {}


def test_each_cli_command_lives_in_its_own_module_and_none_imports_the_app():
    app = _tree(PACKAGE / "cli" / "app.py")
    # The registry: (NAME, what cli/NAME.py defines for it), imported by name from that module.
    (registry,) = [ast.literal_eval(n.value) for n in app.body if isinstance(n, ast.Assign)
                   and any(isinstance(t, ast.Name) and t.id == "_REGISTRY" for t in n.targets)]
    assert len(registry) >= 9
    for name, attribute in registry:
        module = _tree(PACKAGE / "cli" / f"{name}.py")
        defined = {n.name for n in module.body if isinstance(n, ast.FunctionDef)} | {
            t.id for n in module.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert attribute in defined, f"cli/{name}.py defines no {attribute}"
    defined_in_app = [n.name for n in app.body if isinstance(n, ast.FunctionDef) and any(
        "command" in ast.unparse(d) for d in n.decorator_list)]
    assert defined_in_app == []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        if path.name != "app.py":
            assert "marinbuild.cli.app" not in _imports(path), path.name


BACKEND_WORDS = {"tpu", "tpus", "ray", "slurm", "gcp"}
"""Names of kinds of backend (and the cloud one creates slices in): the run loop knows none."""


def _words(text: str) -> list[str]:
    """The words of an identifier or a text, split at underscores, case changes and digits."""
    return [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+", text)]


def test_nothing_under_execution_names_a_kind_of_backend():
    """The run loop is told about backends only through the registry of kinds (backends/base.py):
    no name, string, docstring or comment under execution/ names one."""
    found = []
    for path in sorted((PACKAGE / "execution").rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for tok in tokenize.generate_tokens(io.StringIO(_source(path)).readline):
            if tok.type in (tokenize.NAME, tokenize.STRING, tokenize.COMMENT) or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
                named = BACKEND_WORDS.intersection(_words(tok.string))
                if named:
                    found.append(f"{where}:{tok.start[0]}: {sorted(named)} in {tok.string[:60]!r}")
    assert found == []


def test_the_retry_loop_finds_no_hook_by_name():
    """The hooks it calls are declared on ``BackendHooks`` with defaults: no ``getattr``/``hasattr`` on a backend
    (``backend_label`` walks wrappers by their ``inner`` attribute, which is no hook)."""
    source = (PACKAGE / "backends" / "retrying.py").read_text()
    calls = [ast.unparse(n) for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Name) and n.func.id in ("getattr", "hasattr")]
    assert calls == ["hasattr(backend, 'inner')"]


def test_the_backend_word_finder_finds_what_it_must():
    assert {"ray", "tpu", "gcp", "slurm"} <= set(_words("ray_address TpuDispatch 'on GCP' SLURM_JOB_ID"))
    assert not BACKEND_WORDS.intersection(_words("array stray output_path arrays Gray"))


# The size gate. A function's length is its body's, from the first statement (a docstring
# counts) to its last line; a nested function counts in its own right and in the function
# around it. Cyclomatic complexity is 1, plus 1 for each branch (`if`, a conditional
# expression, `for`, `while`, `except`, a `case`), for each `and`/`or` beyond the first operand,
# and for each `if` of a comprehension; a nested function or lambda is counted on its own. A
# module's size is its line count.
MAX_FUNCTION_LINES = 60
MAX_COMPLEXITY = 20
MAX_MODULE_LINES = 600

OVERSIZED: dict[str, dict[str, int]] = {
    # What exceeds a limit, at its size when listed: an entry may shrink, never grow, and
    # leaves this list once within the limit (the gate fails until it is struck out). Every
    # exception the gate started with has been brought within it; keep the list empty.
    "lines": {},
    "complexity": {},
    "module lines": {},
}

_BRANCHES = (ast.If, ast.IfExp, ast.For, ast.AsyncFor, ast.While, ast.ExceptHandler, ast.match_case)
_OWN_SCOPE = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def _complexity(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    count = 1
    todo = list(ast.iter_child_nodes(function))
    while todo:
        node = todo.pop()
        if isinstance(node, _OWN_SCOPE):
            continue
        if isinstance(node, _BRANCHES):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
        elif isinstance(node, ast.comprehension):
            count += len(node.ifs)
        todo.extend(ast.iter_child_nodes(node))
    return count


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method by its qualified name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append((prefix + node.name, node))
            found += _functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        elif not isinstance(node, ast.Lambda | ast.expr):
            found += _functions(node, prefix)  # under an `if`, a `try`, a `with`
    return found


def _sizes() -> dict[str, dict[str, int]]:
    sizes: dict[str, dict[str, int]] = {"lines": {}, "complexity": {}, "module lines": {}}
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        sizes["module lines"][where] = len(_source(path).splitlines())
        for name, function in _functions(_tree(path)):
            assert function.end_lineno is not None
            sizes["lines"][f"{where}:{name}"] = function.end_lineno - function.body[0].lineno + 1
            sizes["complexity"][f"{where}:{name}"] = _complexity(function)
    return sizes


def test_no_function_or_module_grows_past_the_size_gate():
    limits = {"lines": MAX_FUNCTION_LINES, "complexity": MAX_COMPLEXITY, "module lines": MAX_MODULE_LINES}
    sizes = _sizes()
    problems = []
    for measure, limit in limits.items():
        allowed = OVERSIZED[measure]
        for where, size in sorted(sizes[measure].items()):
            if size > allowed.get(where, limit):
                problems.append(f"{where}: {measure} {size} > {allowed.get(where, limit)}")
        for where in sorted(allowed):
            if where not in sizes[measure]:
                problems.append(f"{where}: gone or renamed: strike it out of OVERSIZED")
            elif sizes[measure][where] <= limit:
                problems.append(f"{where}: {measure} {sizes[measure][where]} is within {limit}: strike it out of OVERSIZED")
    assert problems == []


def test_the_size_gate_measures_what_it_must():
    source = '''
class K:
    def m(self, xs):
        """Doc."""
        if xs and xs[0] or not xs:
            return [x for x in xs if x if x > 1]
        for x in xs:
            try:
                pass
            except ValueError:
                pass
        def inner():
            return 1 if xs else 2
        return inner
'''
    ((name, method), (inner_name, inner)) = _functions(ast.parse(source))
    assert (name, inner_name) == ("K.m", "K.m.inner")
    # 1 + if + (and, or) + two comprehension ifs + for + except; the nested function's `if` is its own
    assert _complexity(method) == 8 and _complexity(inner) == 2
    assert method.end_lineno - method.body[0].lineno + 1 == 11


ARCHITECTURE_DOC = PACKAGE.parent / "docs" / "architecture.md"


def _documented_modules() -> set[str]:
    """The modules the file list of docs/architecture.md names, as paths under marinbuild/.

    Each row is a folder (``facade`` and ``core`` are the top level) and its modules in
    backquotes; what stands in parentheses is a note, not a module.
    """
    text = ARCHITECTURE_DOC.read_text()
    section = text.split("## The file list", 1)[1].split("\n## ", 1)[0]
    named: set[str] = set()
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 2 or cells[0] in ("folder", "---") or not line.startswith("|"):
            continue
        folder = "" if cells[0] in ("facade", "core") else cells[0].rstrip("/") + "/"
        without_notes = re.sub(r"\([^()]*\)", "", cells[1])
        named.update(f"{folder}{name}.py" for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", without_notes))
    return named


def test_the_architecture_docs_file_list_names_every_module_and_no_other():
    present = {p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py")
               if p.name != "__init__.py" or p.parent == PACKAGE}
    documented = _documented_modules()
    assert sorted(present - documented) == [], "modules missing from docs/architecture.md's file list"
    assert sorted(documented - present) == [], "docs/architecture.md's file list names modules that do not exist"


def _run_options() -> set[str]:
    """The fields of ``RunParameters``: every option of ``marinbuild run`` and ``marinbuild.run``."""
    tree = _tree(PACKAGE / "execution" / "run_parameters.py")
    (params,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "RunParameters"]
    return {s.target.id for s in params.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}


def _number_defaults() -> dict[str, str]:
    """Every parameter or dataclass field whose default is a number written out, as ``where:owner.name`` -> name."""
    found: dict[str, str] = {}

    def number(node: ast.AST | None) -> bool:
        return isinstance(node, ast.Constant) and type(node.value) in (int, float)

    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                args = node.args
                positional = args.posonlyargs + args.args
                pairs = [*zip(positional[len(positional) - len(args.defaults):], args.defaults, strict=True),
                         *zip(args.kwonlyargs, args.kw_defaults, strict=True)]
                found.update({f"{where}:{node.name}.{a.arg}": a.arg for a, d in pairs if number(d)})
            elif isinstance(node, ast.ClassDef):
                found.update({f"{where}:{node.name}.{s.target.id}": s.target.id for s in node.body
                              if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and number(s.value)})
    return found


def test_each_run_options_default_is_written_once():
    """The command line, ``marinbuild.run`` and ``RunParameters`` read a number default from its home
    (``RetryBudgets.failure``, ``DEFAULT_HEARTBEAT``), never write it again."""
    options = _run_options()
    assert {"max_retries_failure", "lease_heartbeat", "jobs"} <= options
    copies = {where for where, name in _number_defaults().items() if name in options}
    assert sorted(copies) == []


def test_no_help_text_writes_a_default_out():
    """A help text prints the default it describes from where the default lives (an f-string), not a copy."""
    written = []
    for path in sorted((PACKAGE / "cli").glob("*.py")):
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.search(r"default: \d", node.value):
                written.append(f"cli/{path.name}:{node.lineno}: {node.value[:60]!r}")
    assert written == []


SIGNAL_OWNERS = {
    "__main__.py", "cli/app.py", "cli/ctrl_c.py", "cli/exits.py", "cli/startup.py",  # the command line's start-up and exit
    "execution/scheduler.py", "backends/held_signals.py",  # a run's loop and its safe points
}
"""The modules that own signals: only they catch ``KeyboardInterrupt`` or call ``signal.signal``."""
SIGNALS_ELSEWHERE: set[str] = set()
"""Modules that still name ``KeyboardInterrupt`` outside the owners; the set only shrinks."""


def test_only_the_modules_that_own_signals_handle_them():
    handling = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        where = path.relative_to(PACKAGE).as_posix()
        for node in ast.walk(_tree(path)):
            if (isinstance(node, ast.Name) and node.id == "KeyboardInterrupt") or (
                    isinstance(node, ast.Call) and ast.unparse(node.func) == "signal.signal"):
                handling.add(where)
    assert sorted(handling - SIGNAL_OWNERS - SIGNALS_ELSEWHERE) == []
    assert sorted(SIGNALS_ELSEWHERE - handling) == [], "no longer handles signals: strike it out of SIGNALS_ELSEWHERE"


def _callers(function: str) -> set[str]:
    """The modules that call ``function`` (by its bare or dotted name)."""
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func).split(".")[-1] == function:
                found.add(path.relative_to(PACKAGE).as_posix())
    return found


def test_a_swallowed_ctrl_c_is_raised_only_at_the_start_up_boundary_and_the_flag_cleared_once():
    assert _callers("raise_if_swallowed") == {"cli/startup.py"}
    assert _callers("clear_interrupt_flag") == {"__main__.py"}
    exits = ast.parse((PACKAGE / "cli" / "exits.py").read_text())
    assert "startup.command_begins" in {ast.unparse(n.func) for n in ast.walk(exits) if isinstance(n, ast.Call)}
