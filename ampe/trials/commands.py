"""Command lines and environments that start one trial's ranks (argument vectors only, never shell strings).

Three launchers:

* ``torchrun`` — one host: ``python -m torch.distributed.run --standalone --nproc_per_node W <worker> JOB.json``.
* ``deepspeed`` — several hosts: ``python -m deepspeed.launcher.runner --hostfile H --include I --no_local_rank
  [--module] <worker> JOB.json`` with the hostfile from :mod:`ampe.trials.hostfile`, started in the job folder where
  ``.deepspeed_env`` carries the ranks' environment to every host (:func:`deepspeed_env_text`).
* ``local`` — the runner starts the W rank processes itself with the torchrun environment variables (RANK,
  WORLD_SIZE, MASTER_ADDR, ...). No torch import in the launcher, so it starts in milliseconds, and the runner sees
  every rank's own exit status (torchrun reports only its own); used by the fast fault tests.

``<worker>`` is ``-m ampe.runtime.worker`` (or a script path), optionally behind ``-m ampe.trials.limits BYTES``
which applies a per-rank address-space limit before exec'ing the worker.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path

from ampe.costmodel.training import ALLOC_CONF, allocator_conf
from ampe.jitops import ENV as EXTENSIONS_ENV
from ampe.jitops import extensions_dir
from ampe.trials.hostfile import HostLayout

LAUNCHERS = ("torchrun", "deepspeed", "local")
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # the folder holding the ampe package (ampe/trials/..)


@dataclass(frozen=True)
class Launch:
    """How to start one trial: the launcher's argv (or, for ``local``, each rank's argv and extra environment)."""

    kind: str
    argv: tuple[str, ...]
    env: dict[str, str]
    world_size: int
    rank_env: tuple[dict[str, str], ...] = ()  # local launcher only
    hostfile: str | None = None  # deepspeed launcher only: hostfile text
    notes: tuple[str, ...] = field(default=())


def worker_args(worker: str, job_path: str, memory_limit_bytes: int | None = None) -> list[str]:
    """Python arguments that run the worker on ``job_path``: ``-m module job`` or ``script.py job``."""
    base = [worker, job_path] if worker.endswith(".py") else ["-m", worker, job_path]
    if memory_limit_bytes:
        return ["-m", "ampe.trials.limits", str(int(memory_limit_bytes)), *base]
    return base


def torchrun_argv(world_size: int, args: list[str]) -> list[str]:
    """torchrun on this host; ``args`` from :func:`worker_args` (torchrun reads ``-m`` the way python does)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(world_size), *args]


def deepspeed_argv(hostfile_path: str, layout: HostLayout, master_port: int, args: list[str],
                   master_addr: str | None = None) -> list[str]:
    """The DeepSpeed launcher across the hosts of ``layout`` (it spells python's ``-m`` as ``--module``)."""
    head = [sys.executable, "-m", "deepspeed.launcher.runner", "--hostfile", hostfile_path,
            "--include", layout.include(), "--master_port", str(master_port), "--no_local_rank"]
    if master_addr:
        head += ["--master_addr", master_addr]
    if args and args[0] == "-m":
        return [*head, "--module", *args[1:]]
    return [*head, *args]


def deepspeed_env_text(env: dict[str, str]) -> str:
    """``.deepspeed_env`` text: DeepSpeed's multi-node runner exports these on every host (over ssh it forwards only
    ``PYTHON*``, ``NCCL*``, ``UCX*``, ``MV2*`` and ``MLFLOW*`` variables itself). It reads the file from its current
    folder and splits every line at the first ``=``, so there are no comments or blank lines."""
    bad = [k for k, v in env.items() if "\n" in k or "\n" in v or "=" in k or not k]
    if bad:
        raise ValueError(f"environment variable {bad[0]!r} cannot be written to .deepspeed_env")
    return "".join(f"{k}={v}\n" for k, v in env.items())


def local_rank_env(world_size: int, master_port: int) -> tuple[dict[str, str], ...]:
    """The variables torchrun would set, one dict per rank (all on this host)."""
    common = {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(master_port), "GROUP_RANK": "0", "ROLE_WORLD_SIZE": str(world_size)}
    return tuple({**common, "RANK": str(r), "LOCAL_RANK": str(r), "ROLE_RANK": str(r)} for r in range(world_size))


def base_env(device: str, extra: dict[str, str] | None = None, expandable: bool | None = None) -> dict[str, str]:
    """Environment for every rank: CPU accelerator for DeepSpeed, unbuffered output, ampe importable. On CPU also
    ``TORCH_EXTENSIONS_DIR``: the folder DeepSpeed's CPU op is prebuilt in (:func:`ampe.jitops.extensions_dir`:
    the user's own if set, else ampe's keyed folder), so every rank finds it there. ``extra`` wins, except for the
    allocator: with ``expandable`` (the strategy's ``expandable_segments``) ``PYTORCH_CUDA_ALLOC_CONF`` carries it
    (:func:`ampe.costmodel.training.allocator_conf`; the other options of the environment's value kept)."""
    env = {"PYTHONUNBUFFERED": "1"}
    path = os.environ.get("PYTHONPATH", "")
    env["PYTHONPATH"] = PACKAGE_ROOT + (os.pathsep + path if path else "")
    if device == "cpu":
        env["DS_ACCELERATOR"] = "cpu"
        env.setdefault("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))
        env[EXTENSIONS_ENV] = str(extensions_dir({**os.environ, **(extra or {})}).path)
    env.update(extra or {})
    conf = allocator_conf(expandable, env.get(ALLOC_CONF, os.environ.get(ALLOC_CONF)))
    if conf is not None and expandable is not None:
        env[ALLOC_CONF] = conf
    return env


def free_port() -> int:
    """A TCP port nobody listens on right now (for the local launcher's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
