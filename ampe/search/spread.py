"""Slack-spreading variants of searched strategies, for the energy objectives (docs/energy.md §10.7).

The search keeps, per (degrees, micro-batch size, placement), the partition its DP finds fastest by AMP's Eq. 5 plus
the largest stage tail. Eq. 5 sees only the largest stage and the sum of all, so it is often indifferent between
partitions that hold the same blocks in another arrangement, and its tie-break (the tail) can pile all the slack onto
one or two light stages, where the energy planner can use little of it. :func:`spread_variant` re-partitions a
strategy at the same bottleneck with :func:`~ampe.dp_assign.spread_partition` (the smallest stage as slow as
possible: Perseus's minimum-imbalance partitioning) and costs it with the same model; the energy ranking then
plans both and keeps whichever is better.
"""

from __future__ import annotations

from dataclasses import replace

from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.strategy import RECOMPUTE, with_stage_recompute
from ampe.dp_assign import evaluate_partition, spread_partition
from ampe.search.engine import option_costs, stage_costs


def spread_variant(cm: CostModel, estimate: Estimate, recompute: tuple[str, ...] = RECOMPUTE,
                   method: str = "eq5") -> Estimate | None:
    """The strategy of ``estimate`` re-partitioned so that its fastest stage is as slow as possible while no stage is
    slower than its slowest one (:func:`~ampe.dp_assign.spread_partition`), costed by ``cm`` (``method``); None when
    that is the partition it has, when it does not fit, or for a strategy without a layer partition to change (one
    stage, interleaved chunks).

    The stage tables are the search's (:func:`~ampe.search.engine.stage_costs`, ``option_costs``): with several
    recomputation options allowed (``recompute``, as given to the search) each stage again runs the fastest one under
    which its layers fit, as the search's DP does; with one, the strategy's own.
    """
    s = estimate.strategy
    if s.pp < 2 or s.virtual_stages > 1 or s.partition is None:
        return None
    recs = tuple(r for r in RECOMPUTE if r in recompute and not (r == "selective" and cm.model.attention == "flash"))
    base = replace(s, partition=None)
    per_stage = len(recs) > 1
    if per_stage:
        base = replace(base, recompute=recs[0], stage_recompute=None)
        costs = option_costs(cm, base, recs)
    else:
        costs = stage_costs(cm, base)
    cap = evaluate_partition(costs, s.partition).bottleneck_s
    found = spread_partition(costs, cap)
    if found is None or found.partition == s.partition:
        return None
    variant = replace(base, partition=tuple(found.partition))
    if per_stage:
        variant = with_stage_recompute(variant, (recs[o] for o in found.options))
    est = cm.estimate(variant, method)
    return est if est.within_capacity else None
