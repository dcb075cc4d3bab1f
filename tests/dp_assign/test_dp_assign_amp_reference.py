"""AMP's tolerance DP: Eq. 12 = Eq. 13, the consistent DP equals brute force, the quirky one is valid but can lose."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.dp_assign import StageCosts, amp_pipe_ast, amp_pipe_cost, brute_force, evaluate_partition, solve
from ampe.dp_assign.amp_reference import segment_sums, tolerance_identity


@settings(max_examples=500, deadline=None)
@given(t1=st.integers(0, 10**6), t2=st.integers(0, 10**6), m=st.integers(0, 10**6))
def test_eq12_equals_eq13_exactly_on_integers(t1, t2, m):
    lhs, rhs = tolerance_identity(t1, t2, m)
    assert lhs == rhs


@settings(max_examples=500, deadline=None)
@given(t1=st.floats(0, 1e3), t2=st.floats(0, 1e3), m=st.floats(0, 1e3))
def test_eq12_equals_eq13_on_floats(t1, t2, m):
    lhs, rhs = tolerance_identity(t1, t2, m)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-9)


def _amp_instance(rng, integer):
    num_layers = int(rng.integers(1, 13))
    pp = int(rng.integers(1, min(num_layers, 5) + 1))
    gas = int(rng.choice([1, 2, 4, 16]))
    t = rng.integers(0, 6, num_layers).astype(float) if integer else rng.random(num_layers)
    cost_c = rng.integers(0, 3, (num_layers - 1, pp - 1)).astype(float) if integer else \
        rng.random((num_layers - 1, pp - 1)) * 0.5
    transfer = np.full((pp - 1, num_layers + 1), np.inf)
    transfer[:, 1:num_layers] = cost_c.T  # boundary j, stage j+1 starting at c = stage j ending at c-1
    costs = StageCosts(np.tile(np.concatenate([[0.0], np.cumsum(t)]), (pp, 1)), transfer, gas)
    return t, cost_c, pp, gas, costs


@pytest.mark.parametrize("integer", [True, False])
def test_consistent_amp_dp_matches_brute_force_and_ours(integer):
    rng = np.random.default_rng(11 + integer)
    for _ in range(150):
        t, cost_c, pp, gas, costs = _amp_instance(rng, integer)
        best = brute_force(costs, "eq5")[0].eq5_s
        part, value = amp_pipe_ast(t, cost_c, pp, gas, quirk=False)
        assert value == pytest.approx(best, rel=1e-12, abs=1e-12)
        assert evaluate_partition(costs, part).eq5_s == pytest.approx(value, rel=1e-12, abs=1e-12)
        assert amp_pipe_cost(t, cost_c, gas, part) == pytest.approx(evaluate_partition(costs, part).eq5_s, rel=1e-12)
        assert solve(costs, "eq5").best.eq5_s == pytest.approx(best, rel=1e-12, abs=1e-12)


def test_quirky_amp_dp_returns_valid_partitions_and_sometimes_worse_ones():
    rng = np.random.default_rng(5)
    worse = 0
    for _ in range(200):
        t, cost_c, pp, gas, costs = _amp_instance(rng, integer=False)
        part, value = amp_pipe_ast(t, cost_c, pp, gas, quirk=True)
        assert evaluate_partition(costs, part).eq5_s == pytest.approx(value, rel=1e-12)
        best = brute_force(costs, "eq5")[0].eq5_s
        assert value >= best - 1e-12
        worse += value > best + 1e-9
    assert worse > 0  # the quirk matters (amp.md §3.4), so the compat mode must keep it


def test_quirk_is_irrelevant_without_transfers():
    rng = np.random.default_rng(8)
    for _ in range(50):
        t, cost_c, pp, gas, _ = _amp_instance(rng, integer=False)
        zero = np.zeros_like(cost_c)
        assert amp_pipe_ast(t, zero, pp, gas, quirk=True)[1] == pytest.approx(
            amp_pipe_ast(t, zero, pp, gas, quirk=False)[1], rel=1e-12)


def test_segment_sums_are_sequential_like_python_sum():
    t = np.random.default_rng(3).random(9)
    seg = segment_sums(t)
    for a in range(9):
        for b in range(a + 1, 10):
            assert seg[a, b] == sum(t[a:b])


def test_amp_dp_rejects_too_many_stages():
    with pytest.raises(ValueError):
        amp_pipe_ast([1.0, 2.0], np.zeros((1, 2)), 3, 2)
