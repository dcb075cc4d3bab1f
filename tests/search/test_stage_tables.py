"""The DP's stage tables come from the cost model's own terms: on strategies where the DP's additive model is exact
(one replica, tied ends on different stages), the tables cost any partition exactly as the estimate does — including
the per-instruction and per-iteration overheads that only CPU devices have."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pipeline import eq5
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.dp_assign import evaluate_partition
from ampe.search.engine import stage_costs

CPU4 = {"name": "cpu4", "nodes": [{"name": "h", "gpu": "cpu", "count": 4, "intra_gbps": 40, "inter_gbps": 40}]}


@pytest.mark.parametrize("pp, mbs", [(2, 1), (2, 4), (4, 2)])
def test_tables_cost_every_partition_as_the_estimate_does(pp, mbs):
    cluster = cluster_from_dict({**CPU4, "nodes": [{**CPU4["nodes"][0], "count": pp}]})
    model = load_model("gpt2-tiny")
    cm = CostModel(cluster, model)
    base = Strategy(pp=pp, dp=1, tp=1, mbs=mbs, gbs=8, placement=tuple(range(pp)))
    costs = stage_costs(cm, base)
    gpu = cluster.devices[0].gpu
    assert gpu.pipeline_op_s > 0 and gpu.iteration_overhead_s > 0  # the constants are really exercised
    rng = np.random.default_rng(pp * 10 + mbs)
    cuts = list(itertools.combinations(range(2, model.num_layers - 1), pp - 1))
    for k in rng.choice(len(cuts), size=min(12, len(cuts)), replace=False):
        partition = (0, *cuts[k], model.num_layers)
        est = cm.estimate(Strategy(pp=pp, dp=1, tp=1, mbs=mbs, gbs=8, partition=partition,
                                   placement=base.placement))
        a = evaluate_partition(costs, partition)
        assert a.eq5_s == pytest.approx(est.pipeline_s[0], rel=1e-9)
        assert a.sync_s == pytest.approx(est.tail_s, rel=1e-9)


@pytest.mark.parametrize("pp, tp", [(2, 2), (4, 1)])
def test_tables_charge_blocking_transfers_on_slow_links_as_the_estimate_does(pp, tp):
    """On 1 Gbit/s links (two nodes of two GPUs), where 1F1B's blocking transfers set the bottleneck, the DP's
    objective is the estimate's pipeline for every partition, so the DP ranks partitions as the estimate does."""
    cluster = cluster_from_dict({"name": "slow", "nodes": [
        {"name": "n", "gpu": "RTX3090", "count": 2, "intra_gbps": 100, "inter_gbps": 1, "repeat": 2}]})
    model = load_model("gpt2-medium")
    cm = CostModel(cluster, model)
    base = Strategy(pp=pp, dp=1, tp=tp, mbs=1, gbs=16, placement=tuple(range(4)))
    costs = stage_costs(cm, base)
    assert costs.blocking
    rng = np.random.default_rng(pp)
    cuts = list(itertools.combinations(range(1, model.num_layers), pp - 1))
    moved = 0
    for k in rng.choice(len(cuts), size=12, replace=False):
        partition = (0, *cuts[k], model.num_layers)
        est = cm.estimate(Strategy(pp=pp, dp=1, tp=tp, mbs=1, gbs=16, partition=partition,
                                   placement=base.placement))
        a = evaluate_partition(costs, partition)
        assert a.eq5_s == pytest.approx(est.pipeline_s[0], rel=1e-9)
        moved += a.eq5_s > eq5(a.stage_s, a.transfer_s, 16) * (1 + 1e-9)
    assert moved == 12  # every one pays for its transfers in the steady state
