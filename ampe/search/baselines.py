"""The Megatron heuristic (AMP paper §4.1/§5.2), costed by ampe's own model, for comparisons.

For every micro-batch size: tensor parallelism no larger than the smallest node, the smallest tp·pp that fits in
memory (largest dp; within one tp·pp, tensor parallelism first), Megatron rank order, and the uniform
transformer-count partition (DeepSpeed ``type:transformer``; AMP's ``pipe_gpt2`` rule).
"""

from __future__ import annotations

from dataclasses import replace

from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.strategy import Strategy
from ampe.dp_assign import uniform_by_count, uniform_layers
from ampe.search.space import divisors, node_gcd


def megatron_partition(cm: CostModel, pp: int) -> tuple[int, ...]:
    """Transformer blocks split evenly (boundaries before blocks); uniform layers if there are too few blocks."""
    counted = [l.kind == "transformer" for l in cm.model.layers]
    if sum(counted) >= pp:
        return uniform_by_count(counted, pp)
    return uniform_layers(cm.model.num_layers, pp)


def megatron_candidates(cm: CostModel, gbs: int) -> list[Estimate]:
    """Megatron's pick for each micro-batch size (the ones that fit), costed by ``cm``; fastest first."""
    n = cm.cluster.size
    max_tp = node_gcd(cm.cluster)
    picks: list[Estimate] = []
    for mbs in sorted({m for dp in divisors(n) if gbs % dp == 0 for m in divisors(gbs // dp)}):
        options = []
        for tp in divisors(max_tp):
            for pp in divisors(n // tp):
                dp = n // (tp * pp)
                if gbs % dp or (gbs // dp) % mbs or pp > cm.model.num_layers:
                    continue
                options.append((tp * pp, -tp, pp, dp, tp))
        for _, _, pp, dp, tp in sorted(options):
            s = Strategy(pp=pp, dp=dp, tp=tp, mbs=mbs, gbs=gbs)
            est = cm.estimate(replace(s, partition=megatron_partition(cm, pp)))
            if est.within_capacity:
                picks.append(est)
                break
    return sorted(picks, key=lambda e: e.iteration_s)
