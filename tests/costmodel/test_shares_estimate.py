"""Uneven data-parallel shares in the cost model: each replica's pipeline with its own micro-batches, the gradient
all-reduce after the slowest, and memory per replica."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pipeline import simulate
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from tests.conftest import SPECS

# replica 0 on two A100s (devices 0, 1), replica 1 on two A40s (devices 16, 17); rank = stage·dp + replica
MIXED = Strategy(pp=2, dp=2, tp=1, mbs=2, gbs=16, placement=(0, 16, 1, 17))


@pytest.fixture(scope="module")
def cm() -> CostModel:
    return CostModel(load_cluster(SPECS / "mixed-a100-a40.yaml"), load_model("gpt3-1.3b"))


def _blocking_eq5_by_hand(fwd: tuple[float, ...], bwd: tuple[float, ...], p2p: tuple[float, ...], g: int) -> float:
    # two stages, one boundary crossed once each way per micro-batch: both stages are held by both transfers
    t = [f + b for f, b in zip(fwd, bwd, strict=True)]
    e = 2 * p2p[0]
    return (g - 1) * max(t[0] + e, t[1] + e) + t[0] + t[1] + e


def test_two_replicas_by_hand(cm: CostModel) -> None:
    est = cm.estimate(replace(MIXED, replica_gas=(6, 2)))
    assert est.strategy.shares == (6, 2) and est.strategy.gbs == 16
    for r, g in enumerate((6, 2)):
        assert est.pipeline_s[r] == pytest.approx(_blocking_eq5_by_hand(est.fwd_s[r], est.bwd_s[r], est.p2p_s[r], g),
                                                  rel=1e-12)
    assert est.iteration_s == pytest.approx(max(est.pipeline_s) + max(est.tail_s), rel=1e-12)
    equal = cm.estimate(MIXED)
    # the A40 replica is the slower: moving two of its micro-batches to the A100 replica shortens the iteration
    assert equal.pipeline_s[1] > equal.pipeline_s[0] and est.iteration_s < equal.iteration_s
    assert est.fwd_s == equal.fwd_s and est.tail_s == equal.tail_s  # per-micro-batch terms do not move
    assert est.samples_per_s == pytest.approx(16 / est.iteration_s)


def test_equal_shares_spelled_out_give_todays_numbers(cm: CostModel) -> None:
    for schedule in ("1f1b", "gpipe"):
        today = cm.estimate(replace(MIXED, schedule=schedule))
        spelled = cm.estimate(replace(MIXED, schedule=schedule, replica_gas=(4, 4)))  # the uneven code path
        assert spelled.iteration_s == today.iteration_s and spelled.pipeline_s == today.pipeline_s
        assert spelled.memory_bytes_per_device == today.memory_bytes_per_device
        assert (spelled.fits, spelled.oom_reason, spelled.memory_risk) == (today.fits, today.oom_reason,
                                                                           today.memory_risk)


def test_simulation_runs_each_replica_with_its_share(cm: CostModel) -> None:
    est = cm.estimate(replace(MIXED, replica_gas=(5, 3)), "simulate")
    for r, g in enumerate((5, 3)):
        one = simulate(est.fwd_s[r], est.bwd_s[r], est.p2p_s[r], est.p2p_s[r], g, "1f1b").makespan_s
        assert est.pipeline_s[r] == pytest.approx(one, rel=1e-12)


def test_memory_per_replica_follows_its_share(cm: CostModel) -> None:
    devices = {0: 0, 16: 1, 1: 0, 17: 1}  # device: replica
    growth = {}
    for schedule in ("gpipe", "1f1b"):
        uneven = cm.estimate(replace(MIXED, schedule=schedule, replica_gas=(6, 2)))
        # a replica's device holds what it would under equal shares of its own micro-batch count
        alone = {g: cm.estimate(replace(MIXED, schedule=schedule, gbs=2 * 2 * g)) for g in (6, 2)}
        for d, r in devices.items():
            assert uneven.memory_bytes_per_device[d] == alone[(6, 2)[r]].memory_bytes_per_device[d]
        assert uneven.memory_bytes_per_device[0] > alone[2].memory_bytes_per_device[0]
        growth[schedule] = alone[6].memory_bytes_per_device[0] - alone[2].memory_bytes_per_device[0]
    # GPipe keeps all six micro-batches' activations; 1F1B bounds them by the stage depth (2)
    assert growth["gpipe"] > 3 * growth["1f1b"] > 0


def test_shared_processors_take_per_replica_shares() -> None:
    from ampe.costmodel.pipeline import simulate_shared

    f = np.array([[1.0], [1.0]])
    b = np.array([[2.0], [2.0]])
    empty = np.zeros((2, 0))
    # two single-stage replicas on processors of their own: the longer share sets the makespan
    assert simulate_shared(f, b, empty, empty, (3, 1), [[[0]], [[1]]]) == pytest.approx(3 * 3.0)
    # on one shared processor: 4 micro-batches' work at one processor's speed
    assert simulate_shared(f, b, empty, empty, (3, 1), [[[0]], [[0]]]) == pytest.approx(4 * 3.0)
