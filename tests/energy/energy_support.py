"""Shared helpers of the energy tests: random small DAGs, the LP relaxation oracle, brute force, and a small
heterogeneous strategy."""

from __future__ import annotations

import itertools

import numpy as np
from scipy.optimize import linprog

from ampe.costmodel.cluster import Cluster, cluster_from_dict
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.pipeline_dag import build_dag
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import OptionTable, earliest, evaluate_batch
from ampe.tradeoff.hull import quantized_times
from ampe.tradeoff.options import OpOptions, Option
from ampe.tradeoff.pd import Problem


def random_dag(rng: np.random.Generator, stages: int, microbatches: int, clocks: int, *, transfers: bool = False,
               schedule: str = "1f1b", blocking_w: float = 70.0) -> ComputationDag:
    """A DAG whose computations have ``clocks`` random (time, energy) options each (not necessarily convex)."""
    specs = []
    for _ in range(stages):
        kinds = {}
        for kind in ("forward", "backward"):
            base = rng.uniform(0.005, 0.03) * (2 if kind == "backward" else 1)
            opts = []
            for f in sorted(rng.choice(np.arange(600, 1500, 15), clocks, replace=False)):
                x = f / 1500
                t = base * (rng.uniform(0.3, 0.7) / x + 0.4) * rng.uniform(0.97, 1.03)
                opts.append(Option(float(f), t, 300 * (0.5 + 0.5 * x**3) * rng.uniform(0.95, 1.05) * t))
            kinds[kind] = OpOptions(tuple(opts))
        specs.append(kinds)
    p2p = list(rng.uniform(0.0005, 0.003, stages - 1)) if transfers else None
    return build_dag(specs, microbatches, schedule=schedule, blocking_w=[blocking_w] * stages, p2p_forward_s=p2p)


def lp_relaxation(problem: Problem, makespan_units: int) -> float:
    """Exact optimum of the relaxed problem at a makespan (HiGHS LP): min Σ hull_i(d_i) s.t. longest path ≤ T.

    Variables: durations d, cost epigraphs z, start times S. Constant operations contribute no cost.
    """
    n = len(problem.costs)
    a_ub, b_ub = [], []
    bounds: list[tuple] = []
    for v, c in enumerate(problem.costs):
        bounds.append((problem.fixed[v],) * 2 if c is None else (c.lo, c.hi))
    bounds += [(None, None)] * n + [(0, None)] * n
    obj = np.zeros(3 * n)

    def row(entries: dict[int, float], rhs: float) -> None:
        r = np.zeros(3 * n)
        for i, x in entries.items():
            r[i] += x
        a_ub.append(r)
        b_ub.append(rhs)

    for v, c in enumerate(problem.costs):
        if c is None:
            bounds[n + v] = (0, 0)
            continue
        obj[n + v] = 1
        if len(c.q) == 1:
            row({n + v: -1}, -c.cost[0])
        for j in range(len(c.q) - 1):  # z ≥ cost_j − slope_j (d − q_j)
            row({n + v: -1, v: -c.slope(j)}, -c.cost[j] - c.slope(j) * c.q[j])
    for v, (ps, ls) in enumerate(zip(problem.preds, problem.lags, strict=False)):
        for p, lag in zip(ps, ls, strict=False):
            row({2 * n + p: 1, p: 1, 2 * n + v: -1}, -lag)
        row({2 * n + v: 1, v: 1}, makespan_units)
    res = linprog(obj, A_ub=np.array(a_ub), b_ub=np.array(b_ub), bounds=bounds, method="highs")
    assert res.status == 0, res.message
    return float(res.fun)


def brute_force(dag: ComputationDag, unit_s: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every clock assignment: (real makespan s, quantized makespan units, effective energy J) arrays."""
    table = OptionTable.of(dag)
    ranges = [range(int(table.num_options[v])) for v in range(len(dag.nodes))]
    choices = np.array(list(itertools.product(*ranges)), dtype=np.int64)
    t, _, eff = evaluate_batch(dag, table, choices)
    units = np.zeros(table.time_s.shape)
    for v in range(len(dag.nodes)):
        k = int(table.num_options[v])
        units[v, :k] = quantized_times(list(table.time_s[v, :k]), unit_s)
    _, ef = earliest(dag, units[np.arange(len(dag.nodes)), choices])
    return t, ef.max(axis=1), eff


def het_strategy() -> tuple[Cluster, Estimate]:
    """Replica 0 on two A100s, replica 1 on two V100s (GPT-2, pp 2, dp 2, mbs 2, gbs 16): the V100 replica is the
    straggler."""
    cl = cluster_from_dict({"name": "het", "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100},
        {"name": "v", "gpu": "V100-32GB", "count": 2, "intra_gbps": 300, "inter_gbps": 100}]})
    est = CostModel(cl, load_model("gpt2")).estimate(Strategy(2, 2, 1, 2, 16, placement=(0, 2, 1, 3)))
    return cl, est
