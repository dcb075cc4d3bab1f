"""The strategy search: degrees × micro-batch × placement, each with its DP-optimal partition, ranked by the full
cost model, memory-infeasible candidates pruned and counted.

For every candidate the per-stage cost tables handed to :mod:`ampe.dp_assign` are stage-dependent: stage j's layer
times come from the slowest GPU type in stage j's devices (element-wise max over data-parallel replicas, which is
exact when replicas match and conservative otherwise), boundary j's transfer from the real links between stages j
and j+1 (both directions, slowest replica), stage j's memory from its in-flight micro-batches and its smallest
device, and stage j's gradient all-reduce from its data-parallel ring. The best few partitions are then re-costed
with :class:`~ampe.costmodel.estimate.CostModel` (per-replica pipelines, sync, memory) and the best that fits wins.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.comm import group_link_bandwidth, ring_allreduce_time, ring_bandwidth
from ampe.costmodel.estimate import GRAD_BYTES, CostModel, Estimate
from ampe.costmodel.memory import in_flight, layer_memory_table, pipe_buffer_slots
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy
from ampe.dp_assign import StageCosts, solve
from ampe.search.placement import LAYOUTS, ORDERS, Placement, candidates, neighbours
from ampe.search.space import Degrees, enumerate_degrees


@dataclass(frozen=True)
class SearchOptions:
    """Knobs of one search."""

    gbs: int
    top_k: int = 10
    jobs: int = 1
    allow_cross_node_tp: bool = False
    orders: tuple[str, ...] = ORDERS
    layouts: tuple[str, ...] = LAYOUTS
    schedules: tuple[str, ...] = ("1f1b",)
    local_search: int = 3  # refine this many of the best candidates by swapping stage device blocks
    rerank: int = 4  # DP partitions per candidate re-costed with the full model
    method: str = "eq5"  # pipeline time of the final ranking: "eq5" or "simulate"
    mbs_choices: tuple[int, ...] | None = None
    joblib_backend: str | None = None  # None: whatever joblib's active backend is (loky by default)


@dataclass(frozen=True)
class Candidate:
    """A costed strategy and how its placement was made."""

    estimate: Estimate
    placement_name: str

    @property
    def strategy(self) -> Strategy:
        return self.estimate.strategy


@dataclass(frozen=True)
class SearchResult:
    """Ranked feasible candidates (fastest first) and search statistics."""

    ranked: tuple[Candidate, ...]
    candidates: int
    pruned_oom: int
    seconds: float
    degrees: int
    oom_examples: tuple[str, ...] = field(default=())


# ---------------------------------------------------------------------------------------------------------------
# Cost tables for the DP


def stage_costs(cm: CostModel, s: Strategy) -> StageCosts:
    """Per-stage prefix tables of one (degrees, mbs, placement) for :func:`ampe.dp_assign.solve`."""
    assert s.placement is not None
    model, cl = cm.model, cm.cluster
    L = model.num_layers
    n_pos = s.pp * s.virtual_stages
    bw = cl.bandwidth
    gas = s.gas
    states = cm.layer_states(s.tp)
    trainable = np.array([l.trainable_params_per_rank(s.tp) for l in model.layers])
    time_rows = np.zeros((s.pp, L))
    mem_rows = np.zeros((s.pp, L))
    cap = np.zeros(s.pp)
    sync_coef = np.zeros(s.pp)
    out_bytes = np.array([l.out_elems for l in model.layers], dtype=float) * model.bytes_per_elem * s.mbs
    max_recv = float(out_bytes[:-1].max()) if L > 1 else 0.0  # any cut's activation (the final output excluded)
    gb = GRAD_BYTES[model.dtype]
    for j in range(s.pp):
        groups = [s.stage_devices(j, r) for r in range(s.dp)]
        seen: set[tuple[str, float]] = set()
        for devs in groups:
            gpu = cm.slowest_gpu(devs)
            key = (gpu.name, ring_bandwidth(bw, devs))
            if key in seen:
                continue
            seen.add(key)
            time_rows[j] = np.maximum(time_rows[j], cm.layer_times(gpu, s.tp, s.mbs, key[1]).total_s)
        k_mem = in_flight(s.schedule, j, s.pp, gas)
        slots = pipe_buffer_slots(j, s.pp, gas)
        # boundary pipe buffers (see memory.boundary_buffer_bytes), at the largest cut activation: conservative
        boundary = ((slots - k_mem + 1) * max_recv if j > 0 else 0.0) + ((slots + 1) * max_recv if j < s.pp - 1
                                                                          else 0.0)
        for gname in {cl.devices[d].gpu.name for devs in groups for d in devs}:
            gpu = next(cl.devices[d].gpu for devs in groups for d in devs if cl.devices[d].gpu.name == gname)
            table = layer_memory_table(model, j, s.pp, s.tp, s.mbs, gas, s.schedule, states,
                                       cm.layer_activations(gpu, s.tp, s.mbs))
            mem_rows[j] = np.maximum(mem_rows[j], table)
            room = gpu.memory_bytes - gpu.reserved_bytes - boundary
            cap[j] = room if cap[j] == 0 else min(cap[j], room)
        worst = 0.0
        if s.dp > 1:
            for k in range(s.tp):
                ring = [s.device(j, r, k) for r in range(s.dp)]
                worst = max(worst, 2.0 * (s.dp - 1) / s.dp * gb / ring_bandwidth(bw, ring))
        # seconds per trainable parameter of stage j's tail: gradient all-reduce + optimizer step
        sync_coef[j] = worst + max(cm.optimizer_seconds_per_param(cm.slowest_gpu(devs)) for devs in groups)
    rows = [p % s.pp for p in range(n_pos)]
    v = s.virtual_stages
    time_prefix = np.zeros((n_pos, L + 1))
    time_prefix[:, 1:] = np.cumsum(time_rows[rows], axis=1)
    mem_prefix = np.zeros((n_pos, L + 1))
    mem_prefix[:, 1:] = np.cumsum(mem_rows[rows], axis=1)
    tail_rows = trainable[None, :] * sync_coef[rows][:, None]
    _add_tied_sync(cm, s, tail_rows)
    sync_prefix = np.zeros((n_pos, L + 1))
    sync_prefix[:, 1:] = np.cumsum(tail_rows, axis=1)
    capacity = cap[rows] / v  # a device holds v chunks: give each an equal share (interleaved only)
    transfer = np.zeros((max(n_pos - 1, 0), L + 1))
    logits_cut = np.zeros(L + 1, dtype=bool)
    for c in range(1, L):
        prev = model.layers[c - 1]
        logits_cut[c] = prev.kind == "logits" or (c >= 2 and prev.kind == "noop" and model.layers[c - 2].kind ==
                                                  "logits")
    cut_bytes = np.zeros(L + 1)
    cut_bytes[1:L] = out_bytes[:L - 1] / np.where(logits_cut[1:L], s.tp, 1)
    frozen_prefix = np.array([all(l.frozen for l in model.layers[:c]) for c in range(L + 1)])
    for p in range(n_pos - 1):
        a, b = p % s.pp, (p + 1) % s.pp
        link = min(group_link_bandwidth(bw, s.stage_devices(a, r), s.stage_devices(b, r)) for r in range(s.dp))
        one = np.where(cut_bytes > 0, cl.latency_s + cut_bytes / link, 0.0) if np.isfinite(link) else 0.0 * cut_bytes
        transfer[p] = one * np.where(frozen_prefix, 1.0, 2.0)  # activation forward + gradient backward
    return StageCosts(time_prefix=time_prefix, transfer=transfer, gas=gas, mem_prefix=mem_prefix,
                      mem_capacity=capacity, sync_prefix=sync_prefix)


def _add_tied_sync(cm: CostModel, s: Strategy, tail_rows: np.ndarray) -> None:
    """Charge each tied weight's gradient all-reduce to its layers on the first and last pipeline positions (where
    GPT-style embeddings and LM heads always sit) — exact whenever the two ends land on different stages."""
    n_pos = tail_rows.shape[0]
    if n_pos < 2:
        return
    first, last = 0, s.pp - 1
    gb = GRAD_BYTES[cm.model.dtype]
    for i, layer in enumerate(cm.model.layers):
        if not layer.tied or not layer.trains_tied:
            continue
        size = layer.tied_params / (s.tp if layer.tp_shardable else 1)
        worst = max(ring_allreduce_time(size * gb, 2, ring_bandwidth(cm.cluster.bandwidth,
                                                                     [s.device(first, r, k), s.device(last, r, k)]),
                                        cm.cluster.latency_s)
                    for r in range(s.dp) for k in range(s.tp))
        row = 0 if i < cm.model.num_layers // 2 else n_pos - 1
        tail_rows[row, i] += worst


# ---------------------------------------------------------------------------------------------------------------
# One candidate


def best_for_placement(cm: CostModel, d: Degrees, placement: tuple[int, ...], rerank: int = 4,
                       method: str = "eq5") -> Estimate | None:
    """DP-optimal partition for one placement, re-costed by the full model; None if nothing fits in memory."""
    base = Strategy(pp=d.pp, dp=d.dp, tp=d.tp, mbs=d.mbs, gbs=d.gbs, placement=placement, schedule=d.schedule,
                    virtual_stages=d.virtual_stages)
    n_pos = d.pp * d.virtual_stages
    if n_pos == 1:
        est = cm.estimate(replace(base, partition=(0, cm.model.num_layers)), method)
        return est if est.fits else None
    costs = stage_costs(cm, base)
    best: Estimate | None = None
    for a in solve(costs, objective="full", top=rerank).assignments:
        est = cm.estimate(replace(base, partition=tuple(a.partition)), method)
        if est.fits and (best is None or est.iteration_s < best.iteration_s):
            best = est
    return best


def _slowness(cm: CostModel) -> Callable[[str], float]:
    return lambda name: cm._slowness.get(name, 0.0)


def _evaluate_group(cluster: Cluster, model: Model, profile: Profile | None, group: Sequence[Degrees],
                    opts: SearchOptions, cm: CostModel | None = None) -> tuple[list[Candidate], int, int, list[str]]:
    """Evaluate every placement of every degrees tuple in ``group`` (one joblib task)."""
    cm = cm or CostModel(cluster, model, profile)
    found: list[Candidate] = []
    n = pruned = 0
    oom: list[str] = []
    for d in group:
        for p in candidates(cluster, d.pp, d.dp, d.tp, _slowness(cm), opts.orders, opts.layouts):
            n += 1
            est = best_for_placement(cm, d, p.devices, opts.rerank, opts.method)
            if est is None:
                pruned += 1
                if len(oom) < 3:
                    oom.append(f"pp={d.pp} dp={d.dp} tp={d.tp} mbs={d.mbs} {p.name}")
            else:
                found.append(Candidate(est, p.name))
    return found, n, pruned, oom


def _chunks(items: list[Degrees], n: int) -> list[list[Degrees]]:
    """Split into about n contiguous groups, big (pp·dp) ones spread out."""
    order = sorted(items, key=lambda d: -(d.pp * d.dp))
    groups: list[list[Degrees]] = [[] for _ in range(max(1, n))]
    for i, d in enumerate(order):
        groups[i % len(groups)].append(d)
    return [g for g in groups if g]


def search(cluster: Cluster, model: Model, profile: Profile | None, opts: SearchOptions,
           progress: Callable[[int, int], None] | None = None) -> SearchResult:
    """Search every degree/mbs/placement candidate; return the feasible ones ranked by predicted iteration time."""
    t0 = time.perf_counter()
    degrees = enumerate_degrees(cluster, model.num_layers, opts.gbs, opts.allow_cross_node_tp,
                                schedules=opts.schedules, mbs_choices=opts.mbs_choices)
    found: list[Candidate] = []
    total = pruned = 0
    oom: list[str] = []
    if opts.jobs == 1:
        cm = CostModel(cluster, model, profile)
        groups = _chunks(degrees, max(1, min(len(degrees), 64)))
        ctx: Any = contextlib.nullcontext()
        results: Iterable = (_evaluate_group(cluster, model, profile, g, opts, cm) for g in groups)
    else:
        from joblib import Parallel, delayed, parallel_config

        groups = _chunks(degrees, opts.jobs * 4)
        ctx = parallel_config(backend=opts.joblib_backend) if opts.joblib_backend else parallel_config()
        results = Parallel(n_jobs=opts.jobs, return_as="generator")(
            delayed(_evaluate_group)(cluster, model, profile, g, opts) for g in groups)
    with ctx:  # joblib's backend must be active while its generator is consumed
        for i, (f, n, p, o) in enumerate(results):
            found += f
            total += n
            pruned += p
            oom += o
            if progress:
                progress(i + 1, len(groups))
    found = sorted(_dedupe(found), key=_rank_key)
    if opts.local_search > 0 and found:
        cm = CostModel(cluster, model, profile)
        refined, extra = _local_search(cm, found[: opts.local_search], opts)
        total += extra
        found = sorted(_dedupe(found + refined), key=_rank_key)
    return SearchResult(tuple(found), total, pruned, time.perf_counter() - t0, len(degrees), tuple(oom[:3]))


_SCHEDULE_PREFERENCE = {"1f1b": 0, "interleaved": 1, "gpipe": 2}  # at equal time: less memory, runnable first


def _rank_key(c: Candidate) -> tuple:
    s = c.strategy
    return (round(c.estimate.iteration_s, 12), _SCHEDULE_PREFERENCE.get(s.schedule, 9), s.pp, -s.dp, s.tp, s.mbs,
            c.placement_name)


def _dedupe(cands: Iterable[Candidate]) -> list[Candidate]:
    seen: dict[tuple, Candidate] = {}
    for c in cands:
        s = c.strategy
        # Placements that differ only by swapping identical devices cost the same: keep one of them.
        key = (s.pp, s.dp, s.tp, s.mbs, s.schedule, s.virtual_stages, s.partition, round(c.estimate.iteration_s, 9),
               c.estimate.memory_bytes_per_stage, c.estimate.stage_gpu)
        if key not in seen or c.estimate.iteration_s < seen[key].estimate.iteration_s:
            seen[key] = c
    return list(seen.values())


def _local_search(cm: CostModel, start: list[Candidate], opts: SearchOptions,
                  max_steps: int = 20) -> tuple[list[Candidate], int]:
    """First-improvement hill climbing over stage-block swaps, from each starting candidate."""
    out = []
    evaluated = 0
    for c in start:
        s = c.strategy
        d = Degrees(s.pp, s.dp, s.tp, s.mbs, s.gbs, s.schedule, s.virtual_stages)
        cur = Placement(s.placement, c.placement_name)  # type: ignore[arg-type]
        cur_est = c.estimate
        for _ in range(max_steps):
            improved = False
            for nb in neighbours(cur, s.pp, s.dp, s.tp):
                evaluated += 1
                est = best_for_placement(cm, d, nb.devices, opts.rerank, opts.method)
                if est is not None and est.iteration_s < cur_est.iteration_s * (1 - 1e-9):
                    cur, cur_est, improved = nb, est, True
                    break
            if not improved:
                break
        if cur_est is not c.estimate:
            out.append(Candidate(cur_est, cur.name))
    return out, evaluated
