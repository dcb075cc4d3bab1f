"""Money and CO2e of strategy points (ampe.energy.price): totals by hand, the cheapest point of a frontier against
brute force (over the frontier's points, and over every clock assignment of tiny DAGs), and the cost / carbon
objectives of rank_strategies."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from energy_support import brute_force, random_dag

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pricing import J_PER_KWH, Weights, strategy_weights
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.bloat import PipelineFrontier
from ampe.energy.inputs import replica_inputs
from ampe.energy.objective import OBJECTIVES
from ampe.energy.price import cost_bounds, point_cost
from ampe.energy.ranking import rank_strategies
from ampe.energy.strategy import (
    FrontierCache,
    ReplicaPipeline,
    StrategyEnergy,
    plan_clocks,
    replica_dag,
    window_deadlines,
)
from ampe.errors import InputError
from ampe.search.engine import SearchOptions, search
from ampe.tradeoff.evaluate import OptionTable, evaluate_batch, evaluate_choice, fastest_choice
from ampe.tradeoff.frontier import pareto_filter, trace_frontier
from ampe.units import money

A100, V100 = 2.0, 1.5  # price per GPU-hour


def _cluster(v_site: dict | None = None, top: dict | None = None):
    """Two A100s at one site, two V100s at another (or the same: ``v_site`` None)."""
    v = {"electricity_per_kwh": 0.3, "carbon_g_per_kwh": 600, "pue": 1.5} if v_site is None else v_site
    return cluster_from_dict({"name": "priced", **(top or {"electricity_per_kwh": 0.1, "carbon_g_per_kwh": 50}),
                              "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100, "price_per_hour": A100,
         "pue": 1.2},
        {"name": "v", "gpu": "V100-32GB", "count": 2, "intra_gbps": 300, "inter_gbps": 100, "price_per_hour": V100,
         **v}]}, "priced.yaml")


@pytest.fixture(scope="module")
def het():
    """pp 2, dp 2: replica 0 on A100 (stage 0) + V100 (stage 1), replica 1 the other way round: every pipeline spans
    both sites."""
    cl = _cluster()
    est = CostModel(cl, load_model("gpt2")).estimate(Strategy(2, 2, 1, 2, 16, placement=(0, 1, 2, 3)))
    return cl, est


def _stage_energy_by_hand(se, sp):
    """Per replica and device stage: joules of one iteration (options' energy + blocking power while not computing,
    until the iteration ends), spelled out from the DAGs."""
    out = []
    for rep, point in zip(se.replicas, sp.points, strict=True):
        dag = rep.dag
        row = []
        for s, order in enumerate(dag.stage_order):
            busy = energy = 0.0
            for v in order:
                if not dag.is_computation(v):
                    continue
                opt = dag.options(v).options[int(point.choice[v])]
                energy += opt.energy_j
                busy += opt.time_s
            row.append(energy + dag.blocking_w[s] * (sp.time_s - busy))
        out.append(row)
    return out


def test_cost_and_carbon_totals_by_hand(het):
    cl, est = het
    s = est.strategy
    se = plan_clocks(est, cl)
    sp = se.fastest()
    per_stage = _stage_energy_by_hand(se, sp)
    assert sum(map(sum, per_stage)) == pytest.approx(sp.energy_j, rel=1e-9)
    site = {0: (0.1, 50, 1.2), 1: (0.1, 50, 1.2), 2: (0.3, 600, 1.5), 3: (0.3, 600, 1.5)}  # device → its site
    usd = sp.time_s / 3600 * (2 * A100 + 2 * V100)
    grams = 0.0
    for r in range(s.dp):
        for st in range(s.pp):
            kwh, g, pue = site[s.device(st, r, 0)]
            usd += per_stage[r][st] / J_PER_KWH * pue * kwh
            grams += per_stage[r][st] / J_PER_KWH * pue * g
    c = point_cost(se, sp, strategy_weights(cl.pricing, s, "cost"))
    assert c.time_part == pytest.approx(sp.time_s / 3600 * 7.0, rel=1e-12)
    assert c.total == pytest.approx(usd, rel=1e-9)
    g = point_cost(se, sp, strategy_weights(cl.pricing, s, "carbon"))
    assert g.time_part == 0 and g.total == pytest.approx(grams, rel=1e-9)


def _brute_over_points(se, w: Weights, max_time_s=None):
    """Every combination of one frontier point per replica: T' = the slowest of them (at least the fastest
    synchronous time), each point priced stage by stage from the DAG's options."""
    best = None
    post, lo = se.post_s, se.t_prime_min_s
    for combo in itertools.product(*[r.frontier.points for r in se.replicas]):
        t = max([lo] + [p.time_s for p in combo])
        if max_time_s is not None and t + post > max_time_s * (1 + 1e-9):
            continue
        cost = w.per_second * (t + post)
        for r, (rep, p) in enumerate(zip(se.replicas, combo, strict=True)):
            dag = rep.dag
            for s, order in enumerate(dag.stage_order):
                busy = energy = 0.0
                for v in order:
                    if dag.is_computation(v):
                        opt = dag.options(v).options[int(p.choice[v])]
                        energy += opt.energy_j
                        busy += opt.time_s
                cost += w.per_joule[r][s] * (energy + dag.blocking_w[s] * (t + post - busy))
        if best is None or cost < best[0]:
            best = (cost, t)
    return best


@pytest.mark.parametrize("what", ["cost", "carbon", "kwh"])
@pytest.mark.parametrize("rent", [1.0, 0.0, 300.0])
def test_cheapest_point_equals_brute_force_over_the_frontier_points(rent, what):
    """Small frontiers (coarse τ) so that every combination of replica points can be enumerated; rent scales the
    price per GPU-hour (0: energy alone; 300: time dominates, the T_min point wins)."""
    cl = _cluster()
    est = CostModel(cl, load_model("gpt2-tiny")).estimate(Strategy(2, 2, 1, 1, 4, placement=(0, 2, 3, 1)))
    bound = 1.3 * plan_clocks(est, cl).fastest_time_s
    w0 = strategy_weights(cl.pricing, est.strategy, what)
    w = Weights(w0.per_second * rent, w0.per_joule)
    assert w.uniform(0) is None or what == "kwh"  # each pipeline spans the two sites: per-stage weights differ
    # frontiers traced on the priced joules, as rank_strategies does
    se = plan_clocks(est, cl, max_time_s=bound, unit_s=est.iteration_s / 60, weights=w.per_joule)
    assert all(2 <= len(r.frontier.points) <= 80 for r in se.replicas)
    for limit in (None, bound):
        sp = OBJECTIVES["cost"].best(se, limit, w)
        want, _ = _brute_over_points(se, w, limit)
        assert point_cost(se, sp, w).total == pytest.approx(want, rel=1e-9)
        if limit is not None:
            assert sp.time_s <= limit * (1 + 1e-9)
    # time priced heavily: nothing beats the fastest synchronous time
    if rent == 300.0 and what == "cost":
        assert OBJECTIVES["cost"].best(se, None, w).t_prime_s == pytest.approx(se.t_prime_min_s)


def test_cheapest_point_with_one_site_agrees_with_the_energy_objective(het):
    """Energy priced alike everywhere and no rent: the cheapest point is the least-energy point (same T')."""
    cl, est = het
    one = _cluster(v_site={"pue": 1.2}, top={"electricity_per_kwh": 0.2})  # node a has PUE 1.2 too
    se = plan_clocks(est, cl, max_time_s=1.1 * est.iteration_s)
    w = strategy_weights(one.pricing, est.strategy, "cost")
    w = Weights(0.0, w.per_joule)
    assert w.uniform(0) is not None and w.uniform(1) is not None
    sp = OBJECTIVES["cost"].best(se, 1.1 * est.iteration_s, w)
    ref = OBJECTIVES["energy"].best(se, 1.1 * est.iteration_s)
    assert sp.energy_j == pytest.approx(ref.energy_j, rel=1e-12) and sp.t_prime_s == pytest.approx(ref.t_prime_s)


def _strategy_of_dag(dag, unit_s: float) -> StrategyEnergy:
    """One replica whose frontier is the traced frontier of ``dag`` (no tail)."""
    fr = trace_frontier(dag, unit_s)
    points = sorted(fr.points(), key=lambda p: (p.time_s, p.effective_j))
    choice = fastest_choice(dag)
    rep = ReplicaPipeline(None, dag, PipelineFrontier(tuple(pareto_filter(points)), sum(dag.blocking_w),  # type: ignore[arg-type]
                                                      evaluate_choice(dag, choice)), choice)
    return StrategyEnergy((rep,), 0.0, 1.0, "perseus", unit_s, "test")


@pytest.mark.parametrize("stages,microbatches,clocks,seed", [
    (2, 2, 3, 0), (2, 2, 3, 1), (3, 2, 2, 2), (2, 4, 2, 3), (3, 3, 2, 4), (2, 3, 3, 5),
])
def test_cheapest_point_against_every_clock_assignment(stages, microbatches, clocks, seed):
    """Tiny DAGs, one site: a·T + w·E over every clock assignment. The cheapest frontier point is never below that
    minimum and exceeds it by at most w × the relaxation gap (the frontier's own accuracy, as
    test_energy_pd_oracle.py bounds it); where the gap is zero it is the minimum itself."""
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, stages, microbatches, clocks, transfers=bool(seed % 2))
    unit = 0.001
    se = _strategy_of_dag(dag, unit)
    real_t, _, eff = brute_force(dag, unit)
    fr = trace_frontier(dag, unit)
    gap = sum(fr.costs[n.spec].max_gap(fr.stairs[n.spec]) for v, n in enumerate(dag.nodes)
              if fr.costs[n.spec] is not None and dag.is_computation(v))
    block = sum(dag.blocking_w)
    for a, wj in ((0.0, 1.0), (50.0, 1.0), (300.0, 0.5), (3000.0, 2.0)):
        w = Weights(a, ((wj,) * stages,))
        got = point_cost(se, OBJECTIVES["cost"].best(se, None, w), w).total
        want = float((a * real_t + wj * (eff + block * real_t)).min())
        tol = 1e-9 * want
        assert want - tol <= got <= want + wj * gap + tol
        if gap == 0:
            assert got == pytest.approx(want, rel=1e-9)


@pytest.fixture(scope="module")
def tiny_priced():
    cl = cluster_from_dict({"name": "cpu-priced", "currency": "EUR", "electricity_per_kwh": 0.25,
                            "carbon_g_per_kwh": 400, "pue": 1.3, "nodes": [
        {"name": "local", "gpu": "cpu", "count": 2, "intra_gbps": 40, "inter_gbps": 40, "price_per_hour": 0.05}]},
        "cpu-priced.yaml")
    res = search(cl, load_model("gpt2-tiny"), None, SearchOptions(gbs=8))
    return cl, [c.estimate for c in res.ranked]


@pytest.mark.parametrize("objective", ["cost", "carbon"])
def test_objective_ranks_by_money_or_co2e_against_brute_force(tiny_priced, objective):
    cl, ests = tiny_priced
    x = 0.08
    ranking = rank_strategies(ests, cl, objective=objective, max_slowdown=x, top_k=len(ests))
    bound = (1 + x) * ranking.fastest_s
    best = None
    for e in ests:
        w = strategy_weights(cl.pricing, e.strategy, objective)
        se = plan_clocks(e, cl, max_time_s=bound)
        times = sorted({p.time_s for r in se.replicas for p in r.frontier.points} | {se.t_prime_min_s})
        for t in times:
            sp = se.at(t)
            if sp.time_s <= bound * (1 + 1e-9):
                score = point_cost(se, sp, w).total
                best = score if best is None else min(best, score)
    inside = [r for r in ranking.ranked if r.within_bound]
    scores = [point_cost(r.energy, r.point, strategy_weights(cl.pricing, ests[r.index].strategy, objective)).total
              for r in inside]
    assert scores[0] == pytest.approx(best, rel=1e-9) and scores == sorted(scores)


def test_rank_strategies_refuses_a_spec_without_the_figures(tiny_priced):
    _, ests = tiny_priced
    plain = cluster_from_dict({"name": "cpu", "nodes": [
        {"name": "local", "gpu": "cpu", "count": 2, "intra_gbps": 40, "inter_gbps": 40}]}, "cpu.yaml")
    with pytest.raises(InputError) as e:
        rank_strategies(ests, plain, objective="cost")
    assert e.value.source == "cpu.yaml" and e.value.field == "price_per_hour"
    no_carbon = cluster_from_dict({"name": "cpu", "electricity_per_kwh": 0.2, "nodes": [
        {"name": "local", "gpu": "cpu", "count": 2, "intra_gbps": 40, "inter_gbps": 40, "price_per_hour": 1}]},
        "cpu.yaml")
    with pytest.raises(InputError) as e:
        rank_strategies(ests, no_carbon, objective="carbon")
    assert e.value.field == "nodes[0].carbon_g_per_kwh"
    assert rank_strategies(ests, no_carbon, objective="cost", top_k=2).ranked  # the cost figures are all there


@pytest.mark.parametrize("what,rent", [("cost", 0.0), ("cost", 0.02), ("cost", 1.0), ("carbon", 0.0)])
def test_two_sites_in_one_pipeline_priced_frontier_against_every_clock_assignment(what, rent):
    """pp 2 across two sites (electricity 0.05 against 0.6 per kWh), a GPU type with 4 clocks and 2 micro-batches:
    all 4⁸ clock assignments enumerated. The frontier traced on priced joules gives the brute-force minimum of
    rent · T + Σ_s price_s · E_s; the plain time–energy frontier's cheapest point is no better, and worse where
    energy matters (no or little rent)."""
    cl = cluster_from_dict({"name": "two-sites", "gpu_types": {"G4": {
        "base": "A100-80GB", "sm_clock_min_mhz": 810, "sm_clock_max_mhz": 1410, "sm_clock_step_mhz": 200}},
        "nodes": [{"name": "a", "gpu": "G4", "count": 1, "intra_gbps": 100, "inter_gbps": 100, "price_per_hour": 2,
                   "electricity_per_kwh": 0.05, "carbon_g_per_kwh": 20},
                  {"name": "b", "gpu": "G4", "count": 1, "intra_gbps": 100, "inter_gbps": 100, "price_per_hour": 2,
                   "electricity_per_kwh": 0.6, "carbon_g_per_kwh": 700}]}, "two-sites.yaml")
    est = CostModel(cl, load_model("gpt2-tiny")).estimate(Strategy(2, 1, 1, 1, 2, placement=(0, 1)))
    w0 = strategy_weights(cl.pricing, est.strategy, what)
    w = Weights(w0.per_second * rent, w0.per_joule)
    unit = est.iteration_s / 2000
    priced = plan_clocks(est, cl, max_time_s=10, unit_s=unit, weights=w.per_joule)
    plain = plan_clocks(est, cl, max_time_s=10, unit_s=unit)
    got = point_cost(priced, OBJECTIVES["cost"].best(priced, None, w), w).total
    got_plain = point_cost(plain, OBJECTIVES["cost"].best(plain, None, w), w).total
    dag = priced.replicas[0].dag
    table = OptionTable.of(dag)
    choices = np.array(list(itertools.product(*[range(int(k)) for k in table.num_options])))
    assert len(choices) == 4 ** 8
    t, _, _ = evaluate_batch(dag, table, choices)
    eff = table.effective_j[np.arange(len(dag.nodes)), choices]
    per_stage = np.stack([eff[:, dag.node_stage == s].sum(axis=1) for s in range(dag.num_stages)], axis=1)
    total = np.maximum(t, priced.t_prime_min_s) + priced.post_s
    wj = np.asarray(w.per_joule[0])
    want = float((w.per_second * total + per_stage @ wj + float(np.dot(dag.blocking_w, wj)) * total).min())
    assert got == pytest.approx(want, rel=1e-9)
    assert got_plain >= want * (1 - 1e-9)
    if rent == 0.0:
        assert got_plain > want * 1.001  # the plain frontier misses the priced optimum by more than 0.1 %
    # the cost window (CostBounds.slowest_s) against every assignment: each costs at least the floor plus
    # per_second per second beyond the fastest time, so none slower than the window's end beats the ceiling
    cache = FrontierCache()
    b = cost_bounds([replica_dag(i, cache) for i in replica_inputs(est, cl)], w, priced.fastest_time_s)
    every = w.per_second * total + per_stage @ wj + float(np.dot(dag.blocking_w, wj)) * total
    assert np.all(b.floor + b.per_second * (total - b.fastest_s) <= every * (1 + 1e-12))
    assert np.all(every[total > b.slowest_s * (1 + 1e-12)] > b.ceiling) and b.ceiling >= want
    assert total[np.argmin(every)] <= b.slowest_s < 10  # blocking power is paid per second too, rent or none
    # points solved directly inside the window (ClockRequest.traced False: T' and the window's midpoint): never below
    # the minimum, never dearer than the all-max point at T_min (the ceiling); the minimum itself where rent
    # dominates, 2.2 % (rent 0.02) and 7.6 % (none; carbon 9.1 %) above it where energy matters and the trace finds it
    direct = plan_clocks(est, cl, max_time_s=min(10, b.slowest_s), unit_s=unit, weights=w.per_joule, traced=False)
    got_direct = point_cost(direct, OBJECTIVES["cost"].best(direct, None, w), w).total
    assert want * (1 - 1e-9) <= got_direct <= b.ceiling * (1 + 1e-12)
    if rent == 1.0:
        assert got_direct == pytest.approx(want, rel=1e-9)


def test_direct_points_add_the_bounds_end_only_where_the_bound_cuts_the_window():
    """The direct path's deadlines (pipeline s): the midpoint up to the window's or the bound's end, the earlier, and
    that end itself when it is the bound's (a point there can beat the all-max one; at the window's end none can)."""
    assert window_deadlines(1.0, 1.2, 1.5) == pytest.approx((1.1, 1.2))  # the bound at 1.2 cuts a window to 1.5
    assert window_deadlines(1.0, 1.2, 1.2) == pytest.approx((1.1,))  # the window ends first: its end is no candidate
    assert window_deadlines(1.0, 1.2) == pytest.approx((1.1, 1.2))  # window unknown: taken as unbounded
    assert window_deadlines(1.0, 1.0, 2.0) == () and window_deadlines(1.0, float("inf")) == ()


def test_interleaved_pipeline_across_sites_priced_per_device_stage():
    """Interleaved 1F1B (two chunks per device): each chunk is priced at its device's site; the cheapest point still
    equals brute force over the frontiers' points."""
    cl = _cluster()
    s = Strategy(2, 2, 1, 1, 4, placement=(0, 2, 3, 1), schedule="interleaved", virtual_stages=2)
    est = CostModel(cl, load_model("gpt2-tiny")).estimate(s)
    assert len(est.fwd_s[0]) == 4  # virtual stages
    w = strategy_weights(cl.pricing, est.strategy, "carbon")
    assert len(w.per_joule[0]) == 2 and w.uniform(0) is None  # per device stage
    bound = 1.3 * plan_clocks(est, cl).fastest_time_s
    se = plan_clocks(est, cl, max_time_s=bound, unit_s=est.iteration_s / 40, weights=w.per_joule)
    sp = OBJECTIVES["cost"].best(se, bound, w)
    want, _ = _brute_over_points(se, w, bound)
    assert point_cost(se, sp, w).total == pytest.approx(want, rel=1e-9)


@pytest.fixture(scope="module")
def dear_v100():
    """Two cheap A100s and two V100s at 20× their price: leaving the V100s out is cheaper per token."""
    return cluster_from_dict({"name": "dear-v100", "electricity_per_kwh": 0.1, "carbon_g_per_kwh": 100, "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100, "price_per_hour": 2.0},
        {"name": "v", "gpu": "V100-32GB", "count": 2, "intra_gbps": 300, "inter_gbps": 100,
         "price_per_hour": 40.0}]}, "dear.yaml")


def _plan(cl, devices, x=None, objective="cost"):
    from ampe.planning import PlanRequest, make_plan

    return make_plan(cl, load_model("gpt2-tiny"), None, PlanRequest(search=SearchOptions(gbs=8, top_k=3),
                                                                    objective=objective, max_slowdown=x,
                                                                    devices=devices))


def test_leaving_out_an_expensive_group_is_said_with_both_figures(dear_v100):
    made = _plan(dear_v100, "auto", 0.05)
    figures = [(len(set(e.placement)), e.predicted.cost.per_iteration) for e in made.plan.strategies]
    part = min(m for n, m in figures if n == 2)
    full = min(m for n, m in figures if n == 4)
    assert part < full and figures[0][0] == 2  # the A100s alone rank first
    from ampe.cli._cost import finding_line
    from ampe.planning import CheaperWithout, DevicesAutoHint

    (found,) = made.findings  # data: the group, both strategies and their figures
    assert isinstance(found, CheaperWithout) and found.left_out == "2×V100-32GB" and found.best.rank == 1
    assert found.reference is not None
    assert (found.best.per_iteration, found.reference.per_iteration) == pytest.approx((part, full), rel=1e-12)
    note = finding_line(found)  # the sentence the CLI prints
    assert note.startswith("leaving out 2×V100-32GB is cheaper per token: rank 1")
    assert f"{money(part)} units/iteration" in note and f"{money(full)} units/iteration" in note
    assert f"{100 * (1 - part / full):.1f} % less" in note
    # a wide bound: the cheap strategies all leave the V100s out, and it says that too
    (wide,) = _plan(dear_v100, "auto", 3.0).findings
    assert isinstance(wide, CheaperWithout) and wide.reference is None
    assert "leaving out 2×V100-32GB is cheaper" in finding_line(wide)
    assert "no strategy on every device" in finding_line(wide)
    # every device: the hint to try auto
    (hint,) = _plan(dear_v100, "all").findings
    assert isinstance(hint, DevicesAutoHint) and finding_line(hint).startswith("--devices auto also prices")



def test_plan_of_given_strategies_carries_their_cost(het):
    """plan_for_estimates (what ``ampe replan`` writes) prices each strategy at its no-slowdown point too."""
    from ampe.formats.plan import PlanInputs, SearchStats
    from ampe.planning import plan_for_estimates

    cl, est = het
    plan = plan_for_estimates(cl, load_model("gpt2"), [est], 16, SearchStats(candidates=1, pruned_oom=0, seconds=0.0),
                              PlanInputs(), energy_planner="perseus")
    c = plan.strategies[0].predicted.cost
    se = plan_clocks(est, cl)
    want = point_cost(se, se.fastest(), strategy_weights(cl.pricing, est.strategy, "cost")).total
    # the T' point solved directly (the time objective) and read off the traced frontier: one LP optimum, up to the
    # solver's tolerance (1.4e-6 apart once eager attention's mask fill was priced as ATen runs it)
    assert c is not None and c.per_iteration == pytest.approx(want, rel=1e-5)
