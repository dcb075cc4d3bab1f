"""The iteration's tail, after the pipeline drains (AMP Eq. 4's second term), per device stage j::

    tail_j = dp_sync_j + tied_sync_j + optimizer_j

* ``dp_sync_j`` — ring all-reduce of stage j's gradients (trainable params/tp × :data:`GRAD_BYTES`) over its
  data-parallel ring in rank order, at that ring's slowest hop; with ZeRO-1 a reduce-scatter of the gradients and an
  all-gather of the updated weights, each half a ring all-reduce of its bytes;
* ``tied_sync_j`` — DeepSpeed all-reduces tied weights' gradients between the stages that hold them;
* ``optimizer_j`` — the Adam step streams the stage's state bytes through memory, read and written once
  (memory-bound), on the stage's slowest device, plus its per-iteration framework work.

Used by :class:`~ampe.costmodel.estimate.CostModel` (one strategy) and by the layer-assignment DP's tables
(:mod:`ampe.costmodel.tables`, the same terms per layer), so each term is written once.
"""

from __future__ import annotations

import bisect
import itertools

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.comm import ring_allreduce_time
from ampe.costmodel.layout import DeviceLayout
from ampe.costmodel.memory import state_bytes_per_param
from ampe.costmodel.model import Model
from ampe.costmodel.strategy import Strategy

GRAD_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}  # gradients are all-reduced in the training precision
TIED_RING_SETS = 64  # tied-weight stage lists a cost signature covers at most


def dp_sync_s(s: Strategy, model: Model, latency_s: float, lay: DeviceLayout, params: list[float]) -> np.ndarray:
    """[stage] seconds of the data-parallel gradient all-reduce (slowest shard's ring); ``params``: trainable
    parameters per device stage (one tensor-parallel rank)."""
    out = np.zeros(s.pp)
    if s.dp < 2:
        return out
    gb = GRAD_BYTES[model.dtype]
    # the slowest shard's ring is the one with the slowest hop (the time falls as bandwidth grows)
    slowest = lay.dp_ring.min(axis=1).astype(float)
    p = np.asarray(params, dtype=float)

    def ring(nbytes: np.ndarray) -> np.ndarray:  # ring_allreduce_time's arithmetic, stage by stage
        with np.errstate(divide="ignore", invalid="ignore"):
            t = 2.0 * (s.dp - 1) / s.dp * nbytes / slowest + 2.0 * (s.dp - 1) * latency_s
        return np.where(nbytes <= 0, 0.0, t)

    t = ring(p * gb)
    if s.zero:
        t = (t + ring(p * model.bytes_per_elem)) / 2
    out[:] = np.maximum(0.0, t)
    return out


def tied_layers(model: Model) -> list[int]:
    """Indices of the layers whose tied weight trains."""
    return [i for i, layer in enumerate(model.layers) if layer.tied and layer.trains_tied]


def tied_groups(model: Model, s: Strategy, tied: list[int]) -> dict[str, tuple[list[int], float]]:
    """Tied-weight groups spread over several stages of partitioned ``s``: name → (device stages, tied params per
    tp rank); ``tied``: :func:`tied_layers` of ``model``."""
    assert s.partition is not None
    groups: dict[str, set[int]] = {}
    sizes: dict[str, float] = {}
    for i in tied:
        layer = model.layers[i]
        pos = bisect.bisect_right(s.partition, i) - 1  # the position holding layer i
        assert layer.tied is not None
        groups.setdefault(layer.tied, set()).add(pos % s.pp)
        shard = s.tp if layer.tp_shardable else 1
        sizes[layer.tied] = max(sizes.get(layer.tied, 0.0), layer.tied_params / shard)
    return {n: (sorted(st), sizes[n]) for n, st in groups.items() if len(st) > 1}


def tied_sync_s(s: Strategy, model: Model, latency_s: float, lay: DeviceLayout,
                groups: dict[str, tuple[list[int], float]]) -> np.ndarray:
    """[stage] seconds of tied-weight gradient all-reduces between the stages that share a weight (``groups``:
    :func:`tied_groups`)."""
    gb = GRAD_BYTES[model.dtype]
    out = np.zeros(s.pp)
    for stages, size in groups.values():
        # every (replica, shard) has its own ring through these stages; the one with the slowest hop is slowest
        worst = ring_allreduce_time(size * gb, len(stages), lay.ring_min(stages), latency_s)
        out[stages] += max(0.0, worst)
    return out


def tied_ring_sets(model: Model, pp: int, v: int) -> list[list[int]] | None:
    """Every device-stage list a tied weight's all-reduce ring can take over all partitions into pp·v positions,
    plus first-to-last (the stage tables' charge); None when there are more than :data:`TIED_RING_SETS`."""
    L, n_pos = model.num_layers, pp * v
    members: dict[str, list[list[int]]] = {}
    for i, layer in enumerate(model.layers):
        if layer.tied and layer.trains_tied:
            # position p holds layer i only if p ≤ i and the n_pos-1-p later positions fit in the L-1-i later layers
            lo, hi = max(0, n_pos - (L - i)), min(i, n_pos - 1)
            members.setdefault(layer.tied, []).append(sorted({p % pp for p in range(lo, hi + 1)}))
    rings: set[tuple[int, ...]] = {(0, pp - 1)}
    for options in members.values():
        combos = 1
        for o in options:
            combos *= len(o)
        if combos > TIED_RING_SETS:
            return None
        for pick in itertools.product(*options):
            stages = tuple(sorted(set(pick)))
            if len(stages) > 1:
                rings.add(stages)
    if len(rings) > TIED_RING_SETS:
        return None
    return [list(r) for r in sorted(rings)]


def optimizer_seconds_per_param(gpu: GpuType, dtype: str, zero: int = 0, dp: int = 1) -> float:
    """Seconds per trainable parameter of one Adam step on ``gpu`` for a model trained in ``dtype`` (every state
    byte read and written once); ZeRO-1 steps only the rank's 1/dp partition."""
    share = dp if zero else 1
    return 2.0 * state_bytes_per_param(dtype) / share / (gpu.memory_bandwidth * gpu.memory_efficiency)


def optimizer_step_s(s: Strategy, dtype: str, lay: DeviceLayout, gpus: tuple[GpuType, ...] | list[GpuType],
                     params: list[float]) -> np.ndarray:
    """[stage] seconds of the optimizer step on the stage's slowest device, with its per-iteration framework work
    (``GpuType.iteration_overhead_s``); ``gpus``: the cluster's GPU types by index; ``params``: trainable
    parameters per device stage."""
    out = np.zeros(s.pp)
    p = np.asarray(params, dtype=float)
    on = lay.memo.get("pace_present")
    if on is None:  # [type] which stages have that pace-setter
        on = lay.memo["pace_present"] = [np.array([t in ts for ts in lay.stage_pace]) for t in range(len(gpus))]
    for t, gpu in enumerate(gpus):  # every stage: the largest over its pace-setters' steps
        if on[t].any():
            rate = optimizer_seconds_per_param(gpu, dtype, s.zero, s.dp)
            out = np.where(on[t], np.maximum(out, p * rate + gpu.iteration_overhead_s), out)
    return out
