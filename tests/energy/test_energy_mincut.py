"""The two max-flow back ends of the warm-started min cut (pure-Python Dinic for small networks, scipy's C max flow
for large ones) against each other: same flow value and the same source side of the cut, so the same frontier."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.tradeoff import mincut
from ampe.tradeoff.frontier import trace_frontier
from tests.energy.energy_support import random_dag


def _random_network(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, int]:
    """A random DAG-shaped network on m nodes, s = 0, t = 1 (no two arcs between the same pair of nodes)."""
    m = int(rng.integers(4, 40))
    order = np.concatenate([[0], rng.permutation(np.arange(2, m)), [1]])
    rank = np.empty(m, dtype=np.int64)
    rank[order] = np.arange(m)
    pairs = {(int(a), int(b)) for a, b in rng.integers(0, m, size=(4 * m, 2)) if rank[a] < rank[b]}
    arcs = np.array(sorted(pairs), dtype=np.int64)
    return arcs[:, 0], arcs[:, 1], m


@pytest.mark.parametrize("seed", range(40))
def test_python_and_scipy_max_flow_agree(seed):
    rng = np.random.default_rng(seed)
    tails, heads, m = _random_network(rng)
    fwd = rng.integers(0, 50, len(tails))
    fwd[rng.random(len(tails)) < 0.2] = mincut.INF_CAP
    bwd = np.where(rng.random(len(tails)) < 0.3, rng.integers(0, 20, len(tails)), 0)
    results = []
    for python in (True, False):
        net, reach = mincut._Arcs(tails, heads, m, python=python).max_flow(fwd, bwd, 0, 1)
        assert ((net <= fwd) & (net >= -bwd)).all()  # within the residual capacities
        balance = np.zeros(m, dtype=np.int64)
        np.add.at(balance, heads, net)
        np.subtract.at(balance, tails, net)
        assert (balance[2:] == 0).all()  # conserved
        assert reach[0] and not reach[1]
        # nothing leaves the source side with residual capacity: a cut of value = flow, hence minimum
        out = reach[tails] & ~reach[heads]
        back = reach[heads] & ~reach[tails]
        assert (net[out] == fwd[out]).all() and (net[back] == -bwd[back]).all()
        results.append((int(balance[1]), reach))
    assert results[0][0] == results[1][0]
    assert np.array_equal(results[0][1], results[1][1])  # the source-minimal min cut is unique


@pytest.mark.parametrize("seed", range(4))
def test_frontier_is_the_same_with_either_max_flow(seed):
    rng = np.random.default_rng(100 + seed)
    dag = random_dag(rng, int(rng.integers(2, 5)), int(rng.integers(3, 9)), 4, transfers=bool(seed % 2),
                     schedule="gpipe" if seed == 3 else "1f1b")
    traces = []
    for limit in (0, 1 << 30):  # 0: every network goes to scipy; huge: every one to the Python Dinic
        traces.append(trace_frontier(dag, 0.001, py_max_entries=limit).trace)
    a, b = traces
    assert (a.t_star, a.t_min, a.max_flows) == (b.t_star, b.t_min, b.max_flows)
    for x, y in zip(a.segments, b.segments, strict=True):
        assert (x.start, x.length) == (y.start, y.length)
        assert np.array_equal(x.moved, y.moved) and np.array_equal(x.direction, y.direction)
