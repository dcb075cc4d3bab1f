"""Extrinsic bloat (T_opt = min(T*, T')), Eq. 3/4 accounting, and the EnvPipe / global-clock baselines."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.energy.baselines import envpipe, global_clock
from ampe.energy.bloat import PipelineFrontier, plan_replicas
from ampe.energy.inputs import PipelineInputs, dag_from_inputs
from ampe.tradeoff.evaluate import evaluate_choice, fastest_choice
from ampe.tradeoff.frontier import trace_frontier


def _pipeline(gpu: str, fwd: tuple[float, ...], microbatches: int = 6):
    inp = PipelineInputs(fwd, tuple(2 * x for x in fwd), (CATALOG[gpu],) * len(fwd), microbatches,
                         p2p_forward_s=(0.0005,) * (len(fwd) - 1))
    dag = dag_from_inputs(inp)
    fr = trace_frontier(dag, 0.001)
    pts = fr.points()
    return dag, fr, PipelineFrontier(tuple(pts), fr.table.total_blocking_w, evaluate_choice(dag, fastest_choice(dag)))


def test_energy_accounting_eq3_equals_eq4_plus_blocking():
    dag, fr, pf = _pipeline("A100-80GB", (0.02, 0.025, 0.03))
    for p in pf.points:
        assert p.energy_j == pytest.approx(p.effective_j + fr.table.total_blocking_w * p.time_s)
        # Eq. 3 spelled out: computation energy + blocking power while each stage is not computing
        e = sum(dag.options(v).options[p.choice[v]].energy_j for v in range(len(dag.nodes)) if dag.is_computation(v))
        per_stage_busy = [sum(dag.options(v).options[p.choice[v]].time_s for v in order) for order in dag.stage_order]
        e += sum(w * (p.time_s - b) for w, b in zip(dag.blocking_w, per_stage_busy, strict=False))
        assert p.energy_j == pytest.approx(e)


def test_t_opt_rule_for_one_pipeline():
    _, _, pf = _pipeline("A40", (0.02, 0.03, 0.025, 0.035))
    t_min, t_star = pf.t_min_s, pf.t_star_s
    assert plan_replicas([pf], 1.0).points[0].time_s == t_min  # no straggler: T_min
    mid = plan_replicas([pf], 1.05)
    assert t_min < mid.points[0].time_s <= mid.t_prime_s
    assert all(p.time_s > mid.t_prime_s or p.effective_j >= mid.points[0].effective_j for p in pf.points)
    late = plan_replicas([pf], 3.0)
    assert late.t_prime_s > t_star and late.points[0].time_s == t_star  # never slower than T*
    with pytest.raises(ValueError):
        plan_replicas([pf], 0.9)


def test_heterogeneous_replicas_slow_the_fast_one_to_the_slow_ones_time():
    _, _, fast = _pipeline("A100-80GB", (0.02, 0.02, 0.024))
    _, _, slow = _pipeline("V100-32GB", (0.035, 0.035, 0.04))
    plan = plan_replicas([fast, slow])
    assert plan.t_prime_s == pytest.approx(slow.t_min_s)
    assert plan.points[1].time_s == slow.t_min_s
    assert fast.t_min_s < plan.points[0].time_s <= min(fast.t_star_s, plan.t_prime_s)
    alone = fast.energy_j(fast.point_at(fast.t_min_s).effective_j, plan.t_prime_s)
    assert fast.energy_j(plan.points[0].effective_j, plan.t_prime_s) < alone  # extrinsic bloat removed
    assert 0 < plan.savings < 1


def test_savings_rise_until_t_star_then_fall_with_straggler_factor():
    """Perseus Table 4 trend. Joules saved grow with T' until T' = T*, then stay constant (Perseus never runs
    slower than T*), while the all-max baseline keeps growing with its waiting time, so the percentage rises, peaks
    no later than T* (where the frontier's slope meets the baseline's growth) and falls after T*."""
    _, _, pf = _pipeline("A40", (0.02, 0.025, 0.022, 0.03))
    peak_k = pf.t_star_s / pf.t_min_s
    ks = np.linspace(1.0, 2 * peak_k - 1.0, 41)
    plans = [plan_replicas([pf], k) for k in ks]
    saved = [p.all_max_energy_j - p.energy_j for p in plans]
    pct = [p.savings for p in plans]
    before = ks <= peak_k
    assert all(b >= a - 1e-9 for a, b in zip(np.array(saved)[before], np.array(saved)[before][1:], strict=False))
    assert np.allclose(np.array(saved)[~before], saved[-1])
    i = int(np.argmax(pct))
    assert 1.0 < ks[i] <= peak_k + 1e-9 and pct[i] > pct[0]
    assert all(b >= a - 1e-9 for a, b in itertools.pairwise(pct[: i + 1]))
    assert all(b < a for a, b in zip(pct[i:], pct[i + 1:], strict=False))


def test_envpipe_baseline_keeps_time_and_perseus_dominates_it():
    dag, _fr, pf = _pipeline("A100-80GB", (0.02, 0.021, 0.02, 0.027), microbatches=8)
    base = evaluate_choice(dag, fastest_choice(dag))
    for eps in (0.0, 0.05):
        ep = envpipe(dag, epsilon=eps)
        assert ep.evaluation.time_s <= base.time_s * (1 + eps) + 1e-12
        assert ep.evaluation.energy_j < base.energy_j
        mine = pf.point_at(ep.evaluation.time_s)
        assert mine.effective_j <= ep.evaluation.effective_j + 1e-9


def test_global_clock_baseline_is_dominated_by_the_frontier():
    dag, _fr, pf = _pipeline("A40", (0.02, 0.03, 0.025), microbatches=4)
    points = global_clock(dag)
    assert len(points) == len(CATALOG["A40"].sm_clocks_mhz())
    assert points[-1].evaluation.time_s == pytest.approx(pf.t_min_s)
    for g in points:
        if g.evaluation.time_s <= pf.t_star_s:
            # Within the hull relaxation's gap (docs/energy.md §4): the fitted A40 curve (300 W cap, voltage knee)
            # is not convex in (time, energy), so a global clock off the hull can beat a realized point slightly;
            # 0.5 % is issue 13's tolerance against Perseus's own frontiers (measured here: 0.34 %).
            assert pf.point_at(g.evaluation.time_s).effective_j <= g.evaluation.effective_j * 1.005
