"""Run a function in ``tp`` spawned processes joined by gloo (a tensor-parallel group on this machine's CPU) and
collect what each saved: the tensor-parallel layer tests' harness."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _child(rank: int, tp: int, init_file: str, out_dir: str, fn: Callable[[Any], Any]) -> None:
    import torch
    import torch.distributed as dist

    from ampe.runtime.process_exit import exit_skipping_teardown
    from ampe.runtime.tensor_parallel import TpGroup

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=tp)
    try:
        torch.save(fn(TpGroup(tp, rank, dist.group.WORLD)), Path(out_dir, f"tp{rank}.pt"))
    finally:
        dist.destroy_process_group()
    exit_skipping_teardown(0)


def run_shards(fn: Callable[[Any], Any], tp: int = 2) -> list[Any]:
    """``fn(tp_group)`` on each of ``tp`` spawned gloo ranks (``fn`` importable: a module-level function); what each
    returned (saved with ``torch.save``), by rank."""
    import torch
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_child, args=(tp, os.path.join(tmp, "init"), tmp, fn), nprocs=tp, start_method="spawn")
        return [torch.load(Path(tmp, f"tp{k}.pt"), weights_only=False) for k in range(tp)]


class AllReduceCounter:
    """Counts this process's ``torch.distributed.all_reduce`` calls by ``phase`` (set it before each step; patches
    ``dist.all_reduce`` for the rest of the process: use it in spawned ranks only)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.counts: dict[Any, int] = {}
        self.phase: Any = None
        real = dist.all_reduce

        def counting(*a: Any, **k: Any) -> Any:
            self.counts[self.phase] = self.counts.get(self.phase, 0) + 1
            return real(*a, **k)

        dist.all_reduce = counting
