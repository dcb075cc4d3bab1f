"""The slack-spreading partition (max-min stage time under a cap, then least time) against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ampe.dp_assign import StageCosts, brute_force, evaluate_partition, solve, spread_partition
from ampe.dp_assign.brute import all_partitions
from ampe.dp_assign.spread import segment_times
from tests.dp_assign.test_dp_assign_exact import random_costs, with_bounds, with_options


def _oracle(costs: StageCosts, cap: float) -> tuple[float, float] | None:
    """(largest smallest-stage time, then least Σ stage + Σ transfer seconds) over every fitting partition with
    finite transfers and every stage ≤ cap, by enumeration; None when there is none."""
    best: tuple[float, float] | None = None
    for p in all_partitions(costs.num_layers, costs.pp):
        a = evaluate_partition(costs, p)
        if not a.fits or not np.isfinite(a.eq5_s) or max(a.stage_s) > cap:
            continue
        key = (min(a.stage_s), sum(a.stage_s) + sum(a.transfer_s))
        if best is None or key[0] > best[0] or (key[0] == best[0] and key[1] < best[1]):
            best = key
    return best


def _check(costs: StageCosts, cap: float) -> bool:
    want = _oracle(costs, cap)
    got = spread_partition(costs, cap)
    if want is None:
        assert got is None
        return False
    assert got is not None and got.fits and max(got.stage_s) <= cap
    assert min(got.stage_s) == want[0]  # the same entries, no arithmetic in between: exact
    assert sum(got.stage_s) + sum(got.transfer_s) == pytest.approx(want[1], rel=1e-12, abs=1e-12)
    return True


@pytest.mark.parametrize("integer", [True, False])
def test_spread_partition_matches_brute_force(integer):
    """Random stage-dependent instances (memory, memory bounds with first-layer, end and working-set terms, per-stage
    constants, per-stage options like recomputation), the cap at the DP's bottleneck and above it."""
    rng = np.random.default_rng(8100 + integer)
    found = 0
    for i in range(150):
        costs = random_costs(rng, integer, memory=bool(i % 2), sync=False)
        if i % 3 == 0:
            costs = with_options(rng, costs, integer)
        if i % 4 == 1:
            costs = with_bounds(rng, costs, integer)
        best = solve(costs, "eq5").best
        caps = [float(rng.uniform(0, 40))]
        if best is not None:
            caps += [best.bottleneck_s, best.bottleneck_s * 1.3]
        for cap in caps:
            found += _check(costs, cap)
    assert found > 150  # most instances have a partition under the cap


def test_forbidden_cuts_are_never_used():
    rng = np.random.default_rng(8200)
    for _ in range(60):
        costs = random_costs(rng, False, memory=False, sync=False)
        if costs.pp < 2:
            continue
        transfer = costs.transfer_s.copy()
        transfer[rng.random(transfer.shape) < 0.4] = np.inf
        forbidden = StageCosts(costs.time_prefix, transfer, costs.gas, stage_s=costs.stage_s)
        _check(forbidden, 30.0)


def test_segment_times_are_the_evaluators_stage_times():
    rng = np.random.default_rng(8300)
    for i in range(40):
        costs = with_options(rng, random_costs(rng, False, memory=True, sync=False), False)
        if i % 2:
            costs = with_bounds(rng, costs, False)
        t = segment_times(costs)
        for p in itertools.islice(all_partitions(costs.num_layers, costs.pp), 50):
            a = evaluate_partition(costs, p)
            got = [t[j, p[j], p[j + 1]] for j in range(costs.pp)]
            if a.fits:
                assert got == list(a.stage_s)
            else:
                assert any(np.isinf(got))


def test_hand_computed_blocks_and_a_head():
    """Eight identical 1 s blocks and a 1.2 s head on 4 stages, 16 micro-batches. Eq. 5's optimum has a 3 s
    bottleneck, and the DP's partition piles the spare time onto the head stage: 3, 3, 2, 1.2 s. Under the same 3 s
    cap the spread partition is 2, 2, 3, 2 + 1.2 s: the same Eq. 5 (15 · 3 + 9.2 = 54.2 s), one stage at the cap
    instead of two, and no stage under 2 s — the most any partition under the cap allows (brute force)."""
    layer = np.array([[1.0] * 8 + [1.2]] * 4)
    costs = StageCosts(np.concatenate([np.zeros((4, 1)), np.cumsum(layer, axis=1)], axis=1), None, 16)
    dp = solve(costs, "eq5").best
    assert dp is not None and dp.partition == (0, 3, 6, 8, 9) and dp.eq5_s == pytest.approx(54.2)
    a = spread_partition(costs, dp.bottleneck_s)
    assert a is not None and a.partition == (0, 2, 4, 7, 9) and a.eq5_s == pytest.approx(54.2)
    assert [round(x, 9) for x in a.stage_s] == [2.0, 2.0, 3.0, 2.2]
    assert max(min(b.stage_s) for b in brute_force(costs, "eq5") if b.bottleneck_s <= 3.0) == 2.0
