"""Per-stage cost tables of one (degrees, mbs, placement) for the layer-assignment DP, from the same cost terms the
estimate uses (:class:`~ampe.costmodel.estimate.CostModel`), so a new term is added in one place.

For stage j (every data-parallel replica of it; the slowest setting the pace) and layers a..b-1::

    time_j   = time_prefix[j, b] - time_prefix[j, a] + stage_s[j]     forward + backward of one micro-batch
    memory_j ≤ room_j                                                  every bound of ``memory``: the estimate's
                                                                       allocated peak (ampe.costmodel.dp_memory)
    tail_j   = sync_prefix[j, b] - sync_prefix[j, a] + sync_s[j]       gradient all-reduce + optimizer step
    cut j    = transfer[j, c]                                          activation forward + gradient backward
    blocking                                                           1F1B: transfers hold both stages they join

Exact where the estimate is additive over layers, and for memory (up to the cases :mod:`ampe.costmodel.dp_memory`
names); conservative bounds elsewhere, each named where it is made: the per-instruction overhead's backward charged
even on a stage with only frozen layers (time), and tied-weight sync charged to the first/last pipeline positions.
The best few DP partitions are then re-costed by the exact estimate (:mod:`ampe.search.engine`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ampe.costmodel.bounds import MemoryBound
from ampe.costmodel.comm import pipe_transfer_s, ring_allreduce_time
from ampe.costmodel.dp_memory import memory_bounds
from ampe.costmodel.model import Layer, Model, cut_sharded
from ampe.costmodel.pipeline import blocks, instruction_overhead_s
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.tail import GRAD_BYTES

if TYPE_CHECKING:
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.layout import DeviceLayout


@dataclass(frozen=True, eq=False)
class StageTables:
    """Prefix-sum cost arrays of one candidate (units and indexing in the module docstring)."""

    time_prefix: np.ndarray  # (n_pos, L+1) seconds
    stage_s: np.ndarray  # (n_pos,) seconds
    transfer: np.ndarray  # (n_pos-1, L+1) seconds
    gas: int
    memory: tuple[MemoryBound, ...]  # (n_pos rows) a segment fits a position when it meets every bound
    sync_prefix: np.ndarray  # (n_pos, L+1) seconds
    sync_s: np.ndarray  # (n_pos,) seconds
    sync_once: np.ndarray | None = None  # (n_pos,) seconds added to a tail with any sync work (lower tables only)
    blocking: bool = False  # the schedule's transfers hold both stages they join (ampe.costmodel.pipeline.blocks)


def stage_tables(cm: CostModel, s: Strategy, lower: bool = False, margin: bool = True) -> StageTables:
    """The DP tables of ``s`` (degrees, mbs, placement and schedule; the partition is what the DP chooses).

    ``margin``: the memory bounds leave each device's reserve free (the partitions that fit); False: within
    capacity (at risk too: :func:`~ampe.costmodel.dp_memory.memory_bounds`).

    ``lower``: tables whose Eq. 5 + max tail is a lower bound on the estimate's iteration time (eq5 method, one chunk
    per device, no shared processors) of every partition, each stage under the option the tables say. The estimate
    takes the slowest replica class's pipeline; these tables follow one class (:func:`bound_replica`) exactly: its
    pace-setters, tensor-parallel rings and stage-to-stage links. Its tail takes that class's pace-setter's optimizer
    rate and per-iteration overhead (the estimate: the largest over the stage's types), the forward's
    per-instruction overhead only, the all-reduces' bandwidth terms without their latency, and leaves tied weights
    out (neither synchronised nor counted in the all-reduce). Their memory bounds are within capacity whatever
    ``margin`` says: every partition the search may estimate meets them (the search's branch and bound,
    docs/cost_model.md)."""
    assert s.placement is not None
    model, cl = cm.model, cm.cluster
    L = model.num_layers
    n_pos = s.pp * s.virtual_stages
    gas = s.gas
    # lower: a tied weight is left out where one stage could hold two members of its group (stage_params counts it
    # once there); otherwise every stage holds at most one copy and the sum is exact
    shared = lower and cm.caches.cached(("tied_may_share", L - n_pos + 1),
                                        lambda: _tied_may_share(model, L - n_pos + 1))
    trainable = cm.caches.cached(("trainable", s.tp, shared), lambda: np.array([_trainable(layer, s.tp, shared)
                                                                         for layer in model.layers]))
    r_low = bound_replica(cm, s) if lower else 0
    out_bytes = _out_bytes(cm, s.mbs)
    gb = GRAD_BYTES[model.dtype]
    lay = cm.layout(s)
    memory = memory_bounds(cm, s, lay.stage_types, margin and not lower)
    of_stage, u_time, u_stage, u_tail, u_opt = _stage_units(cm, s, lay, r_low, lower)
    time_rows = u_time[of_stage]
    stage_const = u_stage[of_stage]
    tail_const = u_tail[of_stage]
    worst = np.zeros(s.pp)
    if s.dp > 1:
        # the data-parallel ring with the slowest hop is the slowest; all-reduce of the gradients, or with
        # ZeRO-1 a reduce-scatter of them + an all-gather of the bit16 weights
        moved = 2.0 * gb if not s.zero else gb + model.bytes_per_elem
        worst = np.maximum(0.0, (s.dp - 1) / s.dp * moved / lay.dp_ring.min(axis=1).astype(float))
    # seconds per trainable parameter of stage j's tail: gradient all-reduce + optimizer step
    sync_coef = worst + u_opt[of_stage]
    rows = [p % s.pp for p in range(n_pos)]
    time_prefix = np.zeros((n_pos, L + 1))
    time_prefix[:, 1:] = np.cumsum(time_rows[rows], axis=1)
    tail_rows = trainable[None, :] * sync_coef[rows][:, None]
    if not lower:
        _add_tied_sync(cm, s, tail_rows)
    sync_prefix = np.zeros((n_pos, L + 1))
    sync_prefix[:, 1:] = np.cumsum(tail_rows, axis=1)
    # a device's per-iteration work is charged once per device (on its first chunk)
    sync_s = np.where(np.arange(n_pos) < s.pp, tail_const[rows], 0.0)
    transfer = _transfer_table(cm, s, lay, r_low if lower else None, out_bytes)
    once = None
    if lower:  # the all-reduce latency of a data-parallel stage with parameters (ring_allreduce_time's, also ZeRO-1's)
        once = np.full(n_pos, 2.0 * (s.dp - 1) * cl.latency_s if s.dp > 1 else 0.0)
    return StageTables(time_prefix=time_prefix, stage_s=stage_const[rows], transfer=transfer, gas=gas,
                       memory=memory, sync_prefix=sync_prefix, sync_s=sync_s,
                       sync_once=once, blocking=blocks(s.schedule, s.virtual_stages))


def _stage_units(cm: CostModel, s: Strategy, lay: DeviceLayout, r_low: int,
                 lower: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The distinct (pace-setter, tensor-parallel ring) of each stage's replicas (lower: the followed replica's),
    costed once per distinct (pairs, recomputation): stages with equal ones get equal rows. Returns the unit of each
    stage and per unit its layer times (s, forward + backward of one micro-batch), stage constant (s), tail
    constant (s) and optimizer seconds per parameter."""
    L = cm.model.num_layers
    n_pos = s.pp * s.virtual_stages
    gpus = cm.device_types().gpus
    recs = [s.recompute] * s.pp if s.stage_recompute is None else [s.recompute_at(j) for j in range(s.pp)]
    if lower:
        stage_pairs: list[tuple[tuple[int, float], ...]] = [
            ((t, bw),) for t, bw in zip(lay.pace[:, r_low].tolist(), lay.tp_ring[:, r_low].tolist(), strict=True)]
    else:
        stage_pairs = list(lay.stage_pairs)
    index: dict[tuple, int] = {}
    of_stage = np.array([index.setdefault((pairs, rec), len(index)) for pairs, rec in zip(stage_pairs, recs,
                                                                                          strict=True)])
    n_u = len(index)
    u_time = np.zeros((n_u, L))
    u_stage = np.zeros(n_u)
    u_tail = np.zeros(n_u)
    u_opt = np.zeros(n_u)
    for (pairs, rec), u in index.items():
        if lower:
            gpu = gpus[pairs[0][0]]
            u_time[u] = cm.layer_times(gpu, s.tp, s.mbs, pairs[0][1], rec).total_s
            # the forward's instruction overhead only (a stage of frozen layers has no backward)
            u_stage[u] = instruction_overhead_s(gpu.pipeline_op_s, n_pos)
            u_tail[u] = gpu.iteration_overhead_s
        stage_c = tail_c = 0.0
        for t, tp_bw in pairs if not lower else ():
            gpu = gpus[t]
            u_time[u] = np.maximum(u_time[u], cm.layer_times(gpu, s.tp, s.mbs, tp_bw, rec).total_s)
            # forward + backward instruction overheads (conservative for a stage of frozen layers: no backward)
            stage_c = max(stage_c, 2 * instruction_overhead_s(gpu.pipeline_op_s, n_pos))
            tail_c = max(tail_c, gpu.iteration_overhead_s)
        if not lower:
            u_stage[u], u_tail[u] = stage_c, tail_c
        u_opt[u] = max(cm.optimizer_seconds_per_param(gpus[t], s.zero, s.dp) for t, _ in pairs)
    return of_stage, u_time, u_stage, u_tail, u_opt


def _transfer_table(cm: CostModel, s: Strategy, lay: DeviceLayout, replica: int | None,
                    out_bytes: np.ndarray) -> np.ndarray:
    """Seconds of boundary p (positions p and p+1: device stages p mod pp → (p+1) mod pp) cut after each layer:
    activation forward + gradient backward, over the slowest replica's flow and the slower tensor-parallel ring of
    the two stages (``replica``: that one replica's instead)."""
    n_pos = s.pp * s.virtual_stages
    if n_pos <= 1:
        return np.zeros((0, cm.model.num_layers + 1))
    cut_bytes, directions = cm.caches.cached(("cuts", s.tp, s.mbs), lambda: _cut_bytes(cm.model, s.tp, out_bytes))
    links, rings = lay.boundary_links(replica)
    at = [p % s.pp for p in range(n_pos - 1)]
    one = pipe_transfer_s(cut_bytes[None, :], s.tp, links[at][:, None], rings[at][:, None], cm.cluster.latency_s)
    return one * directions



def bound_replica(cm: CostModel, s: Strategy) -> int:
    """The replica whose pipeline the lower-bound tables follow: of one replica per class, the one whose
    pace-setters rank slowest summed over the stages (first on ties); any replica gives a valid bound, the slowest
    the tightest."""
    lay = cm.layout(s)
    reps = lay.class_replica
    ranks = cm.device_types().pace_rank[lay.pace[:, reps]].sum(axis=0)
    return int(reps[int(np.argmax(ranks))])


def _tied_may_share(model: Model, longest: int) -> bool:
    """Whether a segment of at most ``longest`` layers can hold two members of one tied group."""
    where: dict[str, list[int]] = {}
    for i, layer in enumerate(model.layers):
        if layer.tied:
            where.setdefault(layer.tied, []).append(i)
    return any(b - a + 1 <= longest for idx in where.values() for a, b in itertools.pairwise(idx))


def _trainable(layer: Layer, tp: int, untied: bool) -> float:
    """Trainable parameters of one tensor-parallel rank of ``layer``; ``untied``: without its tied weight, so that
    a stage's sum is never above ``Model.stage_params`` (which counts a tied weight once per stage)."""
    n = layer.trainable_params_per_rank(tp)
    if untied and layer.tied:
        n = max(0.0, n - (layer.tied_params / tp if layer.tp_shardable else layer.tied_params))
    return n


def _out_bytes(cm: CostModel, mbs: int) -> np.ndarray:
    """(L,) bytes of each layer's output activation for one micro-batch (cached per mbs)."""
    model = cm.model
    return cm.caches.cached(("out_bytes", mbs), lambda: np.array([layer.out_elems for layer in model.layers],
                                                                 dtype=float) * model.bytes_per_elem * mbs)


def _cut_bytes(model: Model, tp: int, out_bytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(L+1,) bytes one tensor-parallel rank sends across each cut, and (L+1,) transfers per cut: 2 (activation and
    gradient), 1 where every layer before the cut is frozen (no gradient comes back)."""
    L = model.num_layers
    cut_bytes = np.zeros(L + 1)
    for c in range(1, L):
        cut_bytes[c] = out_bytes[c - 1] / (tp if cut_sharded(model, c) else 1)
    frozen = [layer.frozen for layer in model.layers]
    frozen_prefix = np.array([all(frozen[:c]) for c in range(L + 1)])
    return cut_bytes, np.where(frozen_prefix, 1.0, 2.0)


def _add_tied_sync(cm: CostModel, s: Strategy, tail_rows: np.ndarray) -> None:
    """Charge each tied weight's gradient all-reduce to its layers on the first and last pipeline positions (where
    GPT-style embeddings and LM heads always sit) — exact whenever the two ends land on different stages."""
    n_pos = tail_rows.shape[0]
    if n_pos < 2:
        return
    first, last = 0, s.pp - 1
    gb = GRAD_BYTES[cm.model.dtype]
    lay = cm.layout(s)
    for i, layer in enumerate(cm.model.layers):
        if not layer.tied or not layer.trains_tied:
            continue
        size = layer.tied_params / (s.tp if layer.tp_shardable else 1)
        # the 2-member rings of every (replica, shard) between the first and last stage: the slowest hop is slowest
        worst = ring_allreduce_time(size * gb, 2, lay.ring_min([first, last]), cm.cluster.latency_s)
        row = 0 if i < cm.model.num_layers // 2 else n_pos - 1
        tail_rows[row, i] += worst
