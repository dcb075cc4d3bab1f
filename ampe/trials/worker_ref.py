"""Which worker a trial launches (``ampe trial --worker``): an existing ``.py`` file, or a dotted module name that
Python can find — checked before anything starts, without importing the module (the runner never imports torch).

A module is looked up the way ``python -m`` in a rank will look for it: its top-level package on this process's
``sys.path`` plus the ranks' ``PYTHONPATH`` (ampe's own root first, :func:`ampe.trials.commands.base_env`) and the
current folder, then each submodule inside the package found so far with :class:`importlib.machinery.PathFinder`,
which reads folders and never executes a package's ``__init__``. A package must have a ``__main__`` module to be
run with ``-m``. Anything else — spaces, ``;``, a path that is not a ``.py`` file — is refused.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import keyword
import os
import sys
from pathlib import Path

from ampe.errors import InputError
from ampe.trials.commands import PACKAGE_ROOT

FLAG = "--worker"


def worker_ref(worker: str) -> str:
    """``worker`` as the ranks get it: a ``.py`` script as an absolute path (the DeepSpeed launcher starts ranks in
    the job folder), a module name as given. Raises InputError naming ``--worker`` when it cannot be launched."""
    if not worker or worker != worker.strip():
        raise InputError(FLAG, "", f"{worker!r} is not a .py file or a module name")
    if worker.endswith(".py"):
        path = Path(worker)
        if not path.is_file():
            raise InputError(FLAG, "", f"{worker}: no such file (a worker script must be an existing .py file)")
        return str(path.resolve())
    parts = worker.split(".")
    if not all(p.isidentifier() and not keyword.iskeyword(p) for p in parts):
        raise InputError(FLAG, "", f"{worker!r} is neither a .py file nor a dotted module name (such as "
                         "ampe.runtime.worker)")
    found = _module_found(parts)
    if found is None:
        raise InputError(FLAG, "", f"module {worker!r} not found (looked on sys.path, PYTHONPATH and the current "
                         "folder)")
    if not found:
        raise InputError(FLAG, "", f"{worker!r} is a package without __main__; python -m cannot run it")
    return worker


def _module_found(parts: list[str]) -> bool | None:
    """True: a module ``python -m`` can run; False: a package without ``__main__``; None: nothing found."""
    roots = [PACKAGE_ROOT, *os.environ.get("PYTHONPATH", "").split(os.pathsep), os.getcwd(), *sys.path]
    search = [r for r in dict.fromkeys(roots) if r]
    spec = importlib.machinery.PathFinder.find_spec(parts[0], search)
    if spec is None:
        spec = importlib.util.find_spec(parts[0]) if parts[0] in sys.builtin_module_names else None
    for k in range(1, len(parts)):
        locations = spec.submodule_search_locations if spec is not None else None
        if not locations:
            return None
        spec = importlib.machinery.PathFinder.find_spec(".".join(parts[: k + 1]), list(locations))
    if spec is None:
        return None
    if spec.submodule_search_locations:  # a package: `python -m` runs its __main__
        return importlib.machinery.PathFinder.find_spec(f"{'.'.join(parts)}.__main__",
                                                        list(spec.submodule_search_locations)) is not None
    return True
