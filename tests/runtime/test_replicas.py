"""Uneven shares at run time without processes: the loss weights, each replica's samples (every micro-batch of an
iteration read once, by one replica), the per-replica DeepSpeed config, and the A/B switch between share vectors."""

from __future__ import annotations

import pytest
import torch

from ampe.costmodel.strategy import Strategy, with_shares
from ampe.costmodel.training import deepspeed_config, loss_weight, replica_deepspeed_config
from ampe.runtime.replicas import ShareSwitch, WeightedLoss, replica_batches, weighted


@pytest.mark.parametrize("shares", [(3, 1), (5, 3), (1, 2, 5), (4, 4)])
def test_weights_undo_deepspeeds_per_replica_mean(shares):
    dp, total = len(shares), sum(shares)
    weights = [loss_weight(shares, r) for r in range(dp)]
    # DeepSpeed: replica r's gradient is w_r·(1/g_r)·Σ its ∇ℓ, averaged over dp; each micro-batch then counts 1/G
    assert all(w / g / dp == pytest.approx(1 / total) for w, g in zip(weights, shares, strict=True))
    assert (len(set(shares)) == 1) == all(w == 1.0 for w in weights)


def _read(shares, replica, iterations):
    it = replica_batches(50, 4, 2, 7, shares, replica)
    return [[tuple(next(it)[0].flatten().tolist()) for _ in range(shares[replica])] for _ in range(iterations)]


@pytest.mark.parametrize("uneven, equal", [((3, 1), (2, 2)), ((5, 3), (4, 4)), ((1, 2), (1, 2))])
def test_each_iterations_samples_are_read_once_whatever_the_shares(uneven, equal):
    for i in range(3):
        got = [b for r in range(len(uneven)) for b in _read(uneven, r, 3)[i]]
        want = [b for r in range(len(equal)) for b in _read(equal, r, 3)[i]]
        assert got == want and len(set(got)) == len(got)  # the same micro-batches, in order, none twice
    tokens, labels = next(replica_batches(50, 4, 2, 7, (3, 1), 0))
    assert tokens.shape == labels.shape == (2, 4)


def test_a_replicas_config_has_its_own_gas_and_the_batch_deepspeed_checks():
    s = with_shares(Strategy(pp=2, dp=2, tp=1, mbs=2, gbs=8), (3, 1))
    for r, g in enumerate((3, 1)):
        cfg = replica_deepspeed_config(s, r, "fp32")
        assert cfg["gradient_accumulation_steps"] == g
        assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * g * s.dp
    equal = Strategy(pp=2, dp=2, tp=1, mbs=2, gbs=8)
    assert replica_deepspeed_config(equal, 1, "fp32") == deepspeed_config(equal, "fp32")


def test_equal_shares_keep_the_loss_and_uneven_ones_scale_it():
    def loss(o, y):
        return torch.tensor(2.0)

    assert weighted(loss, (2, 2), 1) is loss
    assert float(weighted(loss, (3, 1), 1)(None, None)) == pytest.approx(1.0)


def test_the_switch_alternates_gas_weight_and_samples():
    class Engine:
        def __init__(self):
            self.sizes = []

        def set_train_batch_size(self, n):
            self.sizes.append(n)

    engine, w = Engine(), WeightedLoss(lambda o, y: 1.0, 1.0)
    switch = ShareSwitch(w, 2, 1, (4, 2), (3, 3), lambda shares: iter([shares]))
    seen = []
    for i in range(4):
        data = switch.use(engine, i)
        seen.append((next(data) if i < 2 else None, w.weight))
    assert engine.sizes == [2 * 2 * 2, 2 * 3 * 2, 8, 12]
    assert seen[0] == ((4, 2), pytest.approx(2 / 3)) and seen[1] == ((3, 3), 1.0)
    assert seen[2][1] == pytest.approx(2 / 3) and seen[3][1] == 1.0
