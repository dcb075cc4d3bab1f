"""The roofline as it was before issue 24 item 4, kept only so that benchmarks can print old against new.

Efficiency counted tokens only and memory traffic was added to compute::

    work      = mbs · seq / tp
    eff       = matmul_efficiency · work / (work + tokens_half)
    t_flops   = mbs · fwd_flops / tp / (peak · eff)
    t_memory  = (mbs · act_bytes(tp) + params/tp · bytes) / (memory_bandwidth · memory_efficiency)
    forward   = t_flops + t_memory + layer_overhead_s
    backward  = 2 · (t_flops + t_memory) + layer_overhead_s   (+ QKᵀ again with FlashAttention)

with the catalog's parameters of that time (:data:`OLD`); selective recomputation cost the FLOP share of core
attention. :func:`old_roofline` swaps it into the cost model for the duration of a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import numpy as np

import ampe.costmodel.compute as compute
import ampe.costmodel.estimate as estimate
from ampe.costmodel.catalog import GpuType
from ampe.costmodel.model import Model


class OldParams(NamedTuple):
    """The old roofline's per-type parameters (catalog values before issue 24 item 4)."""

    matmul_efficiency: float = 0.45
    tokens_half: float = 2048.0
    memory_efficiency: float = 0.7
    layer_overhead_s: float = 2e-5
    peak_flops: float | None = None  # None: the type's current peak


OLD = {"H100-80GB": OldParams(matmul_efficiency=0.5),
       "cpu": OldParams(0.5, 64.0, 0.5, 5e-5, peak_flops=4.0e10)}


def old_roofline_times(model: Model, gpu: GpuType, tp: int, mbs: int) -> tuple[np.ndarray, np.ndarray]:
    """The old analytic (forward, backward) seconds per layer."""
    p = OLD.get(gpu.name, OldParams())
    b = model.bytes_per_elem
    peak = p.peak_flops or gpu.peak_flops(model.dtype)
    seq = max(model.seq_len, 1)
    fwd = np.empty(model.num_layers)
    bwd = np.empty(model.num_layers)
    for i, layer in enumerate(model.layers):
        shards = tp if layer.tp_shardable else 1
        work = mbs * seq / shards
        eff = p.matmul_efficiency * work / (work + p.tokens_half)
        t_flops = mbs * layer.fwd_flops / shards / (peak * eff) if layer.fwd_flops > 0 else 0.0
        moved = mbs * layer.act_bytes(tp) + layer.params_per_rank(tp) * b
        t_mem = moved / (gpu.memory_bandwidth * p.memory_efficiency)
        fwd[i] = t_flops + t_mem + p.layer_overhead_s
        bwd[i] = 0.0 if layer.frozen else 2.0 * (t_flops + t_mem) + p.layer_overhead_s
        if model.attention == "flash" and layer.score_flops > 0 and not layer.frozen:
            bwd[i] += mbs * layer.score_flops / 2 / shards / (peak * eff)
    return fwd, bwd


def _flop_share(model: Model, gpu: GpuType, tp: int, mbs: int) -> np.ndarray:
    return np.array([l.score_flops / l.fwd_flops if l.fwd_flops > 0 else 0.0 for l in model.layers])


@contextmanager
def old_roofline() -> Iterator[None]:
    """Cost models built inside use the old roofline (and the FLOP share for selective recomputation)."""
    saved = compute.roofline_times, estimate.attention_share
    compute.roofline_times, estimate.attention_share = old_roofline_times, _flop_share
    try:
        yield
    finally:
        compute.roofline_times, estimate.attention_share = saved


def write_frozen_profile(path: str, model: Model, gpu: GpuType, tp: int, mbs_sizes: list[int]) -> int:
    """Write the old roofline's per-layer times of ``model`` on ``gpu`` as a profile CSV (``recompute`` rows none,
    selective and full, as the old cost model derived them: full re-runs a checkpointed block's forward, selective its
    FLOP share of it), floats in full precision so that a cost model reading it reproduces the old figures to the
    last bit. Returns the number of rows."""
    import csv

    rows = 0
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["model", "device", "tp", "mbs", "layer", "forward_s", "backward_s", "layer_kind", "recompute"])
        for mbs in mbs_sizes:
            fwd, bwd = old_roofline_times(model, gpu, tp, mbs)
            for recompute in ("none", "selective", "full"):
                for i, layer in enumerate(model.layers):
                    extra = 0.0
                    if recompute != "none" and layer.checkpointed and not layer.frozen:
                        extra = fwd[i] if recompute == "full" else fwd[i] * _flop_share(model, gpu, tp, mbs)[i]
                    w.writerow([model.name, gpu.name, tp, mbs, i, repr(float(fwd[i])), repr(float(bwd[i] + extra)),
                                layer.kind, recompute])
                    rows += 1
    return rows
