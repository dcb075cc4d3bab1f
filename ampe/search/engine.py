"""The strategy search: degrees × micro-batch × placement, each with its DP-optimal partition, ranked by the full
cost model, memory-infeasible candidates pruned and counted.

For every candidate the per-stage cost tables handed to :mod:`ampe.dp_assign` come from the cost model
(:func:`~ampe.costmodel.tables.stage_tables`, built from the same terms as the estimate): stage j's layer
times from the slowest GPU type in stage j's devices (element-wise max over data-parallel replicas, which is exact
when replicas match and conservative otherwise), boundary j's transfer from the real links between stages j and j+1
(both directions, slowest replica), stage j's memory from its in-flight micro-batches and its smallest device, stage
j's gradient all-reduce from its data-parallel ring, and the devices' per-instruction and per-iteration overheads.
The best few partitions are then re-costed with :class:`~ampe.costmodel.estimate.CostModel` (per-replica pipelines,
sync, memory) and the best that fits wins; with ``shares="auto"`` it then gets the data-parallel shares that
minimise its iteration time (:mod:`ampe.search.shares`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ampe.costmodel.caches import BoundedCache, degrees_key
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.dp_memory import memory_may_fit
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.pipeline import blocks
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import RECOMPUTE, ZERO_STAGES, Strategy, with_stage_recompute
from ampe.costmodel.tables import StageTables, bound_replica, stage_tables
from ampe.dp_assign import (
    MAX_BAND_ENTRIES,
    Assignment,
    Bands,
    StageCosts,
    StageOption,
    band_entries,
    bands,
    reaches_bands,
    solve,
    stage_ceiling,
)
from ampe.errors import InputError
from ampe.search.placement import LAYOUTS, ORDERS, Placement, candidates, device_orders, swaps
from ampe.search.shares import with_best_shares
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
    recompute: tuple[str, ...] = RECOMPUTE  # activation recomputation options, tried cheapest first
    zero: tuple[int, ...] = ZERO_STAGES  # ZeRO stages allowed (1 is used wherever dp > 1)
    # PyTorch's allocator setting every strategy runs with (Strategy.expandable_segments; None: not set)
    expandable_segments: bool | None = None
    # each candidate's data-parallel shares: "auto" (the fastest integer shares, ampe.search.shares) or "equal"
    shares: str = "auto"


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
    too_large: int = 0  # degree choices left out: their exact partition's table is over MAX_BAND_ENTRIES


# ---------------------------------------------------------------------------------------------------------------
# Cost tables for the DP


def stage_costs(cm: CostModel, s: Strategy, lower: bool = False, margin: bool = True) -> StageCosts:
    """The cost model's per-stage tables of one (degrees, mbs, placement) as :func:`ampe.dp_assign.solve` input;
    ``lower``: the tables that bound the estimate from below; ``margin``: memory bounds that leave each device's
    reserve free, else within capacity (:func:`~ampe.costmodel.tables.stage_tables`)."""
    return _costs_of([stage_tables(cm, s, lower, margin)])


def option_costs(cm: CostModel, base: Strategy, recs: tuple[str, ...], lower: bool = False,
                 margin: bool = True) -> StageCosts:
    """:func:`stage_costs` of ``base`` under ``recs[0]`` with the tables under each later option of ``recs``
    (recomputation) as the DP's per-stage alternatives, in that order; validated once, as a whole."""
    return _costs_of([stage_tables(cm, replace(base, recompute=r), lower, margin) for r in recs])


def _costs_of(tables: list[StageTables]) -> StageCosts:
    """The DP input of ``tables[0]`` with the later tables as per-stage options."""
    t = tables[0]
    return StageCosts(time_prefix=t.time_prefix, transfer=t.transfer, gas=t.gas, memory=t.memory,
                      sync_prefix=t.sync_prefix, stage_s=t.stage_s, sync_s=t.sync_s, sync_once=t.sync_once,
                      blocking=t.blocking, options=tuple(StageOption(o.time_prefix, memory=o.memory)
                                                         for o in tables[1:]))


# ---------------------------------------------------------------------------------------------------------------
# One candidate


def memory_options(model_attention: str, dp: int, recompute: tuple[str, ...] = RECOMPUTE,
                   zero: tuple[int, ...] = ZERO_STAGES) -> list[tuple[tuple[str, ...], int]]:
    """(recomputation options, ZeRO stage) levels of one candidate, in the order the search tries them: no ZeRO,
    then ZeRO-1 (dp > 1 only). At each level every pipeline stage takes the fastest recomputation option that fits
    its memory (:func:`best_for_placement`): none, selective (skipped with FlashAttention, which keeps no scores
    already: it would change nothing), full; so late stages, with fewer micro-batches in flight, can skip it."""
    zs = [z for z in ZERO_STAGES if z in zero and (z == 0 or dp > 1)] or [0]
    recs = tuple(r for r in RECOMPUTE if r in recompute and not (r == "selective" and model_attention == "flash"))
    return [(recs, z) for z in zs] if recs else []


def best_for_placement(cm: CostModel, d: Degrees, placement: tuple[int, ...], rerank: int = 4,
                       method: str = "eq5", recompute: tuple[str, ...] = RECOMPUTE,
                       zero: tuple[int, ...] = ZERO_STAGES, memo: Memo | None = None,
                       below: float | None = None) -> Estimate | None:
    """DP-optimal partition for one placement, each stage with its own recomputation, re-costed by the full model;
    None if nothing fits in memory. ``memo``: work kept across placements (:class:`Memo`). ``below``: only an estimate
    under it is taken (local search): where a bound shows no level's is, ZeRO-1's (or None) comes back uncompared.

    ZeRO-1 is a memory option, not a speed-up: the cost model charges it the all-reduce's traffic and a 1/dp
    optimizer step, but DeepSpeed's bucketed ZeRO-1 reduction is slower than a fused all-reduce in practice. So it is
    kept where the candidate does not fit without it, or where it is faster even without the credit for its
    smaller optimizer step: it let the stages recompute less or balance better (docs/cost_model.md)."""
    levels = memory_options(cm.model.attention, d.dp, recompute, zero)
    ests: dict[int, Estimate | None] = {}
    credit = optimizer_credit(cm, placement)
    if [z for _, z in levels] == [0, 1] and credit == 1.0:  # (the bound hands back one optimizer step only)
        # The ZeRO-1 level nearly always wins where both fit: cost it first, and skip no-ZeRO where a bound shows
        # it would lose (:func:`_zero_level_loses`); otherwise both are costed and compared as below.
        ests[1] = _best_for_options(cm, d, placement, rerank, method, levels[1][0], 1, memo)
        slices, e1 = memo.slices if memo else None, ests[1]
        if (e1 is not None and _zero_level_loses(cm, d, placement, method, levels[0][0], e1, slices)) or (
                below is not None and (e1 is None or e1.iteration_s >= below)
                and cannot_beat(cm, d, placement, below * (1 + _BOUND_MARGIN), method, recompute, (0,), slices)):
            return e1  # no-ZeRO loses, or neither level's estimate is under ``below``
    best: Estimate | None = None
    for recs, z in levels:
        est = ests[z] if z in ests else _best_for_options(cm, d, placement, rerank, method, recs, z, memo)
        if est is None:
            continue
        if best is None or _wins(est, best, credit):
            best = est
    return best


def optimizer_credit(cm: CostModel, placement: tuple[int, ...]) -> float:
    """How many optimizer steps of one rank an iteration holds at most: 1 on devices of their own; where devices
    time-share processors (cluster ``processors:``), the most ranks of ``placement`` on one processor over its
    sharing efficiency, as the busiest processor's tail runs their steps one after the other."""
    procs = cm.cluster.processor
    if procs is None:
        return 1.0
    count: dict[int, int] = {}
    for dev in placement:
        count[procs[dev]] = count.get(procs[dev], 0) + 1
    eff = cm.cluster.processor_efficiency
    return max(n / (eff[p] if eff is not None else 1.0) for p, n in count.items())


def _wins(est: Estimate, best: Estimate, credit: float = 1.0) -> bool:
    """Whether a later memory level's ``est`` replaces the ``best`` so far (:func:`best_for_placement`): faster
    without the credit for a smaller optimizer step (``credit`` steps of it, :func:`optimizer_credit`: on a shared
    processor one rank's smaller step saves it once per rank there), by more than float noise (an exact tie, e.g.
    ZeRO-1 whose reduce-scatter and all-gather cost what the all-reduce does, keeps the earlier level). The slack is
    below the bound's margin, so what :func:`_zero_level_loses` proves still is a win."""
    slack = _WIN_SLACK * (best.iteration_s - best.optimizer_s)
    return est.iteration_s + credit * max(0.0, best.optimizer_s - est.optimizer_s) < best.iteration_s - slack


def _zero_level_loses(cm: CostModel, d: Degrees, placement: tuple[int, ...], method: str, recs: tuple[str, ...],
                      zero1: Estimate, cache: dict | None = None) -> bool:
    """True only when the no-ZeRO level of this placement is certain to find nothing, or an estimate that
    ``zero1`` (the ZeRO-1 level's) replaces (:func:`_wins`): ``zero1.iteration_s < e.iteration_s`` and
    ``zero1.iteration_s - zero1.optimizer_s < e.iteration_s - e.optimizer_s`` for whatever estimate ``e`` the level
    would return. Both from the DP on the level's lower-bound tables (as :func:`cannot_beat`, the same margin): its
    full objective bounds ``e.iteration_s``, and its Eq. 5 part alone bounds the pipeline term of the iteration
    time, which ``e.iteration_s - e.optimizer_s`` is at least (the largest stage tail holds the largest optimizer
    step). False (undecided) where the lower tables bound nothing (:func:`cannot_beat`'s cases). ``cache``: as
    :func:`cannot_beat`'s."""
    if not _lower_tables_bound(cm, d, method) or not recs:
        return False
    base = Strategy(pp=d.pp, dp=d.dp, tp=d.tp, mbs=d.mbs, gbs=d.gbs, placement=placement, schedule=d.schedule,
                    virtual_stages=d.virtual_stages,
                    expandable_segments=d.expandable_segments, recompute=recs[0], zero=0)
    if d.pp > cm.model.num_layers or not memory_may_fit(cm, base, recs):
        return True  # best_for_placement's level finds no partition
    pipe = zero1.iteration_s - zero1.optimizer_s
    if not (zero1.iteration_s > 0 and pipe > 0):
        return False
    limit = zero1.iteration_s * (1 + _BOUND_MARGIN)  # the larger threshold: its rows serve the smaller one too
    b = _lower_bands(cm, base, recs, (0,), cache, limit)
    eq5_only = Bands(b.seg_t, None, b.cut, b.gas, b.shortest_t, b.nonnegative, b.blocking)
    return reaches_bands(eq5_only, pipe * (1 + _BOUND_MARGIN)) and reaches_bands(b, limit)


def _best_for_options(cm: CostModel, d: Degrees, placement: tuple[int, ...], rerank: int, method: str,
                      allowed: tuple[str, ...], zero: int, memo: Memo | None = None) -> Estimate | None:
    """The best fitting partition with ZeRO stage ``zero`` where each pipeline stage runs the fastest option of
    ``allowed`` (recomputation, cheapest first) that fits it. A single stage, or the interleaved schedule (one
    option for the whole pipeline), takes the first option of ``allowed`` under which it fits.

    Fits with margin first (the DP's memory bounds leave each device's reserve free: the estimate's ``fits``); only
    where nothing does, within capacity (at risk), so a faster partition at risk never hides one that fits."""
    base = Strategy(pp=d.pp, dp=d.dp, tp=d.tp, mbs=d.mbs, gbs=d.gbs, placement=placement, schedule=d.schedule,
                    virtual_stages=d.virtual_stages,
                    expandable_segments=d.expandable_segments, recompute=allowed[0], zero=zero)
    n_pos = d.pp * d.virtual_stages
    if n_pos == 1 or d.virtual_stages > 1 or len(allowed) == 1:
        for margin in (True, False):
            for rec in allowed:
                est = _best_uniform(cm, replace(base, recompute=rec), rerank, method, memo, margin)
                if est is not None:
                    return est
        return None
    if not memory_may_fit(cm, base, allowed):  # the DP would find no partition: skip its tables (exact, cached)
        return None
    for margin in (True, False):
        if margin and not memory_may_fit(cm, base, allowed, margin=True):
            continue
        found = _solve(option_costs(cm, base, allowed, margin=margin), rerank, memo, _masks(cm))
        est = _fastest_fitting(cm, [with_stage_recompute(replace(base, partition=tuple(a.partition)),
                                                         (allowed[o] for o in a.options)) for a in found], method)
        if est is not None and (est.fits or not margin):
            return est
    return None


def cannot_beat(cm: CostModel, d: Degrees, placement: tuple[int, ...], limit: float, method: str = "eq5",
                recompute: tuple[str, ...] = RECOMPUTE, zero: tuple[int, ...] = ZERO_STAGES,
                cache: dict | None = None) -> bool:
    """True only when :func:`best_for_placement` of this placement is certain to return None or an estimate whose
    ``iteration_s`` is ≥ ``limit`` (branch and bound). The DP on the lower-bound tables (``stage_costs(...,
    lower=True)``: each stage at its fastest fitting option under the same memory constraint as the search's
    tables), taken entry by entry at the smallest over the memory levels (ZeRO stages), must reach ``limit``: every
    partition the search can estimate passes one level's constraint, its estimate is ≥ that level's lower-bound
    objective, and that objective is ≥ the one of the smallest entries (the objective only adds, takes maxima and
    scales by gas - 1 ≥ 0). False (undecided) for the cases the lower tables do not bound: the simulated pipeline,
    interleaved chunks, shared processors, a single stage. ``cache``: a dict this function keeps per-stage band
    slices in (placements that put equal devices on a stage share them; the local search's block swaps change two
    stages)."""
    if not _lower_tables_bound(cm, d, method):
        return False
    if d.pp > cm.model.num_layers:
        return True  # no partition: best_for_placement finds none
    levels = memory_options(cm.model.attention, d.dp, recompute, zero)
    if not levels:
        return True  # no memory level: best_for_placement finds none
    recs, zeros = levels[0][0], tuple(z for _, z in levels)  # every level has the same recomputation options
    base = Strategy(pp=d.pp, dp=d.dp, tp=d.tp, mbs=d.mbs, gbs=d.gbs, placement=placement, schedule=d.schedule,
                    virtual_stages=d.virtual_stages,
                    expandable_segments=d.expandable_segments, recompute=recs[0], zero=zeros[0])
    return reaches_bands(_lower_bands(cm, base, recs, zeros, cache, limit), limit)


def _lower_tables_bound(cm: CostModel, d: Degrees, method: str) -> bool:
    """Whether the lower-bound tables bound the estimate of ``d``'s placements: not for the simulated pipeline,
    interleaved chunks, a single stage or shared processors (:func:`cannot_beat`, :func:`_zero_level_loses`)."""
    return method == "eq5" and d.virtual_stages == 1 and d.pp >= 2 and cm.cluster.processor is None


_BOUND_CACHE = 4096  # most per-stage band slices kept by cannot_beat's cache
_BOUND_CACHE_BYTES = 256 << 20  # and about this many bytes of them (a slice pair is 16·W² bytes, W = L - pp + 1)


def _lower_bands(cm: CostModel, base: Strategy, recs: tuple[str, ...], zeros: tuple[int, ...],
                 cache: dict | None, limit: float | None = None) -> Bands:
    """The DP's band tables of the lower-bound tables of ``base`` with each stage under any option of ``recs``, at
    the smallest entry over the ZeRO stages ``zeros`` (:func:`_levels_bands`), stacked from ``cache``'s per-stage
    slices when it has them all. A stage's slices depend on its position, the followed replica's pace-setter and
    tensor-parallel ring on it, its GPU types (memory) and its slowest data-parallel ring; a boundary's cut costs
    on the followed replica's link (:func:`stage_tables`). ``limit``: the threshold
    :func:`~ampe.dp_assign.reaches_bands` will be asked about; the stacked tables then hold only the rows (stage
    lengths) with an entry below its :func:`~ampe.dp_assign.stage_ceiling` (all costs ≥ 0: the answer is the
    same, the copies smaller)."""
    if cache is None:
        return _levels_bands(cm, base, recs, zeros)
    lay = cm.layout(base)
    r = bound_replica(cm, base)
    level = (degrees_key(base), recs, zeros)
    ring = lay.dp_ring.min(axis=1).tolist()
    pace, tp_ring = lay.pace[:, r].tolist(), lay.tp_ring[:, r].tolist()
    link, beside = (x.tolist() for x in lay.boundary_links(r))
    keys: list[tuple] = [(level, j, pace[j], tp_ring[j], lay.stage_types[j], ring[j]) for j in range(base.pp)]
    cut_keys: list[tuple] = [(level, -1 - j, link[j], beside[j]) for j in range(base.pp - 1)]
    have = [cache.get(k) for k in keys]
    missing = [j for j, h in enumerate(have) if h is None]
    cuts = [cache.get(k) for k in cut_keys]
    if missing or any(c is None for c in cuts):
        b = _levels_bands(cm, base, recs, zeros, missing)
        assert isinstance(b.seg_y, np.ndarray)
        w = b.seg_t.shape[-1]
        if len(cache) + len(missing) + len(cut_keys) > min(_BOUND_CACHE, max(64, _BOUND_CACHE_BYTES // (16 * w * w))):
            cache.clear()
        for i, j in enumerate(missing):
            have[j] = cache[keys[j]] = (b.seg_t[i], b.seg_y[i], b.seg_t[i].min(axis=1), b.nonnegative)
        cuts = list(b.cut)
        for j, k in enumerate(cut_keys):
            cache[k] = cuts[j]
    hits = [h for h in have if h is not None]
    cut_rows = [c for c in cuts if c is not None]
    assert len(hits) == base.pp and len(cut_rows) == base.pp - 1
    cut = np.stack(cut_rows)
    shortest = np.min([h[2] for h in hits], axis=0)
    nonnegative = all(h[3] for h in hits) and bool(np.all(cut >= 0))
    rows = len(shortest)
    if limit is not None and nonnegative and limit < np.inf:
        below = np.flatnonzero(shortest < stage_ceiling(limit, base.gas))
        rows = int(below[-1]) + 1 if len(below) else 0
    return Bands(np.stack([h[0][:rows] for h in hits]), lambda: np.stack([h[1][:rows] for h in hits]), cut,
                 base.gas, shortest[:rows], nonnegative, blocks(base.schedule, base.virtual_stages))


def _levels_bands(cm: CostModel, base: Strategy, recs: tuple[str, ...], zeros: tuple[int, ...],
                  rows: list[int] | None = None) -> Bands:
    """:func:`~ampe.dp_assign.bands` of the lower-bound tables of ``base`` under the options ``recs`` (``rows``:
    only those stages' slices), each entry (segment time, sync, cut) the smallest over the ZeRO stages
    ``zeros``."""
    out: Bands | None = None
    for z in zeros:
        b = bands(option_costs(cm, replace(base, zero=z), recs, lower=True), rows=rows, masks=_masks(cm))
        if out is None:
            out = b
            continue
        assert isinstance(out.seg_y, np.ndarray) and isinstance(b.seg_y, np.ndarray)
        np.minimum(out.seg_t, b.seg_t, out=out.seg_t)
        np.minimum(out.seg_y, b.seg_y, out=out.seg_y)
        out = Bands(out.seg_t, out.seg_y, np.minimum(out.cut, b.cut), out.gas, None,
                    out.nonnegative and b.nonnegative, out.blocking)
    assert out is not None
    return out


def _best_uniform(cm: CostModel, base: Strategy, rerank: int, method: str, memo: Memo | None = None,
                  margin: bool = False) -> Estimate | None:
    """The best partition with one memory option for every stage (``base``'s) that fits, with ``margin`` leaving
    every device's reserve free (else within capacity: at risk, where nothing fits with margin)."""
    if base.pp * base.virtual_stages == 1:
        est = cm.estimate(replace(base, partition=(0, cm.model.num_layers)), method)
        return est if (est.fits if margin else est.within_capacity) else None
    if not memory_may_fit(cm, base, margin=margin):  # the DP would find no partition: skip its tables (exact)
        return None
    found = _solve(stage_costs(cm, base, margin=margin), rerank, memo, _masks(cm))
    best = _fastest_fitting(cm, [replace(base, partition=tuple(a.partition)) for a in found], method)
    return best if best is None or best.fits or not margin else None


@dataclass
class Memo:
    """Work one search keeps across placements: :func:`cannot_beat`'s band slices, and the DP's partitions of the
    last :data:`_SOLVED_KEPT` cost tables (placements that put equal devices on every stage get equal tables:
    :func:`~ampe.dp_assign.solve` depends on nothing else, so its answer is reused where the tables are equal to
    the last bit)."""

    slices: dict = field(default_factory=dict)
    solved: BoundedCache[tuple, tuple[Assignment, ...]] = field(default_factory=lambda: BoundedCache(_SOLVED_KEPT))


_SOLVED_KEPT = 32  # DP answers kept by a Memo (each keyed by its tables' bytes: a few hundred kB)


def _masks(cm: CostModel) -> dict:
    """The DP's memory masks per stage row (:func:`~ampe.dp_assign.bands`' ``masks``), kept by ``cm`` for every
    candidate it costs."""
    return cm.caches.cached(("dp_masks",), dict)


def _solve(costs: StageCosts, rerank: int, memo: Memo | None, masks: dict | None = None) -> tuple[Assignment, ...]:
    """``solve(costs, "full", rerank, masks).assignments``, reused from ``memo`` for tables equal to the last bit."""
    if memo is None:
        return solve(costs, objective="full", top=rerank, masks=masks).assignments
    arrays = [costs.time_prefix, costs.transfer, costs.sync_prefix, costs.stage_s, costs.sync_s, costs.sync_once]
    shape: list[int] = []  # bounds per option: the key's arrays come in that order
    for bounds, time_prefix in ((costs.memory_bounds, None), *((o.memory_bounds, o.time_prefix)
                                                              for o in costs.options)):
        arrays += [time_prefix]
        shape.append(len(bounds))
        arrays += [a for b in bounds for a in (b.head, b.tail, b.capacity, b.peak)]
    key = (costs.time_prefix.shape, costs.gas, rerank, tuple(shape), costs.blocking,
           tuple(None if a is None else a.tobytes() for a in arrays))
    return memo.solved.get_or_make(key, lambda: solve(costs, objective="full", top=rerank,
                                                      masks=masks).assignments)


def _fastest_fitting(cm: CostModel, tries: list[Strategy], method: str) -> Estimate | None:
    """The fastest of the DP's partitions ``tries`` that fits with margin (ties: the DP's order), else the fastest
    within capacity (at risk: ``Estimate.memory_risk``): iteration times first, then the memory of each in order of
    time until one fits, so most partitions are never fully estimated."""
    times = [cm.iteration_time(s, method) for s in tries]
    at_risk = None
    for i in sorted(range(len(tries)), key=lambda i: (times[i], i)):
        est = cm.estimate(tries[i], method)
        if est.fits:
            return est
        if at_risk is None and est.within_capacity:
            at_risk = est
    return at_risk


def _evaluate_group(cluster: Cluster, model: Model, profile: Profile | None, group: Sequence[Degrees],
                    opts: SearchOptions, cm: CostModel | None = None,
                    made: dict[str, list[int]] | None = None) -> tuple[list[Candidate], int, int, list[str]]:
    """Evaluate every placement of every degrees tuple in ``group`` (one joblib task); ``made``: the device orders
    (:func:`~ampe.search.placement.device_orders`), computed here when not given."""
    cm = cm or CostModel(cluster, model, profile)
    found: list[Candidate] = []
    n = pruned = 0
    oom: list[str] = []
    if made is None:
        made = device_orders(cluster, cm.slowness, opts.orders)
    memo = Memo()
    for d in group:
        for p in candidates(cluster, d.pp, d.dp, d.tp, cm.slowness, opts.orders, opts.layouts, made):
            n += 1
            est = best_for_placement(cm, d, p.devices, opts.rerank, opts.method, opts.recompute, opts.zero, memo)
            if est is not None and opts.shares == "auto":
                est = with_best_shares(cm, est, opts.method)
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
                                schedules=opts.schedules, mbs_choices=opts.mbs_choices,
                                expandable_segments=opts.expandable_segments)
    degrees, too_large = _within_table_bound(degrees, model)
    found: list[Candidate] = []
    total = pruned = 0
    oom: list[str] = []
    cm = CostModel(cluster, model, profile)
    made = device_orders(cluster, cm.slowness, opts.orders)  # once per search: they do not depend on degrees
    if opts.jobs == 1:
        groups = _chunks(degrees, max(1, min(len(degrees), 64)))
        ctx: Any = contextlib.nullcontext()
        results: Iterable = (_evaluate_group(cluster, model, profile, g, opts, cm, made) for g in groups)
    else:
        from joblib import Parallel, delayed, parallel_config
        from joblib.parallel import get_active_backend

        groups = _chunks(degrees, opts.jobs * 4)
        ctx = parallel_config(backend=opts.joblib_backend) if opts.joblib_backend else parallel_config()
        with ctx:  # results one by one where the backend can (multiprocessing cannot: all at once, not a traceback)
            lazily = bool(getattr(get_active_backend()[0], "supports_return_generator", False))
            results = Parallel(n_jobs=opts.jobs, return_as="generator" if lazily else "list")(
                delayed(_evaluate_group)(cluster, model, profile, g, opts, None, made) for g in groups)
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
        refined, extra = _local_search(cm, found[: opts.local_search], opts)
        total += extra
        found = sorted(_dedupe(found + refined), key=_rank_key)
    return SearchResult(tuple(found), total, pruned, time.perf_counter() - t0, len(degrees), tuple(oom[:3]),
                        too_large)


def _within_table_bound(degrees: list[Degrees], model: Model) -> tuple[list[Degrees], int]:
    """The degree choices whose exact partition fits :data:`~ampe.dp_assign.MAX_BAND_ENTRIES` (its table holds
    pp·(L−pp+1)² numbers; see docs/dp_assign.md), and how many were left out. All left out is an InputError."""
    layers = model.num_layers
    kept = [d for d in degrees if band_entries(layers, d.pp * d.virtual_stages) <= MAX_BAND_ENTRIES]
    if degrees and not kept:
        least = min(degrees, key=lambda d: band_entries(layers, d.pp * d.virtual_stages))
        need = band_entries(layers, least.pp * least.virtual_stages) * 8 / 2**30
        raise InputError(model.source, "layers", f"{layers} layers: the exact partition needs a {need:.1f} GiB "
                         f"table even at pp {least.pp}, the smallest this cluster allows (pp·(layers−pp+1)² "
                         f"numbers); the search holds at most {MAX_BAND_ENTRIES * 8 >> 20} MiB (about "
                         f"{_largest_layers(least.pp):,} layers at pp {least.pp}); group layers (a model YAML's "
                         "layer entries) or give the partition to ampe evaluate")
    return kept, len(degrees) - len(kept)


def _largest_layers(pp: int) -> int:
    """The most layers whose pp-stage band table fits MAX_BAND_ENTRIES."""
    return int((MAX_BAND_ENTRIES / pp) ** 0.5) + pp - 1


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
        key = (s.pp, s.dp, s.tp, s.mbs, s.schedule, s.virtual_stages, s.recompute, s.stage_recompute, s.zero,
               s.partition, s.replica_gas,
               round(c.estimate.iteration_s, 9),
               c.estimate.memory_bytes_per_stage, c.estimate.stage_gpu)
        if key not in seen or c.estimate.iteration_s < seen[key].estimate.iteration_s:
            seen[key] = c
    return list(seen.values())


_BOUND_MARGIN = 1e-12  # relative: a bound must clear the acceptance threshold by this much to skip a neighbour
_WIN_SLACK = _BOUND_MARGIN / 2  # relative to the pipeline part: _wins's tie slack, under m/(1+m) of the margin


def _local_search(cm: CostModel, start: list[Candidate], opts: SearchOptions, max_steps: int = 20,
                  bound: bool = True) -> tuple[list[Candidate], int]:
    """First-improvement hill climbing over stage-block swaps, from each starting candidate. ``bound``: skip the
    neighbours that :func:`cannot_beat` the current placement (exact: they would not have been taken)."""
    out = []
    evaluated = 0
    memo = Memo()  # cannot_beat's per-stage band slices, the DP's answers
    for c in start:
        s = c.strategy
        d = Degrees(s.pp, s.dp, s.tp, s.mbs, s.gbs, s.schedule, s.virtual_stages, s.expandable_segments)
        cur = Placement(s.placement, c.placement_name)  # type: ignore[arg-type]
        # neighbours are costed under equal shares (best_for_placement): compare with the start's equal shares too
        cur_est = begun = cm.estimate(replace(s, replica_gas=None), opts.method) if s.uneven else c.estimate
        # A neighbour that costs exactly as one already costed cannot improve on the current placement: skip it.
        seen = {cm.cost_signature(s)}
        for _ in range(max_steps):
            improved = False
            cur_lay = cm.layout(replace(s, placement=cur.devices))  # each neighbour's layout is derived from it
            for a, b, nb in swaps(cur, s.pp, s.dp, s.tp):
                evaluated += 1
                nb_s = replace(s, placement=nb.devices)
                cm.swapped_layout(cur_lay, nb_s, a, b)
                sig = cm.cost_signature(nb_s)
                if sig is not None:
                    if sig in seen:
                        continue
                    seen.add(sig)
                accept = cur_est.iteration_s * (1 - 1e-9)  # an improvement is below this
                # skip a neighbour whose estimate cannot come below it (the margin covers float noise)
                if bound and cannot_beat(cm, d, nb.devices, accept * (1 + _BOUND_MARGIN), opts.method,
                                         opts.recompute, opts.zero, memo.slices):
                    continue
                est = best_for_placement(cm, d, nb.devices, opts.rerank, opts.method, opts.recompute, opts.zero,
                                         memo, below=accept if bound else None)
                if est is not None and est.iteration_s < accept:
                    cur, cur_est, improved = nb, est, True
                    break
            if not improved:
                break
        if cur_est is not begun:
            out.append(Candidate(with_best_shares(cm, cur_est, opts.method) if opts.shares == "auto" else cur_est,
                                 cur.name))
    return out, evaluated
