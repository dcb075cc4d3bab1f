"""One BLAS thread for ampe's own processes, and the user's environment unchanged for the processes it launches.

numpy and scipy each load an OpenBLAS that starts one thread per core when first imported: about 0.07 s of CPU
each on the 2-core development machine (``python -c "import numpy"``: 0.17 s CPU, 0.10 s with
``OPENBLAS_NUM_THREADS=1``; with ``scipy.optimize`` 0.52 s and 0.42 s; measured 2026-11-25). ampe's linear algebra is
a few small matrices, so the threads buy nothing, and a short ``ampe frontier`` run spent a quarter of its CPU time
starting them. The ``ampe`` command therefore sets ``OPENBLAS_NUM_THREADS=1`` before anything imports numpy, unless
the user chose a BLAS thread count. Trials run the user's training, so :func:`launch_environ` hands them the
environment without that setting.
"""

from __future__ import annotations

import os

THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "GOTO_NUM_THREADS")
_SET = "OPENBLAS_NUM_THREADS"
_set_here = False  # whether limit_threads() set _SET in this process (a user's own setting is never touched)


def limit_threads() -> None:
    """Set ``OPENBLAS_NUM_THREADS=1`` for this process unless any BLAS thread variable is already set. Takes effect
    only before numpy and scipy are first imported (OpenBLAS reads it when it loads)."""
    global _set_here
    if any(v in os.environ for v in THREAD_VARIABLES):
        return
    os.environ[_SET] = "1"
    _set_here = True


def launch_environ() -> dict[str, str]:
    """This process's environment as the user gave it: without the BLAS thread limit :func:`limit_threads` added."""
    env = dict(os.environ)
    if _set_here and env.get(_SET) == "1":
        del env[_SET]
    return env
