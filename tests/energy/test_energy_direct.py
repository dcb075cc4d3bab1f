"""The point solved directly (time objective): never slower than its deadline, close to the traced frontier."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.tradeoff.direct import point_by
from ampe.tradeoff.evaluate import OptionTable, evaluate_batch, fastest_choice
from ampe.tradeoff.frontier import trace_frontier
from tests.energy.energy_support import random_dag


@pytest.mark.parametrize("seed,stages,microbatches,transfers,schedule", [
    (0, 2, 3, False, "1f1b"), (1, 3, 6, True, "1f1b"), (2, 4, 8, False, "gpipe"), (3, 4, 12, True, "1f1b"),
    (4, 5, 10, True, "gpipe"), (5, 3, 16, False, "1f1b"),
])
def test_never_slower_than_all_max_and_close_to_the_frontier(seed, stages, microbatches, transfers, schedule):
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, stages, microbatches, 6, transfers=transfers, schedule=schedule)
    table = OptionTable.of(dag)
    t_max, e_max, eff_max = (float(x[0]) for x in evaluate_batch(dag, table, fastest_choice(dag)[None, :]))
    choice, ev = point_by(dag, table=table)
    t, e, eff = (float(x[0]) for x in evaluate_batch(dag, table, choice[None, :]))
    assert (t, e, eff) == pytest.approx((ev.time_s, ev.energy_j, ev.effective_j), rel=1e-12)
    assert t <= t_max * (1 + 1e-12)  # never slower than every clock at maximum
    assert eff <= eff_max + 1e-9
    # The frontier traced with PD (τ = T_min / 1000) has no point at or before T_min more than 0.5 % cheaper.
    points = trace_frontier(dag, t_max / 1000).points()
    best = min(p.effective_j for p in points if p.time_s <= t_max * (1 + 1e-12))
    assert eff - best <= 0.005 * e_max
    # A later deadline is met too, and never costs more.
    _, ev2 = point_by(dag, t_max * 1.05, table)
    assert ev2.time_s <= t_max * 1.05 * (1 + 1e-12) and ev2.effective_j <= eff + 1e-9


def test_time_objective_plans_are_never_slower_than_all_max():
    from ampe.costmodel.catalog import CATALOG
    from ampe.energy.inputs import PipelineInputs, dag_from_inputs

    for fwd, m in (((0.011, 0.010, 0.013), 24), ((0.02, 0.02, 0.02, 0.026), 40)):
        inp = PipelineInputs(fwd, tuple(2 * x for x in fwd), (CATALOG["A100-80GB"],) * len(fwd), m,
                             p2p_forward_s=(0.0007,) * (len(fwd) - 1))
        dag = dag_from_inputs(inp)
        table = OptionTable.of(dag)
        t_max, e_max, _ = (float(x[0]) for x in evaluate_batch(dag, table, fastest_choice(dag)[None, :]))
        _, ev = point_by(dag, table=table)
        assert ev.time_s <= t_max * (1 + 1e-12)
        assert ev.energy_j < e_max  # imbalanced stages: intrinsic bloat removed without slowing down


def _epigraph_lp(dag, table, deadline_s: float) -> float:
    """Independent oracle of the relaxation's optimum: durations d, starts s, one cost epigraph z per computation
    (z ≥ every hull piece's line), every transfer a node of its own, dense matrices (small DAGs only)."""
    from scipy.optimize import linprog

    from ampe.tradeoff.direct import _hull

    n = len(dag.nodes)
    fixed = table.time_s[np.arange(n), fastest_choice(dag)]
    lo, hi = fixed.copy(), fixed.copy()
    rows, rhs = [], []
    const = 0.0
    for v in range(n):
        times, ids = table.row_pareto[int(table.row_of[v])]
        if not dag.is_computation(v) or len(times) < 2:
            continue
        ht, hc = _hull(times, table.row_effective_j[int(table.row_of[v]), ids])
        lo[v], hi[v] = ht[0], ht[-1]
        for a in range(len(ht) - 1):  # slope·d − z ≤ slope·t_a − c_a
            slope = (hc[a + 1] - hc[a]) / (ht[a + 1] - ht[a])
            r = np.zeros(3 * n)
            r[v], r[2 * n + v] = slope, -1
            rows.append(r)
            rhs.append(slope * ht[a] - hc[a])
    for v in range(n):
        for p in dag.preds[v]:  # s_p + d_p ≤ s_v
            r = np.zeros(3 * n)
            r[n + p], r[p], r[n + v] = 1, 1, -1
            rows.append(r)
            rhs.append(0.0)
        if not dag.succs[v]:
            r = np.zeros(3 * n)
            r[n + v], r[v] = 1, 1
            rows.append(r)
            rhs.append(deadline_s)
    has_cost = np.zeros(n, dtype=bool)
    for r in rows:
        has_cost |= r[2 * n:] != 0
    c = np.concatenate([np.zeros(2 * n), has_cost.astype(float)])
    bounds = [(lo[v], hi[v]) for v in range(n)] + [(0, None)] * n + [(None, None) if h else (0, 0)
                                                                       for h in has_cost]
    res = linprog(c, A_ub=np.array(rows), b_ub=np.array(rhs), bounds=bounds, method="highs")
    assert res.status == 0
    return float(res.fun) + const


@pytest.mark.parametrize("seed", range(8))
def test_relaxed_plan_is_the_relaxation_optimum(seed):
    """The piece-variable LP of ``relaxed_plan`` reaches the optimum of the plain epigraph LP of the same relaxation
    (transfers as nodes rather than edge lags), at the all-max time and later deadlines."""
    from ampe.tradeoff.direct import _hull, relaxed_plan

    rng = np.random.default_rng(50 + seed)
    dag = random_dag(rng, int(rng.integers(2, 5)), int(rng.integers(2, 9)), int(rng.integers(2, 7)),
                     transfers=bool(seed % 2), schedule="gpipe" if seed % 4 == 3 else "1f1b")
    table = OptionTable.of(dag)
    t_max = float(evaluate_batch(dag, table, fastest_choice(dag)[None, :])[0][0])
    for factor in (1.0, 1.04, 1.3):
        durations, finish = relaxed_plan(dag, table, t_max * factor)
        cost = 0.0
        for v in range(len(dag.nodes)):
            times, ids = table.row_pareto[int(table.row_of[v])]
            if dag.is_computation(v) and len(times) >= 2:
                ht, hc = _hull(times, table.row_effective_j[int(table.row_of[v]), ids])
                assert ht[0] - 1e-9 <= durations[v] <= ht[-1] + 1e-9
                cost += float(np.interp(durations[v], ht, hc))
        assert np.nanmax(np.where(np.isfinite(finish), finish, np.nan)) <= t_max * factor * (1 + 1e-7)
        assert cost == pytest.approx(_epigraph_lp(dag, table, t_max * factor), rel=1e-7, abs=1e-7)
