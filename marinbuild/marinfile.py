"""Loading a Marinfile: execute it and gather the steps it declares.

A Marinfile is plain Python. Every ``step(...)`` call executed while it loads is declared;
module-level names ``DEFAULT_CLUSTER`` and ``DEFAULT_BACKEND`` set defaults for ``run``.
Errors while loading become one-line :class:`~marinbuild.errors.MarinfileError` messages
pointing at ``file:line``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback
from dataclasses import dataclass
from types import ModuleType

from marinbuild.errors import MarinbuildError, MarinfileError, missing_extra
from marinbuild.steps import Step, collect_declared

__all__ = ["Marinfile", "load_marinfile"]

MODULE_NAME = "__marinfile__"


@dataclass(frozen=True)
class Marinfile:
    """A loaded Marinfile: its path, declared steps (in order) and module."""

    path: str
    steps: tuple[Step, ...]
    module: ModuleType

    def default(self, name: str) -> object:
        """A module-level setting such as ``DEFAULT_CLUSTER``, or None."""
        return getattr(self.module, name, None)


def load_marinfile(path: str) -> Marinfile:
    """Execute the Marinfile at ``path`` and return the steps it declared.

    The Marinfile's directory is put first on ``sys.path`` so that it can import its
    neighbours.
    """
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise MarinfileError(f"no Marinfile at {path} (use -f FILE to name another)")
    spec = importlib.util.spec_from_file_location(MODULE_NAME, path)
    if spec is None or spec.loader is None:
        raise MarinfileError(f"cannot load {path} as Python")
    module = importlib.util.module_from_spec(spec)
    folder = os.path.dirname(path)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    sys.modules[MODULE_NAME] = module
    with collect_declared() as declared:
        try:
            spec.loader.exec_module(module)
        except SyntaxError as e:
            where = f"{e.filename or path}:{e.lineno}"
            raise MarinfileError(f"{where}: syntax error: {e.msg}") from None
        except MarinbuildError as e:
            raise type(e)(f"{_where(e, path)}: {e}") from e
        except SystemExit as e:
            raise MarinfileError(f"{path}: the Marinfile called exit({e.code})") from None
        except Exception as e:
            # Chained (`from e`): with -v the traceback goes on into the user's own modules.
            extra = missing_extra(e, "this Marinfile") if isinstance(e, ImportError) else None
            raise MarinfileError(f"{_where(e, path)}: {extra or f'{type(e).__name__}: {e}'}") from e
    return Marinfile(path=path, steps=tuple(declared), module=module)


def _where(exc: BaseException, path: str) -> str:
    """``file:line`` of the deepest frame in the user's code, else of the deepest frame in a file.

    The user's code is the Marinfile and the modules beside it (not marinbuild's own, nor
    installed packages): an error raised in a module the Marinfile imports is shown where
    it was raised, not at the Marinfile's import line.
    """
    frames = traceback.extract_tb(exc.__traceback__)
    folder = os.path.dirname(path) + os.sep
    own = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def users(filename: str) -> bool:
        f = os.path.abspath(filename)
        return f == path or (f.startswith(folder) and not f.startswith(own) and "site-packages" not in f)

    # Code with no file of its own (a dataclass's generated ``__init__`` is "<string>", which
    # would resolve under the current folder) is nobody's line to show.
    real = [f for f in frames if os.path.isfile(f.filename)]
    mine = [f for f in real if users(f.filename)]
    chosen = mine or real or frames
    if not chosen:
        return path
    return f"{chosen[-1].filename}:{chosen[-1].lineno}"
