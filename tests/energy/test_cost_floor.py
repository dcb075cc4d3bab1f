"""The priced objectives' branch and bound (ampe.energy.price.cost_bounds, rank_strategies(bound_prices=...)):
the floor is below every frontier point's money / CO2e and the ceiling above the best point's, on a real profile and
a bundled priced spec, and the ranking with the bound equals the ranking that screens and plans every strategy (the
brute force it replaces) in its top k, its order and their Pareto marks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.pricing import strategy_weights
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.energy import budget
from ampe.energy.inputs import job_of, replica_inputs
from ampe.energy.objective import OBJECTIVES
from ampe.energy.price import cost_bounds, point_cost, stage_effective_j
from ampe.energy.ranking import rank_strategies
from ampe.energy.strategy import FrontierCache, fastest_time_s, plan_clocks, replica_dag
from ampe.errors import InputError
from ampe.search.engine import SearchOptions, search

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def amp_priced():
    """AMP's heterogeneous cluster with its two priced sites, GPT-2 on AMP's measured layer profile."""
    cl = load_cluster(ROOT / "cluster_specs" / "amp-het-priced.yaml")
    res = search(cl, load_model("gpt2-amp"), load_profile(ROOT / "ampe/data/amp_layer_profiles.csv"),
                 SearchOptions(gbs=8, top_k=12))
    return cl, [c.estimate for c in res.ranked]


@pytest.mark.parametrize("what", ["cost", "carbon"])
def test_floor_is_below_every_frontier_point(amp_priced, what):
    cl, ests = amp_priced
    checked = 0
    for est in ests[:2]:
        w = strategy_weights(cl.pricing, est.strategy, what)
        cache = FrontierCache()
        fastest = fastest_time_s(est, cl, 1.0, cache)
        b = cost_bounds([replica_dag(i, cache) for i in replica_inputs(est, cl)], w, fastest)
        for screen in (False, True):
            se = plan_clocks(est, cl, max_time_s=1.5 * fastest, screen=screen, weights=w.per_joule)
            assert se.fastest_time_s == pytest.approx(fastest, rel=1e-12)
            # the strategy's points at every synchronous time its frontiers offer, and its cheapest one
            times = sorted({p.time_s for r in se.replicas for p in r.frontier.points if p.time_s >= se.t_prime_min_s}
                           | {se.t_prime_min_s})
            for t in times:
                sp = se.at(t)
                assert b.floor <= point_cost(se, sp, w).total * (1 + 1e-12)
                assert b.energy_floor_j <= sp.energy_j * (1 + 1e-12) and b.fastest_s <= sp.time_s * (1 + 1e-12)
                checked += 1
            best = OBJECTIVES[what].best(se, None, w)
            assert best is not None and point_cost(se, best, w).total <= b.ceiling * (1 + 1e-12)
            # every point of every replica's frontier, one term at a time: the floor's energy part is per replica
            for r, rep in enumerate(se.replicas):
                least = cost_bounds([replica_dag(rep.inputs, cache)], type(w)(0.0, (w.per_joule[r],)), 0.0).floor
                got = stage_effective_j(rep, [p.choice for p in rep.frontier.points]) @ np.asarray(w.per_joule[r])
                assert np.all(least <= got + 1e-12 * np.abs(got))
    assert checked > 20


def _row(r):
    return r.index, r.point.time_s, r.point.energy_j, r.within_bound, r.pareto


# top 1: more than 2·top_k within the bound (the screening pass runs); top 4: not (every one planned in full)
@pytest.mark.parametrize(("what", "top_k"), [("cost", 1), ("cost", 4), ("carbon", 1)])
def test_bounded_ranking_equals_planning_every_strategy(amp_priced, what, top_k):
    cl, ests = amp_priced
    x = 0.3
    got = rank_strategies(ests, cl, objective=what, max_slowdown=x, top_k=top_k)
    want = rank_strategies(ests, cl, objective=what, max_slowdown=x, top_k=top_k, bound_prices=False)
    assert want.bounded == 0 and len(want.ranked) > top_k
    assert (got.fastest_s, got.bound_s, got.screened) == (want.fastest_s, want.bound_s, want.screened)
    assert [_row(r) for r in got.ranked[:top_k]] == [_row(r) for r in want.ranked[:top_k]]
    # the strategies planned beyond the top k are fewer, each with the point and Pareto mark it has in the reference
    rows = {r.index: _row(r) for r in want.ranked}
    assert all(rows[r.index] == _row(r) for r in got.ranked)
    assert got.evaluated == len(got.ranked) <= want.evaluated and got.traced <= want.traced
    if what == "cost":  # the floor skipped work (else this compares nothing); carbon has no rent, its floor is weaker
        assert got.bounded > 0
    # the default priced path (priced_direct None) traces a strategy whose trace is estimated cheap
    # (budget.trace_is_cheap): here every one, so it is the traced ranking (the reference never solves directly: no
    # bounds), where the points solved directly can differ (docs/energy.md §10.9)
    assert all(budget.trace_is_cheap(job_of(r.index, ests[r.index], cl), None) for r in got.ranked)
    assert not any(r.direct for r in got.ranked + want.ranked)
    assert all(any(p.planned_s is not None for rep in r.energy.replicas for p in rep.frontier.points)
               for r in got.ranked if r.within_bound)  # PD's planned makespans: traced frontiers


def test_priced_direct_solves_points_only_inside_each_cost_window(amp_priced):
    """--priced-direct: no strategy within the bound gets a traced frontier (every point of it an LP's or all-max, no
    PD makespan); each one's point lies inside its cost window and between its floor and ceiling; the ranking is in
    order of money."""
    cl, ests = amp_priced
    got = rank_strategies(ests, cl, objective="cost", max_slowdown=0.3, top_k=4, priced_direct=True)
    direct = 0
    scores = []
    for r in got.ranked[:4]:
        w = strategy_weights(cl.pricing, ests[r.index].strategy, "cost")
        cache = FrontierCache()
        fastest = fastest_time_s(ests[r.index], cl, 1.0, cache)
        b = cost_bounds([replica_dag(i, cache) for i in replica_inputs(ests[r.index], cl)], w, fastest)
        score = point_cost(r.energy, r.point, w).total
        assert b.floor * (1 - 1e-12) <= score <= b.ceiling * (1 + 1e-12)
        assert r.point.time_s <= min(b.slowest_s, got.bound_s) * (1 + 1e-9) and r.within_bound
        assert all(p.planned_s is None for rep in r.energy.replicas for p in rep.frontier.points)
        direct += b.slowest_s < got.bound_s  # a window ending inside the bound (the bound cuts the others)
        scores.append(score)
    assert direct > 0 and scores == sorted(scores)
    assert all(r.direct == r.within_bound for r in got.ranked)  # recorded, for the plan's predicted.cost.direct


def test_the_work_bound_counts_a_direct_strategy_by_its_lps(amp_priced):
    """The work estimate counts each strategy on its own path: with every point solved directly there is no frontier
    to trace, so a frontier bound of one node-step changes nothing (τ as given, nothing refused), while the traced
    path over the same strategies is refused by that bound."""
    cl, ests = amp_priced
    top_k = len(ests)  # no screening pass: nothing is traced on the direct path
    got = rank_strategies(ests, cl, objective="cost", max_slowdown=0.3, top_k=top_k, priced_direct=True,
                          frontier_bound=1.0)
    assert got.coarsening == 1.0 and got.note is None
    assert got.ranked and all(r.direct for r in got.ranked if r.within_bound)
    with pytest.raises(InputError, match="coarser unit time"):
        rank_strategies(ests, cl, objective="cost", max_slowdown=0.3, top_k=top_k, priced_direct=False,
                        frontier_bound=1.0)
