"""Per-step Python environments: ``step(..., pip_dependency_groups=[...])``.

* :mod:`.spec` turns a step's groups (extras of the project's ``pyproject.toml``, PEP 508
  requirements) into an :class:`~marinbuild.pyenv.spec.EnvSpec`: the requirement set and
  the key naming its environment in the cache;
* :mod:`.builder` builds an environment with uv into the cache, once, under a lock, renamed
  into place when complete (standard library only: it also runs on remote hosts);
* :mod:`.inventory` lists and prunes the cache (``marinbuild env list`` / ``env prune``);
* :mod:`.launch` makes a step's job run in its environment on the local backend and says
  how a remote host prepares it (TPU over SSH) or what Ray's ``runtime_env`` carries.

See docs/environments.md.
"""
