"""Each data-parallel replica's share of the batch: the integer shares that minimise a candidate's iteration time.

A candidate (degrees, placement, partition, micro-batch size, memory options) runs G = gbs/mbs micro-batches per
iteration. Replica r's pipeline takes ``p_r(g)`` seconds for g micro-batches (``CostModel.replica_pipeline_s``:
the closed forms or the simulation), non-decreasing in g; the gradient all-reduce starts after the slowest, so

    iteration(g_1..g_dp) = max_r p_r(g_r) + tail        (the tail does not depend on the shares)

and the best shares minimise ``max_r p_r(g_r)`` over integers g_r ≥ 1 with Σ g_r = G (and g_r ≤ cap_r where
memory caps a replica). :func:`fastest_shares` is exact (proof in docs/shares.md): start every replica at one
micro-batch and hand out the other G − dp one at a time, each to the replica whose pipeline would be shortest
with it. Memory grows with a replica's share (GPipe keeps all its micro-batches in flight; 1F1B bounds them by
the stage depth, but its buffers still grow a little), so :func:`with_best_shares` caps a replica whose devices do
not fit at the share that broke them and chooses again: every cap is implied by the true memory constraint, so
the shares found first that fit are the best that fit.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.memory import reserve_bytes
from ampe.costmodel.strategy import with_shares

SHARES = ("auto", "equal")  # ``ampe search --shares``: the best shares per candidate, or equal shares only
MAX_CAP_ROUNDS = 16  # choices re-run after capping a replica whose devices do not fit (bounded work)


def fastest_shares(total: int, replica_class: Sequence[int], pipeline_s: Callable[[int, int], float],
                   caps: Sequence[int] | None = None,
                   table: Callable[[int, int], np.ndarray] | None = None) -> tuple[int, ...] | None:
    """The integer shares minimising the slowest replica's pipeline (exact for pipelines non-decreasing in the
    share; ties go to the lower replica index, so identical replicas get equal shares where they divide the total).

    Args:
        total: micro-batches per iteration, G (≥ the number of replicas).
        replica_class: [replica] its class: replicas of one class have the same pipeline.
        pipeline_s: (class, micro-batches) → seconds of one pipeline.
        caps: [replica] the most micro-batches it may run (memory); None: no cap.
        table: (class, n) → ``[pipeline_s(class, g) for g in 2..n+1]`` as an array, the same numbers; where given
            and every table is non-decreasing, the same shares come from :func:`_sorted_shares` at once.

    Returns:
        [replica] micro-batches, each ≥ 1 and ≤ its cap, summing to ``total``; None when no such shares exist.
    """
    dp = len(replica_class)
    limit = [total] * dp if caps is None else [min(c, total) for c in caps]
    if total < dp or min(limit) < 1 or sum(limit) < total:
        return None
    if table is not None:
        longest: dict[int, int] = {}
        for c, n in zip(replica_class, limit, strict=True):
            longest[c] = max(longest.get(c, 0), n - 1)
        rows = {c: table(c, n) for c, n in longest.items()}
        if all(bool(np.all(np.diff(row) >= 0)) for row in rows.values()):
            return _sorted_shares(total, replica_class, rows, limit)
    shares = [1] * dp
    heap = [(pipeline_s(replica_class[r], 2), r) for r in range(dp) if limit[r] >= 2]
    heapq.heapify(heap)
    for _ in range(total - dp):
        _, r = heapq.heappop(heap)
        shares[r] += 1
        if shares[r] < limit[r]:
            heapq.heappush(heap, (pipeline_s(replica_class[r], shares[r] + 1), r))
    return tuple(shares)


def _sorted_shares(total: int, replica_class: Sequence[int], rows: dict[int, np.ndarray],
                   limit: Sequence[int]) -> tuple[int, ...]:
    """:func:`fastest_shares`' greedy without its steps. Each replica r offers the keys (``rows[c_r][i]``, r) for
    its micro-batches 2..limit_r, in non-decreasing order; the greedy's heap merges these sorted streams, so its
    total − dp hand-outs are the total − dp smallest keys. They are found by the largest value taken (a binary
    search over the distinct values, counting each replica's keys with ``searchsorted``): every key below it is
    taken, and of the keys equal to it the lower replicas' first (the heap's tie order), up to the count."""
    dp = len(replica_class)
    need = total - dp
    streams = [rows[c][: n - 1] for c, n in zip(replica_class, limit, strict=True)]
    if need == 0:
        return tuple([1] * dp)
    values = np.unique(np.concatenate(list(rows.values())))

    def taken(v: float, side: str) -> np.ndarray:
        return np.array([np.searchsorted(row, v, side=side) for row in streams])  # type: ignore[call-overload]

    lo, hi = 0, len(values) - 1  # the smallest value with at least ``need`` keys at or below it
    while lo < hi:
        mid = (lo + hi) // 2
        if int(taken(values[mid], "right").sum()) >= need:
            hi = mid
        else:
            lo = mid + 1
    below, upto = taken(values[lo], "left"), taken(values[lo], "right")
    left = need - int(below.sum())
    shares = 1 + below
    for r in range(dp):  # the keys equal to the last value taken: lower replicas first
        more = min(left, int(upto[r] - below[r]))
        shares[r] += more
        left -= more
    return tuple(int(x) for x in shares)


def with_best_shares(cm: CostModel, est: Estimate, method: str = "eq5") -> Estimate:
    """``est`` (an equal-shares estimate) with its replicas' shares chosen to minimise the iteration time; ``est``
    itself where uneven shares are not faster, or would fit memory worse than equal shares do (an equal-shares
    estimate that fits with margin is replaced only by shares that fit with margin too).

    Args:
        cm: the cost model that made ``est``.
        est: the candidate, under equal shares.
        method: the pipeline time: "eq5" or "simulate".

    Returns:
        The faster estimate: uneven shares (``Strategy.replica_gas``), or ``est``.
    """
    s = est.strategy
    if s.dp == 1 or s.uneven:
        return est
    classes = cm.layout(s).replica_class
    if int(classes.max()) == 0:
        return est  # identical replicas: equal shares are the greedy's own answer (dp divides G)
    # Megatron's interleaved schedule runs a multiple of pp micro-batches: shares are chosen in units of pp there
    unit = s.pp if s.schedule == "interleaved" and s.virtual_stages > 1 else 1
    total = s.gbs // s.mbs // unit
    cls = classes.tolist()
    per_microbatches, rows = _pipelines(cm, est, method, sorted(set(cls))), _tables(cm, est, method, unit)

    def pipeline_s(c: int, units: int) -> float:
        return per_microbatches(c, units * unit)

    tail = max(est.tail_s)
    caps = [total] * s.dp
    for _ in range(MAX_CAP_ROUNDS):
        units = fastest_shares(total, cls, pipeline_s, caps, rows)
        if units is None or len(set(units)) == 1:
            return est
        shares = tuple(u * unit for u in units)
        # the tail does not depend on the shares: skip the estimate where the pipelines alone show no gain
        # (not where processors are time-shared: their iteration is simulated whole)
        gain = est.iteration_s - max(pipeline_s(c, u) for c, u in zip(cls, units, strict=True)) - tail
        if cm.cluster.processor is None and gain <= _TIE * est.iteration_s:
            return est
        got = cm.estimate(with_shares(s, shares), method)
        if got.iteration_s >= est.iteration_s * (1 - _TIE):
            return est
        over = replicas_over(cm, got, margin=est.fits)
        if not over:
            return got if (got.fits or not est.fits) and got.within_capacity else est
        for r in over:
            caps[r] = units[r] - 1
    return est


_TIE = 1e-9  # relative: a gain below this is float noise, and equal shares are kept


def _pipelines(cm: CostModel, est: Estimate, method: str, classes: list[int]) -> Callable[[int, int], float]:
    """(class, micro-batches) → pipeline seconds of ``est``'s strategy. The closed forms are affine in the
    micro-batches (``ampe.costmodel.pipeline``): two evaluations per class give every share, up to float rounding
    (the estimate of the chosen shares evaluates them exactly); the simulation is run per (class, share)."""
    s = est.strategy
    if method == "eq5":
        ends = {c: (cm.class_pipeline_s(s, c, 1, method), cm.class_pipeline_s(s, c, 2, method)) for c in classes}
        return lambda c, g: ends[c][0] + (g - 1) * (ends[c][1] - ends[c][0])

    @cache
    def simulated(c: int, g: int) -> float:
        return cm.class_pipeline_s(s, c, g, method)

    return simulated


def _tables(cm: CostModel, est: Estimate, method: str, unit: int) -> Callable[[int, int], np.ndarray] | None:
    """For the closed forms, (class, n) → the pipeline seconds of ``unit``·(2..n+1) micro-batches as one array:
    the same arithmetic as :func:`_pipelines`' (so the same numbers); None for the simulation."""
    if method != "eq5":
        return None
    s = est.strategy

    def table(c: int, n: int) -> np.ndarray:
        first, second = cm.class_pipeline_s(s, c, 1, method), cm.class_pipeline_s(s, c, 2, method)
        return first + (np.arange(2, n + 2) * unit - 1) * (second - first)

    return table


def replicas_over(cm: CostModel, est: Estimate, margin: bool) -> list[int]:
    """The replicas of ``est`` with a device whose footprint exceeds its capacity, or with ``margin`` its capacity
    less its reserve (``ampe.costmodel.memory.memory_risk``)."""
    grid = cm.layout(est.strategy).grid  # (pp, dp, tp) device ids
    out = []
    for r in range(est.strategy.dp):
        for d in grid[:, r, :].reshape(-1).tolist():
            gpu = cm.cluster.devices[d].gpu
            room = gpu.memory_bytes - (reserve_bytes(gpu) if margin else 0)
            if est.memory_bytes_per_device[d] > room:
                out.append(r)
                break
    return out


MAX_SHARE_VARIANTS = 32  # other splits of one strategy planned for the energy objectives (nearest its own first)


def share_variants(cm: CostModel, est: Estimate, limit_s: float, method: str = "eq5") -> list[Estimate]:
    """For the energy objectives: the other splits of ``est``'s micro-batches between its two replicas whose
    iteration time is within ``limit_s`` and that fit memory as well as ``est`` does, each costed by ``cm`` — the
    energy planner then chooses over shares and clocks together. A strategy's fastest clocked point is never faster
    than its iteration time, so no split left out could meet the bound.

    Args:
        cm: the cost model that made ``est``.
        est: a two-replica candidate (its own shares, equal or not).
        limit_s: the slowdown bound on the iteration time (s).
        method: the pipeline time: "eq5" or "simulate".

    Returns:
        At most :data:`MAX_SHARE_VARIANTS` estimates, nearest ``est``'s split first; empty for other than two
        replicas, identical replicas, or time-shared processors (their iteration is simulated whole).
    """
    s = est.strategy
    if s.dp != 2 or cm.cluster.processor is not None:
        return []
    classes = cm.layout(s).replica_class.tolist()
    if classes[0] == classes[1]:
        return []
    unit = s.pp if s.schedule == "interleaved" and s.virtual_stages > 1 else 1
    total, own = s.gbs // s.mbs // unit, s.shares[0] // unit
    pipeline_s = _pipelines(cm, est, method, sorted(set(classes)))
    tail = max(est.tail_s)
    within = [u for u in range(1, total) if u != own
              and max(pipeline_s(classes[0], u * unit), pipeline_s(classes[1], (total - u) * unit)) + tail
              <= limit_s * (1 + _TIE)]
    out = []
    for u in sorted(sorted(within, key=lambda u: abs(u - own))[:MAX_SHARE_VARIANTS]):
        got = cm.estimate(with_shares(s, (u * unit, (total - u) * unit)), method)
        if got.iteration_s <= limit_s and (got.fits or not est.fits) and got.within_capacity:
            out.append(got)
    return out
