"""The Phillips–Dessouky frontier against oracles: the exact LP of the relaxation and brute force over clocks."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ampe.energy.pipeline_dag import build_dag
from ampe.tradeoff.evaluate import OptionTable, evaluate_choice, fastest_choice
from ampe.tradeoff.frontier import trace_frontier
from ampe.tradeoff.options import OpOptions, Option
from tests.energy.energy_support import brute_force, lp_relaxation, random_dag


@pytest.mark.parametrize("seed", range(6))
def test_relaxed_frontier_equals_lp_optimum_at_every_time(seed):
    """PD with integer durations is exact for the convex relaxation (Hochbaum 2016): at every quantized time its
    relaxed energy equals the LP optimum. Random 1F1B/GPipe DAGs with and without transfer nodes."""
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, int(rng.integers(2, 5)), int(rng.integers(2, 7)), int(rng.integers(2, 6)),
                     transfers=bool(seed % 2), schedule="gpipe" if seed % 3 == 2 else "1f1b")
    fr = trace_frontier(dag, float(rng.choice([0.0005, 0.001, 0.002])))
    t_min, t_star = fr.trace.t_min, fr.trace.t_star
    assert t_star > t_min
    times = sorted({t_min, t_star, *np.linspace(t_min, t_star, 25).astype(int).tolist()})
    for units in times:
        pd_cost = fr.relaxed_energy(units) - fr.constant_cost
        assert pd_cost == pytest.approx(lp_relaxation(fr.problem, units), rel=1e-9, abs=1e-9)


@pytest.mark.parametrize("stages,microbatches,clocks,seed", [
    (2, 2, 3, 0), (2, 2, 3, 1), (3, 2, 2, 2), (2, 4, 2, 3), (3, 3, 2, 4), (2, 3, 3, 5), (3, 2, 3, 6),
])
def test_frontier_against_brute_force(stages, microbatches, clocks, seed):
    """Tiny DAGs, every clock assignment enumerated.

    For each PD point at quantized time T: relaxed lower bound ≤ brute-force minimum ≤ realized energy, and the
    realized energy exceeds the brute-force minimum by at most the relaxation gap (Σ over computations of the
    largest distance between a computation's discrete options and its convex hull; docs/energy.md). Where the
    relaxation is tight the point is exactly optimal. The polished Pareto points are feasible in real time and
    within the same tolerance. Ends: T* is the global minimum, T_min the all-max time.
    """
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, stages, microbatches, clocks, transfers=bool(seed % 2))
    unit = 0.001
    fr = trace_frontier(dag, unit)
    real_t, quant_t, eff = brute_force(dag, unit)
    scale = np.abs(eff).max()
    tol = 1e-9 * scale
    bound = sum(fr.costs[n.spec].max_gap(fr.stairs[n.spec]) for n in dag.nodes
                if fr.costs[n.spec] is not None and dag.is_computation(dag.nodes.index(n)))
    for p in fr.points(polish=False, pareto=False):
        if p.planned_s is None:
            continue
        units = round(p.planned_s / unit)
        best = eff[quant_t <= units].min()
        relaxed = fr.relaxed_energy(units)
        assert relaxed <= best + tol
        assert best <= p.effective_j + tol
        assert p.effective_j - best <= bound + tol
        if p.effective_j - relaxed <= tol:  # tight relaxation ⇒ exactly optimal
            assert p.effective_j == pytest.approx(best, abs=tol)
    points = fr.points()
    for p in points:
        best = eff[real_t <= p.time_s * (1 + 1e-12)].min()
        assert best - tol <= p.effective_j <= best + bound + tol
    assert points[-1].effective_j == pytest.approx(eff.min(), abs=tol)
    assert points[0].time_s == pytest.approx(real_t.min(), rel=1e-12)


def test_frontier_is_monotone_and_spans_t_star_to_t_min():
    rng = np.random.default_rng(11)
    dag = random_dag(rng, 4, 8, 6, transfers=True)
    fr = trace_frontier(dag, 0.001)
    planned = list(fr.planned())
    units = [u for u, _, _ in planned]
    assert units == list(range(fr.trace.t_star, fr.trace.t_min - 1, -1))  # one point per τ, T* → T_min
    costs = [c for _, c, _ in planned]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(costs))  # faster never cheaper
    # Ends: T* = every computation at its minimum-effective-energy option; T_min = every one at its fastest.
    table = OptionTable.of(dag)
    cheapest = np.array([int(np.argmin(np.where(np.isfinite(table.time_s[v]), table.effective_j[v], np.inf)))
                         for v in range(len(dag.nodes))])
    points = fr.points()
    times = [p.time_s for p in points]
    effs = [p.effective_j for p in points]
    assert times == sorted(times) and all(b < a for a, b in itertools.pairwise(effs))
    assert points[-1].effective_j == pytest.approx(evaluate_choice(dag, cheapest, table).effective_j)
    assert points[0].time_s == pytest.approx(evaluate_choice(dag, fastest_choice(dag), table).time_s)
    # A realized plan is at most half a unit per computation on its longest path slower than planned: each
    # option's fastest time is rounded to the nearest unit, its extra time above that rounded up (docs/energy.md).
    depth = [0] * len(dag.nodes)
    for v, ps in enumerate(dag.preds):
        depth[v] = 1 + max((depth[p] for p in ps), default=0)
    slack = 0.5 * 0.001 * max(depth)
    assert all(p.time_s <= p.planned_s + slack for p in fr.points(polish=False, pareto=False) if p.planned_s)


def test_single_option_computations_never_change_and_equal_stages_give_one_point():
    one = OpOptions((Option(1410.0, 0.01, 3.0),))
    many = OpOptions((Option(900.0, 0.015, 2.0), Option(1410.0, 0.01, 3.0)))
    dag = build_dag([{"forward": one, "backward": many}, {"forward": one, "backward": one}], 3,
                    blocking_w=[50.0, 50.0])
    fr = trace_frontier(dag, 0.001)
    for p in fr.points(polish=False, pareto=False):
        for v, node in enumerate(dag.nodes):
            if node.kind == "forward" or node.stage == 1:
                assert p.choice[v] == 0
    const = build_dag([{"forward": one, "backward": one}] * 2, 2, blocking_w=[50.0, 50.0])
    fr = trace_frontier(const, 0.001)
    assert fr.trace.t_star == fr.trace.t_min and len(fr.points()) == 1


def test_unit_time_sets_the_number_of_points():
    rng = np.random.default_rng(3)
    dag = random_dag(rng, 3, 4, 5)
    fine, coarse = trace_frontier(dag, 0.0005), trace_frontier(dag, 0.002)
    n_fine = fine.trace.t_star - fine.trace.t_min
    n_coarse = coarse.trace.t_star - coarse.trace.t_min
    assert n_coarse < n_fine / 2
    assert fine.points()[0].time_s == pytest.approx(coarse.points()[0].time_s)  # same real T_min
