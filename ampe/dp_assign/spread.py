"""Slack-spreading partitions: under a cap on every stage's time, the partition whose fastest stage is slowest.

The search's objective (AMP's Eq. 5 plus the largest stage tail, :func:`~ampe.dp_assign.solve`) sees only the
largest stage time and the sum of all of them. Many partitions often share both — the same blocks in another
arrangement — and Eq. 5 is then indifferent to where the slack lies. The energy planner is not: slack spread over
many stages lets each run a little slower, near its clock's energy valley, while slack piled onto one or two light
stages is mostly wasted (a stage stops saving once it reaches its valley). :func:`spread_partition` is Perseus's
minimum-imbalance partitioning (largest over smallest stage time) at a given bottleneck: the energy objectives of
``ampe search`` try it beside the search's partition (docs/energy.md §10.7).

Two exact passes over the same per-stage segment times as :func:`~ampe.dp_assign.evaluate_partition` (a stage's
fastest fitting option plus its constant; no fitting option: the segment is not allowed), O(pp · L²) each:

1. m* = max over partitions with every stage ≤ cap of the smallest stage time (a max-min DP);
2. among partitions with every stage time in [m*, cap], the least Σ stage seconds + Σ transfers (a min-sum DP).
"""

from __future__ import annotations

import numpy as np

from ampe.costmodel.bounds import MemoryBound
from ampe.dp_assign.costs import Assignment, StageCosts, evaluate_partition


def segment_times(costs: StageCosts) -> np.ndarray:
    """(pp, L+1, L+1) seconds of stage j running layers a..b-1 at [j, a, b] under its fastest fitting option, plus
    its constant ``stage_s``; +inf where a ≥ b or no option fits (the arithmetic of
    :func:`~ampe.dp_assign.costs.stage_choice`, entry for entry)."""

    def seg(prefix: np.ndarray) -> np.ndarray:
        return prefix[:, None, :] - prefix[:, :, None]  # [j, a, b] = prefix[j, b] - prefix[j, a]

    def fits(bounds: tuple[MemoryBound, ...]) -> np.ndarray:
        ok = np.ones((costs.pp, n + 1, n + 1), dtype=bool)
        for bound in bounds:
            ok &= bound.table() <= bound.capacity[:, None, None]
        return ok

    n = costs.num_layers
    best = np.where(fits(costs.memory_bounds), seg(costs.time_prefix), np.inf)
    for o in costs.options:
        t_o = np.where(fits(o.memory_bounds), seg(o.time_prefix), np.inf)
        best = np.where(t_o < best, t_o, best)
    if costs.stage_s is not None:
        best = best + np.asarray(costs.stage_s)[:, None, None]
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=1)  # a < b: a non-empty stage
    return np.where(upper[None, :, :], best, np.inf)


def spread_partition(costs: StageCosts, cap_s: float) -> Assignment | None:
    """The fitting partition with every stage time ≤ ``cap_s`` (s) whose smallest stage time is largest; ties: the
    least Σ stage seconds + Σ transfer seconds, then the DP's order. None when no fitting partition meets the cap.
    Costed by :func:`~ampe.dp_assign.evaluate_partition`."""
    pp, n = costs.pp, costs.num_layers
    if pp > n:
        return None
    t = segment_times(costs)
    transfer = costs.transfer_s
    ok = t <= cap_s
    if pp > 1:  # a stage may not start where its boundary's transfer forbids the cut (+inf)
        ok[1:] &= np.isfinite(transfer)[:, :, None]
    best = np.full(n + 1, -np.inf)  # the largest smallest-stage time of the first j stages ending at layer b
    best[0] = np.inf  # no stage yet: no minimum
    for j in range(pp):
        best = np.where(ok[j], np.minimum(best[:, None], t[j]), -np.inf).max(axis=0)
    floor = float(best[n])
    if not np.isfinite(floor):
        return None
    allowed = ok & (t >= floor)
    cost = np.full(n + 1, np.inf)
    cost[0] = 0.0
    start = np.zeros((pp, n + 1), dtype=np.int64)  # the best start layer of stage j ending at b
    for j in range(pp):
        lag = transfer[j - 1] if j > 0 else np.zeros(n + 1)  # boundary j-1 when stage j starts at layer a
        cand = np.where(allowed[j], (cost + lag)[:, None] + t[j], np.inf)
        start[j] = np.argmin(cand, axis=0)
        cost = cand[start[j], np.arange(n + 1)]
    assert np.isfinite(cost[n])  # pass 1 found a partition meeting both bounds with allowed cuts
    bounds = [n]
    for j in range(pp - 1, -1, -1):
        bounds.append(int(start[j, bounds[-1]]))
    return evaluate_partition(costs, tuple(reversed(bounds)))
