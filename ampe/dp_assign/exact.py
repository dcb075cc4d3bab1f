"""Exact layer-to-stage assignment for AMP's pipeline objective (Eq. 5), optionally plus the DP-sync term (Eq. 4).

Idea (details and complexity in docs/dp_assign.md): for a fixed cap B on every stage time, Eq. 5 minus its max term
is a plain min-sum over contiguous partitions, one O(pp·W²) pass (``_kernels.min_sum``). Eq. 5's optimum is
``min_B (gas-1)·B + g(B)`` where g(B) is that min-sum under the cap. Instead of trying every candidate B (O(pp·L²)
of them, AMP's tolerance domain), we walk the Pareto chain (bottleneck ↓, sum ↑): solve without a cap, then with the
cap just below the bottleneck of the last solution, and so on. Two bounds stop the walk early:

* a better partition needs ``(gas-1)·B + g < best`` and g only grows along the chain, so the cap can drop to
  ``(best - g_last)/(gas-1)`` at once;
* no partition has a bottleneck below B* (one min-max pass), and the partition that is best at B = B* is solved up
  front, so the walk stops as soon as the cap reaches B*.

The DP-sync term ``max_j y_j`` is a second max term; the same walk runs one level up, over caps on the sync
bottleneck, each step solving the Eq. 5 problem above restricted to stages under the cap.

Every step is an exact minimisation, so the result equals brute force (tests check this on random instances).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import ampe.dp_assign._kernels as K
from ampe.costmodel.bounds import MemoryBound
from ampe.dp_assign.costs import (
    PARTITION_OBJECTIVES,
    Assignment,
    StageCosts,
    evaluate_partition,
    pipeline_s,
    stage_choice,
    with_sync_constants,
)

_NO_CAPS = K.Caps()  # sync caps that prune nothing
_SLACK = 1e-12  # relative slack on pruning caps: float noise must never prune a truly better partition


@dataclass(frozen=True)
class Solution:
    """Result of :func:`solve`: ``assignments`` sorted by the objective (first = the optimum); empty if infeasible."""

    objective: str
    assignments: tuple[Assignment, ...]
    reason: str = ""  # why no partition exists, when infeasible
    dp_passes: int = 0  # min-sum and min-max passes run (a work measure for benchmarks)

    @property
    def feasible(self) -> bool:
        """True when at least one partition satisfies every constraint."""
        return bool(self.assignments)

    @property
    def best(self) -> Assignment | None:
        """The optimal assignment, or None when infeasible."""
        return self.assignments[0] if self.assignments else None


@dataclass
class _Run:
    """Mutable state of one solve: gas, the windowed cut costs, every distinct partition met, a pass counter."""

    gas: int
    cut: np.ndarray
    found: dict[tuple[int, ...], None] = field(default_factory=dict)
    passes: int = 0
    ceiling: float = K.INF  # every pass also caps stage times below this (reaches: no partition above can help)
    bound_only: bool = False  # reaches: only whether the optimum is below the stop value matters, not ``found``
    floor: float = -K.INF  # no partition's largest stage time is below this (the first walk's B*, once known)


def solve(costs: StageCosts, objective: str = "full", top: int = 1, masks: dict | None = None) -> Solution:
    """Optimal contiguous assignment of ``costs.num_layers`` layers to ``costs.pp`` ordered stages.

    ``objective``: "full" = Eq. 5 + max stage sync (the same as "eq5" when ``costs.sync_prefix`` is None), or "eq5".
    Stages that exceed their memory capacity are excluded. ``top`` > 1 also returns up to top-1 other distinct
    partitions the search evaluated (Pareto points of bottleneck vs. sum, sorted by the objective): they are good
    alternatives but not guaranteed to be the 2nd..top-th best partitions. Seconds throughout. ``masks``: as
    :func:`bands`'.
    """
    if objective not in PARTITION_OBJECTIVES:
        raise ValueError(f"objective must be one of {PARTITION_OBJECTIVES}, got {objective!r}")
    pp, num_layers = costs.pp, costs.num_layers
    if pp > num_layers:
        return Solution(objective, (), f"{pp} stages for {num_layers} layers (every stage needs a layer)")
    b = bands(costs, objective, masks=masks)
    seg, cut = _walked(b)
    times, run = K.Table.of(seg), _Run(b.gas, cut)
    if isinstance(b.seg_y, np.ndarray):
        ok = _solve_with_sync(times, K.Table.of(b.seg_y), run) < K.INF
    else:
        ok = _solve_eq5(times, run)[0] < K.INF
    if not ok:
        return Solution(objective, (), _infeasible_reason(costs, times), run.passes)
    return Solution(objective, _rank(costs, list(run.found), objective, max(1, top)), "", run.passes)


@dataclass(frozen=True, eq=False)
class Bands:
    """What the walk reads of a :class:`StageCosts`, in band layout (``_kernels``): per stage j, ``seg_t[j, d, b]``
    the stage time of the segment ending at window index b with d+1 layers (each segment at its fastest fitting
    option, +inf where none fits), ``seg_y`` its sync (None without a sync term), ``cut[j, a]`` boundary j's cost
    when stage j+1 starts at window index a. Stage j's slices depend on stage j's rows only, so a caller may cache
    them per stage and stack them (``np.stack``) for another candidate with equal rows."""

    seg_t: np.ndarray  # (pp, W, W) seconds; reaches_bands: (pp, D, W) with rows D.. left out (stage_ceiling)
    seg_y: np.ndarray | Callable[[], np.ndarray] | None  # as seg_t, or a function that makes it when needed
    cut: np.ndarray  # (pp-1, W) seconds
    gas: int
    shortest_t: np.ndarray | None = None  # (D,) seg_t.min(axis=(0, 2)) when the caller has it
    nonnegative: bool = False  # every entry of seg_t, seg_y and cut is ≥ 0 (lets reaches_bands stop early)
    blocking: bool = False  # transfers hold both stages they join (StageCosts.blocking)


def _walked(b: Bands) -> tuple[np.ndarray, np.ndarray]:
    """The stage and cut tables the walk runs on. With blocking transfers a stage's entry is what it is held per
    micro-batch, its time plus the transfers of the boundaries on both sides of the segment (the walk's caps and
    bottleneck are on it), and each cut is charged −e so that a partition's sum stays Σ t + Σ e. The objective is
    then the walk's (gas−1)·max + Σ, unchanged, and with every t and e ≥ 0 still ≥ gas·max entry (a stage's
    transfers are part of Σ t + Σ e), so its early stops hold."""
    if not b.blocking or b.cut.shape[0] == 0:
        return b.seg_t, b.cut
    _, depth, w = b.seg_t.shape
    seg = b.seg_t.copy()
    seg[:-1] += b.cut[:, None, :]  # boundary j when stage j ends at window index b
    start = (np.arange(w)[None, :] - np.arange(depth)[:, None]) % w  # window start b-d (d > b: +inf entries anyway)
    seg[1:] += b.cut[:, start]  # boundary j-1 when stage j starts at window index b-d
    return seg, np.where(np.isinf(b.cut), b.cut, -b.cut)

def bands(costs: StageCosts, objective: str = "full", rows: list[int] | None = None,
          masks: dict | None = None) -> Bands:
    """The band tables of ``costs`` for ``objective`` ("eq5" drops the sync term); needs pp ≤ L. ``rows``: only
    those stages' slices of ``seg_t`` and ``seg_y`` (in that order; ``cut`` stays whole). ``masks``: a dict the
    memory masks are kept in per stage row (:func:`_meets_kept`), shared by the calls of one search."""
    pp, num_layers = costs.pp, costs.num_layers
    r = None if rows is None else np.asarray(rows, dtype=np.int64)
    pick = slice(None) if r is None else r

    def band(prefix: np.ndarray) -> np.ndarray:
        return K.band(prefix, pp, r)

    # (masks as np.where / ufunc where=: the same entries as boolean-index assignment, at a fraction of its time)
    def fits(bounds: tuple[MemoryBound, ...]) -> np.ndarray | None:
        """Whether each segment meets every bound (None: all do)."""
        live = tuple(bound for bound in bounds if not bound.never_binds)
        if not live:
            return None
        if masks is None:
            return _meets(live, pp, num_layers, r)
        return _meets_kept(live, pp, num_layers, np.arange(pp) if r is None else r, masks)

    seg_t = band(costs.time_prefix)
    base = fits(costs.memory_bounds)
    if base is not None:
        seg_t = np.where(base, seg_t, K.INF)
    for o in costs.options:  # each stage segment takes its fastest option that fits (min with +inf: unchanged)
        ok = fits(o.memory_bounds)
        np.minimum(seg_t, band(o.time_prefix), out=seg_t, where=True if ok is None else ok)
    if costs.stage_s is not None:
        seg_t += costs.stage_s[pick, None, None]  # a constant per stage: +inf (invalid) entries stay +inf
    cut = K.window_transfer(costs.transfer_s, pp, num_layers) if pp > 1 else np.zeros((0, 0))
    seg_y = None
    if objective == "full" and costs.sync_prefix is not None:
        seg_y = band(costs.sync_prefix)
        if costs.sync_once is not None:
            seg_y += np.where(seg_y > 0, costs.sync_once[pick, None, None], 0.0)  # +inf entries (d > b) stay +inf
        if costs.sync_s is not None:
            seg_y += costs.sync_s[pick, None, None]
        seg_y = np.where(seg_t == K.INF, K.INF, seg_y)
    return Bands(seg_t, seg_y, cut, costs.gas, nonnegative=_nonnegative(costs), blocking=costs.blocking)


def _meets(bounds: tuple[MemoryBound, ...], pp: int, num_layers: int, r: np.ndarray | None) -> np.ndarray:
    """(n, W, W) whether each segment of the stages ``r`` (all: None) meets every one of ``bounds``."""
    peaks: dict[bytes, np.ndarray] = {}  # range maxima by peak values: the bounds of one option share theirs
    ok: np.ndarray | None = None
    for bound in bounds:
        need = K.band_at_end(bound.tail[0], pp, num_layers, r) + K.band_at_start(bound.head[0], pp, num_layers, r)
        for head, tail in zip(bound.head[1:], bound.tail[1:], strict=True):  # the largest of the operands
            np.maximum(need, K.band_at_end(tail, pp, num_layers, r) + K.band_at_start(head, pp, num_layers, r),
                       out=need)
        if bound.peak is not None:
            key = bound.peak.tobytes()
            if key not in peaks:
                peaks[key] = K.band_range_max(bound.peak, pp, num_layers, r)
            need += peaks[key]
        meets = need <= bound.capacity[slice(None) if r is None else r, None, None]
        ok = meets if ok is None else np.logical_and(ok, meets, out=ok)
    assert ok is not None
    return ok


_MASK_BYTES = 64 << 20  # about this many bytes of stage masks kept in a ``masks`` dict (then it starts afresh)


def _row_digest(bounds: tuple[MemoryBound, ...], j: int) -> bytes:
    """A 32-byte digest (BLAKE2b) of every number of ``bounds`` on row ``j``: operands, working set, capacity (the
    rows themselves would make keys larger than the masks they find)."""
    h = hashlib.blake2b(digest_size=32)
    for b in bounds:  # (each bound's operand count and peak flag first: the stream splits one way only)
        h.update(np.array([len(b.head), b.peak is None, b.capacity[j]], dtype=float).tobytes())
        h.update(b.head[:, j].tobytes())
        h.update(b.tail[:, j].tobytes())
        if b.peak is not None:
            h.update(b.peak[j].tobytes())
    return h.digest()


def _meets_kept(bounds: tuple[MemoryBound, ...], pp: int, num_layers: int, rows: np.ndarray,
                masks: dict) -> np.ndarray:
    """:func:`_meets` on stages ``rows``, each stage's (W, W) mask kept in ``masks`` under its own inputs (the
    bounds' operands, working set and capacity on that row, its position, pp and L: a row of the mask depends on
    nothing else), so candidates whose stages hold GPU types of equal memory reuse them. The same arithmetic,
    stage by stage, so the same entries."""
    if not len(rows):
        return _meets(bounds, pp, num_layers, rows)
    keys = [(pp, num_layers, int(j), _row_digest(bounds, int(j))) for j in rows]
    have = [masks.get(k) for k in keys]
    missing = [i for i, h in enumerate(have) if h is None]
    if missing:
        made = _meets(bounds, pp, num_layers, rows[missing])
        made.setflags(write=False)
        w = num_layers - pp + 1
        if (len(masks) + len(missing)) * w * w > _MASK_BYTES:
            masks.clear()
        for i, m in zip(missing, made, strict=True):
            have[i] = masks[keys[i]] = m
    kept = [h for h in have if h is not None]
    assert len(kept) == len(keys)
    return np.stack(kept)


def _nonnegative(costs: StageCosts) -> bool:
    """Whether every segment time, sync and cut cost of ``costs`` is ≥ 0 (non-decreasing prefixes; the constants
    are validated ≥ 0)."""
    def rising(prefix: np.ndarray | None) -> bool:
        return prefix is None or bool(np.all(np.diff(prefix, axis=1) >= 0))

    return (rising(costs.time_prefix) and all(rising(o.time_prefix) for o in costs.options)
            and rising(costs.sync_prefix) and bool(np.all(costs.transfer_s >= 0)))


def reaches(costs: StageCosts, limit: float, objective: str = "full") -> bool:
    """True when no partition's ``objective`` (as :func:`solve` minimises it) is below ``limit`` seconds, i.e. the
    optimum is ≥ ``limit`` (also when no partition is feasible). The same exact walk as :func:`solve`, told to stop
    as soon as it has shown that nothing below ``limit`` exists (bounds of the walk: module docstring), so it is
    cheaper than solving; for branch and bound (a caller skips a candidate whose optimum cannot beat a threshold)."""
    if objective not in PARTITION_OBJECTIVES:
        raise ValueError(f"objective must be one of {PARTITION_OBJECTIVES}, got {objective!r}")
    if costs.pp > costs.num_layers:
        return True
    return reaches_bands(bands(costs, objective), limit)


def reaches_bands(b: Bands, limit: float) -> bool:
    """:func:`reaches` on band tables (taken over: not copied, not written). With every cost ≥ 0
    (``b.nonnegative``) the walk stops as soon as nothing below ``limit`` can exist, skips every stage at or above
    ``limit / gas`` (Eq. 5 ≥ gas · the largest stage time, so such a partition cannot come below ``limit``) and
    builds the sync table only if the Eq. 5 part alone stays below ``limit`` (Eq. 5 + sync ≥ Eq. 5); otherwise it
    solves exactly. With every cost ≥ 0 the tables may hold only their first D rows (stage lengths) when every
    entry of the rows left out is at or above :func:`stage_ceiling` of ``limit``: a partition using one is not below
    ``limit``, so the answer is the same."""
    seg, cut = _walked(b)
    times = K.Table.of(seg, None if seg is not b.seg_t else b.shortest_t)
    run = _Run(b.gas, cut, bound_only=True)
    if not b.nonnegative:
        if b.seg_y is None:
            return bool(_solve_eq5(times, run)[0] >= limit)
        seg_y = b.seg_y if isinstance(b.seg_y, np.ndarray) else b.seg_y()
        return bool(_solve_with_sync(times, K.Table.of(seg_y), run) >= limit)
    if limit < K.INF:
        run.ceiling = stage_ceiling(limit, b.gas)
    first = _solve_eq5(times, run, stop_at=limit)
    if first[0] >= limit or b.seg_y is None:
        return bool(first[0] >= limit)
    seg_y = b.seg_y if isinstance(b.seg_y, np.ndarray) else b.seg_y()
    return bool(_solve_with_sync(times, K.Table.of(seg_y), run, limit, first) >= limit)


def stage_ceiling(limit: float, gas: int) -> float:
    """Seconds at or above which no stage of a partition below ``limit`` can run, when every cost is ≥ 0 (Eq. 5 ≥
    gas × the largest stage time; a little above ``limit / gas`` against float noise): :func:`reaches_bands` skips
    such stages, and a caller may leave out the band rows (stage lengths) whose every entry is at or above it."""
    return float(np.nextafter(limit / gas, K.INF)) * (1 + 1e-12)


def _rank(costs: StageCosts, found: list[tuple[int, ...]], objective: str, top: int) -> tuple[Assignment, ...]:
    """The ``top`` best of the partitions met, costed by :func:`evaluate_partition` (scored in bulk first: cheaper)."""
    parts = np.asarray(found)
    rows = np.arange(costs.pp)
    t = stage_choice(costs, parts)[0]
    e = costs.transfer_s[rows[:-1], parts[:, 1:-1]] if costs.pp > 1 else np.zeros((len(parts), 0))
    score = pipeline_s(costs, t, e)
    if objective == "full" and costs.sync_prefix is not None:
        y = costs.sync_prefix[rows, parts[:, 1:]] - costs.sync_prefix[rows, parts[:, :-1]]
        y = with_sync_constants(costs, y)
        score = score + y.max(axis=1)
    # re-cost the top few plus anything within float noise of them with the reference arithmetic
    order = np.argsort(score, kind="stable")
    cutoff = score[order[min(top, len(order)) - 1]]
    keep = order[score[order] <= cutoff + 1e-9 * abs(cutoff)]
    ranked = sorted((evaluate_partition(costs, found[i]) for i in keep),
                    key=lambda a: (a.objective(objective), a.partition))
    return tuple(ranked[:top])


def _record(run: _Run, starts: np.ndarray, num_layers: int) -> None:
    if not run.bound_only:  # (reaches reads no partition)
        run.found.setdefault(K.boundaries(starts, num_layers), None)


def _solve_eq5(times: K.Table, run: _Run, sync: K.Caps = _NO_CAPS,
               stop_at: float = K.INF) -> tuple[float, np.ndarray, bool]:
    """Minimise Eq. 5 over stages that satisfy the sync caps in ``sync``.

    Returns (value, start indices, exact). When the optimum is below ``stop_at`` it is found exactly; otherwise the
    walk may stop early and returns (stop_at, starts of the best partition met, False), stop_at being a lower bound.
    Value inf means no partition qualifies.
    """
    pp, _, w = times.seg.shape
    num_layers = w + pp - 1
    gas1 = run.gas - 1

    def caps(time_cap: float) -> K.Caps:
        return K.Caps(min(time_cap, run.ceiling), sync.sync, sync.syncs)

    g, starts = K.min_sum(times, run.cut, caps(K.INF))
    run.passes += 1
    if g == K.INF:
        return K.INF, starts, True
    _record(run, starts, num_layers)
    b = float(K.stage_values(times.seg, starts).max())
    best, best_starts = gas1 * b + g, starts
    if gas1 == 0 or pp == 1:
        return best, best_starts, True
    if gas1 * run.floor + g >= stop_at:  # every partition here: largest stage ≥ the floor, the rest sums to ≥ g
        return stop_at, best_starts, False
    b_star = K.min_max(times, caps(np.nextafter(b, K.INF)))  # B* ≤ b, so stages above b cannot matter
    run.passes += 1
    if sync is _NO_CAPS:  # the smallest largest stage of all partitions (under the ceiling): later walks' floor
        run.floor = max(run.floor, b_star)
    if b_star < b and gas1 * b_star + g < min(best, stop_at):
        if not run.bound_only:  # (the walk below ends at B*'s partition anyway; solved first, it tightens the caps)
            g_star, starts = K.min_sum(times, run.cut, caps(np.nextafter(b_star, K.INF)))  # every stage ≤ B*
            run.passes += 1
            _record(run, starts, num_layers)
            if gas1 * b_star + g_star < best:
                best, best_starts = gas1 * b_star + g_star, starts
        cap, g_last = b, g
        while True:
            bound = min(best, stop_at)
            cap = min(cap, (bound - g_last + _SLACK * abs(bound)) / gas1)
            if cap <= b_star:
                break
            g, starts = K.min_sum(times, run.cut, caps(cap))
            run.passes += 1
            if g == K.INF:  # cannot happen while cap > B*; kept as a guard
                break
            _record(run, starts, num_layers)
            b = float(K.stage_values(times.seg, starts).max())
            if gas1 * b + g < best:
                best, best_starts = gas1 * b + g, starts
            cap, g_last = b, g
    if best < stop_at:
        return best, best_starts, True
    return stop_at, best_starts, False


def _solve_with_sync(times: K.Table, syncs: K.Table, run: _Run, limit: float = K.INF,
                     first: tuple[float, np.ndarray, bool] | None = None) -> float:
    """Minimise Eq. 5 + max stage sync: the same Pareto walk, one level up, over caps on the sync bottleneck.

    Returns the optimum (inf when nothing is feasible) when it is below ``limit``; otherwise a value ≥ ``limit``
    (the walk skips what cannot come below ``limit``). ``first``: the walk's first step when already made
    (``_solve_eq5(times, run, stop_at=limit)``)."""
    h, starts, exact = first if first is not None else _solve_eq5(times, run, stop_at=limit)
    if h == K.INF:
        return K.INF
    if not exact:  # the Eq. 5 optimum alone is ≥ limit
        return h
    y = float(K.stage_values(syncs.seg, starts).max())
    best = h + y
    y_star = K.min_max(syncs, K.Caps(np.nextafter(y, K.INF)))
    run.passes += 1
    if y_star >= y:
        return best
    if h + y_star >= limit:  # every partition: Eq. 5 ≥ h and max sync ≥ Y*, so none comes below limit
        return h + y_star
    if not run.bound_only:  # (the walk below ends at Y*'s partitions anyway; solved first, it tightens the caps)
        h_star, _, exact = _solve_eq5(times, run, K.Caps(sync=np.nextafter(y_star, K.INF), syncs=syncs),
                                      min(best, limit) - y_star)
        if exact or limit == K.INF:  # not exact: h_star is the stop value, no partition's (≥ the bound anyway)
            best = min(best, h_star + y_star)
    cap, h_last = y, h
    while True:
        bound = min(best, limit)
        cap = min(cap, bound - h_last + _SLACK * abs(bound))
        if cap <= y_star:
            return best
        # an inner optimum ≥ bound - Y* cannot help: let the inner walk stop there
        h, starts, exact = _solve_eq5(times, run, K.Caps(sync=cap, syncs=syncs), bound - y_star)
        if h == K.INF or not exact:
            return best
        y = float(K.stage_values(syncs.seg, starts).max())
        best = min(best, h + y)
        cap, h_last = y, h


def _infeasible_reason(costs: StageCosts, times: K.Table) -> str:
    if (costs.memory_bounds or costs.options) and K.min_max(times) == K.INF:
        return "no partition fits every stage in its memory capacity"
    return "every partition uses a forbidden cut (transfer = inf)"
