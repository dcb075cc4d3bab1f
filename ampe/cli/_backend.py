"""Where the candidate evaluation and the energy planning run: any joblib backend, for the whole command.

* ``loky`` (default, processes on this machine), ``threading``, ``multiprocessing``;
* ``dask``: a ``distributed.Client`` to ``--scheduler ADDRESS``, or a ``LocalCluster`` of ``--jobs`` worker processes
  when no address is given (needs ``pip install distributed``);
* ``ray``: ``ray.init(address=--ray-address)`` (or a local one) with Ray's joblib backend (needs ``pip install ray``).

Everything started here is shut down when the command ends — workers never outlive ``ampe`` — and the plan is the
same as the serial one (docs/backends.md).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from ampe.errors import InputError

BACKENDS = ("loky", "threading", "multiprocessing", "dask", "ray")


@contextlib.contextmanager
def joblib_backend(name: str | None, jobs: int, scheduler: str | None = None,
                   ray_address: str | None = None) -> Iterator[None]:
    """Activate backend ``name`` (None: joblib's default, loky) for ``jobs`` workers while the block runs. One job
    on the default backend runs nothing in joblib (the search and the energy planning are serial then): joblib is
    not imported at all, which saves a small command about a tenth of its CPU time."""
    if scheduler and name != "dask":
        raise InputError("--scheduler", "", "applies to --joblib-backend dask")
    if ray_address and name != "ray":
        raise InputError("--ray-address", "", "applies to --joblib-backend ray")
    if name is None and jobs == 1:
        yield
        return
    from joblib import parallel_config

    with contextlib.ExitStack() as stack:
        if name == "dask":
            stack.enter_context(_dask(jobs, scheduler))
        elif name == "ray":
            stack.enter_context(_ray(ray_address))
        stack.enter_context(parallel_config(backend=name or "loky", n_jobs=jobs))
        try:
            yield
        finally:
            _stop_loky()


@contextlib.contextmanager
def _dask(jobs: int, scheduler: str | None) -> Iterator[None]:
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise InputError("--joblib-backend", "", "dask needs the `distributed` package (pip install distributed)") \
            from None
    cluster = None
    try:
        if scheduler:
            client = Client(scheduler, timeout=30)
        else:
            cluster = LocalCluster(n_workers=jobs, threads_per_worker=1, dashboard_address=None)
            client = Client(cluster)
    except (OSError, ValueError, TypeError) as e:  # unreachable, or an address dask cannot parse (garbage://x)
        raise InputError("--scheduler", "", f"cannot reach the dask scheduler {scheduler!r} ({e})") from None
    try:
        yield
    finally:
        client.close()
        if cluster is not None:
            cluster.close()


@contextlib.contextmanager
def _ray(address: str | None) -> Iterator[None]:
    try:
        import ray
        from ray.util.joblib import register_ray
    except ImportError:
        raise InputError("--joblib-backend", "", "ray needs the `ray` package (pip install ray)") from None
    ray.init(address=address, ignore_reinit_error=True, include_dashboard=False)
    register_ray()
    try:
        yield
    finally:
        ray.shutdown()


def _stop_loky() -> None:
    """Shut loky's reusable worker processes down (joblib keeps them for the next call; ampe makes no next call).
    Where none was started, nothing is done: asking loky for its executor would start one (and its resource
    tracker) only to stop it."""
    executors = sys.modules.get("joblib.externals.loky.reusable_executor")
    if executors is None:
        return
    if not hasattr(executors, "_executor"):  # loky's private name changed: ask for it (starts one if none)
        executors.get_reusable_executor().shutdown(wait=True)
    elif executors._executor is not None:
        executors._executor.shutdown(wait=True)
