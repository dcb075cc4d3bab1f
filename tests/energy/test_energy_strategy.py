"""Per-strategy energy (ampe.energy.strategy): whole-cluster accounting, extrinsic bloat across replicas, objective
selection within a slowdown bound against brute force, Pareto marks, frequency plans in schedule order."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy import dvfs
from ampe.energy.objective import OBJECTIVES, objective_named
from ampe.energy.ranking import EnergyRanking, pareto_mask, rank_strategies
from ampe.energy.strategy import frequency_plan_of, is_all_max, plan_clocks
from ampe.errors import InputError
from ampe.search.engine import SearchOptions, search
from tests.energy.energy_support import het_strategy
from tests.support.schedules import one_f_one_b

SPECS = __import__("pathlib").Path(__file__).resolve().parents[2] / "cluster_specs"


@pytest.fixture(scope="module")
def het():
    return het_strategy()


@pytest.fixture(scope="module")
def tiny():
    cl = load_cluster(SPECS / "local-cpu.yaml")
    res = search(cl, load_model("gpt2-tiny"), None, SearchOptions(gbs=8))
    return cl, [c.estimate for c in res.ranked]


def _energy_by_hand(se, sp) -> float:
    """Eq. 3 over every replica and device, spelled out from the DAGs' options, plus the post-pipeline phase."""
    total = 0.0
    for rep, point in zip(se.replicas, sp.points, strict=False):
        dag = rep.dag
        for s, order in enumerate(dag.stage_order):
            busy = 0.0
            for v in order:
                opt = dag.options(v).options[int(point.choice[v])]
                total += opt.energy_j
                busy += opt.time_s
            total += dag.blocking_w[s] * (sp.t_prime_s - busy)
    return total + se.blocking_w * se.post_s


def test_accounting_covers_every_device_and_the_tail(het):
    cl, est = het
    se = plan_clocks(est, cl)
    sp = se.fastest()
    assert sp.energy_j == pytest.approx(_energy_by_hand(se, sp), rel=1e-9)
    # every device of the strategy waits during the tail: 4 GPUs' blocking power
    assert se.blocking_w == pytest.approx(2 * 83.64 + 2 * 60.0)  # Perseus's measured A100 P2P power; V100 assumed
    # no slowdown at the T_min point: the iteration time is the cost model's
    assert sp.time_s == pytest.approx(max(est.iteration_s, se.t_min_s))
    assert se.post_s == pytest.approx(est.iteration_s - se.t_min_s) and se.post_s >= max(est.tail_s) * 0.5
    assert 0 < sp.energy_j < sp.energy_max_clock_j and sp.average_power_w == pytest.approx(sp.energy_j / sp.time_s)


def test_heterogeneous_replicas_get_their_own_plans(het):
    cl, est = het
    se = plan_clocks(est, cl)
    sp = se.fastest()
    fast, slow = sp.points
    assert se.replicas[0].frontier is not se.replicas[1].frontier
    assert slow.time_s == pytest.approx(se.t_min_s)  # the V100 replica sets T'
    assert fast.time_s < slow.time_s and fast.time_s <= se.replicas[0].frontier.t_star_s + 1e-12  # extrinsic bloat
    fp = frequency_plan_of(se, sp).to_json()
    assert len(fp["replicas"]) == 2 and fp["stages"] == fp["replicas"][0]["stages"]
    assert fp["replicas"][0]["stages"] != fp["replicas"][1]["stages"]
    a100 = {f for st in fp["replicas"][0]["stages"] for _, _, f in st}
    assert max(a100) <= 1410 and min(a100) >= 210  # A100 clocks for the A100 replica
    v100 = {f for st in fp["replicas"][1]["stages"] for _, _, f in st}
    assert max(v100) > 1410  # V100 clocks reach 1530 MHz


def test_replicas_that_share_a_plan_are_written_once():
    """pp 2, dp 3: replicas 0 and 2 on A100 pairs, replica 1 on V100s: two distinct plans, three replicas."""
    cl = cluster_from_dict({"name": "het3", "nodes": [
        {"name": "a", "gpu": "A100-80GB", "count": 2, "intra_gbps": 2400, "inter_gbps": 100, "repeat": 2},
        {"name": "v", "gpu": "V100-32GB", "count": 2, "intra_gbps": 300, "inter_gbps": 100}]})
    # rank j·dp + r: stage 0 on devices 0 / 4 / 2, stage 1 on 1 / 5 / 3
    est = CostModel(cl, load_model("gpt2")).estimate(Strategy(2, 3, 1, 2, 24, placement=(0, 4, 2, 1, 5, 3)))
    se = plan_clocks(est, cl)
    sp = se.fastest()
    fp = frequency_plan_of(se, sp).to_json()
    assert fp["replica_plan"] == [0, 1, 0] and len(fp["replicas"]) == 2
    assert fp["replicas"][0]["stages"] != fp["replicas"][1]["stages"] and fp["stages"] == fp["replicas"][0]["stages"]
    for r, (rep, point) in enumerate(zip(se.replicas, sp.points, strict=True)):  # each replica's own lists
        assert fp["replicas"][fp["replica_plan"][r]]["pipeline_time_s"] == point.time_s
        clocks = {f for st in fp["replicas"][fp["replica_plan"][r]]["stages"] for _, _, f in st}
        assert (max(clocks) > 1410) == (rep.inputs.gpus[0].name == "V100-32GB")


def test_straggler_slows_every_replica_and_costs_blocking_energy(het):
    cl, est = het
    se1 = plan_clocks(est, cl)
    se2 = plan_clocks(est, cl, straggler=1.2)
    p1, p2 = se1.fastest(), se2.fastest()
    assert p2.t_prime_s == pytest.approx(1.2 * se1.t_min_s) and p2.time_s == pytest.approx(p2.t_prime_s + se2.post_s)
    assert p2.points[1].time_s > p1.points[1].time_s  # the straggler lets the V100 replica slow down too
    assert p2.energy_max_clock_j > p1.energy_max_clock_j  # waiting longer at max clocks costs blocking energy
    assert p2.savings_pct > p1.savings_pct


@pytest.mark.parametrize("objective", ["energy", "edp"])
def test_objective_picks_the_best_point_within_the_bound_against_brute_force(tiny, objective):
    cl, ests = tiny
    x = 0.08
    ranking = rank_strategies(ests, cl, objective=objective, max_slowdown=x, top_k=len(ests))
    fastest = min(plan_clocks(e, cl).fastest_time_s for e in ests)
    assert ranking.fastest_s == pytest.approx(fastest)
    bound = (1 + x) * fastest
    # brute force: every strategy, every synchronous time T' at any replica's frontier point
    best = None
    for i, e in enumerate(ests):
        se = plan_clocks(e, cl, max_time_s=bound)
        times = sorted({p.time_s for r in se.replicas for p in r.frontier.points} | {se.t_prime_min_s})
        for t in times:
            sp = se.at(t)
            if sp.time_s <= bound * (1 + 1e-9):
                score = sp.energy_j if objective == "energy" else sp.energy_j * sp.time_s
                if best is None or score < best[0] - 1e-12:
                    best = (score, i, sp.time_s)
    top = ranking.ranked[0]
    got = top.point.energy_j if objective == "energy" else top.point.edp
    assert got == pytest.approx(best[0], rel=1e-9) and top.point.time_s <= bound * (1 + 1e-9)
    assert top.within_bound and top.point.time_s > fastest  # it uses the allowed slowdown
    scores = [r.point.energy_j if objective == "energy" else r.point.edp for r in ranking.ranked if r.within_bound]
    assert scores == sorted(scores)
    assert all(r.point.time_s <= bound * (1 + 1e-9) for r in ranking.ranked if r.within_bound)
    outside = [r for r in ranking.ranked if not r.within_bound]
    assert outside and all(r.point.time_s > bound for r in outside)
    assert [r.within_bound for r in ranking.ranked] == sorted((r.within_bound for r in ranking.ranked), reverse=True)


def test_zero_slowdown_keeps_the_fastest_strategy_at_t_min(tiny):
    cl, ests = tiny
    ranking = rank_strategies(ests, cl, objective="energy", max_slowdown=0.0, top_k=3)
    top = ranking.ranked[0]
    assert top.point.time_s == pytest.approx(ranking.fastest_s)
    timed = rank_strategies(ests, cl, objective="time", top_k=3)
    assert [r.index for r in timed.ranked] == [0, 1, 2]  # the cost model's order
    assert all(r.point.time_s == pytest.approx(ests[r.index].iteration_s) for r in timed.ranked)


def test_pareto_marks_on_a_constructed_example():
    pts = [(1.0, 5.0), (2.0, 4.0), (2.0, 6.0), (3.0, 4.0), (0.5, 10.0), (1.0, 5.0), (4.0, 1.0)]
    assert pareto_mask(pts) == [True, True, False, False, True, True, True]
    assert pareto_mask([(1.0, 1.0)]) == [True] and pareto_mask([]) == []


def test_ranking_pareto_marks_match_the_points(tiny):
    cl, ests = tiny
    ranking = rank_strategies(ests, cl, objective="energy", max_slowdown=0.05, top_k=6)
    pts = [(r.point.time_s, r.point.energy_j) for r in ranking.ranked]
    for r, (t, e) in zip(ranking.ranked, pts, strict=False):
        dominated = any(t2 <= t and e2 <= e and (t2 < t or e2 < e) for t2, e2 in pts)
        assert r.pareto == (not dominated)


def test_frequency_plan_follows_the_schedule_and_validates(tiny):
    from tests.support.plans import validate_plan

    cl, ests = tiny
    pp2 = next(e for e in ests if e.strategy.pp == 2)
    se = plan_clocks(pp2, cl)
    sp = se.fastest()
    assert not is_all_max(se, sp)  # imbalanced stages: stage 0 slows down at no cost in time
    fp = frequency_plan_of(se, sp).to_json()
    gas = pp2.strategy.gas
    for s, stage in enumerate(fp["stages"]):
        assert [(i, mb) for i, mb, _ in stage] == [(x.instruction, x.microbatch) for x in one_f_one_b(2, gas, s)]
        assert all(isinstance(f, int) and 1000 <= f <= 3000 for _, _, f in stage)
    assert "replicas" not in fp  # one replica
    assert any(f < 3000 for _, _, f in fp["stages"][0])
    mbs = pp2.strategy.mbs  # the entry is the strategy planned: its clocks name its gas micro-batches
    doc = {"schema": "ampe.plan/1", "cluster": "c", "model": "m", "global_batch": gas * mbs,
           "search": {"candidates": 1, "pruned_oom": 0, "seconds": 0.0},
           "strategies": [{"rank": 1, "pp": 2, "dp": 1, "tp": 1, "mbs": mbs, "gas": gas, "placement": [0, 1],
                           "partition": [0, 4, 10], "deepspeed": {"train_batch_size": gas * mbs,
                                                                  "train_micro_batch_size_per_gpu": mbs,
                                                                  "gradient_accumulation_steps": gas},
                           "predicted": {"iteration_s": 1.0, "samples_per_s": 8.0, "max_memory_bytes": 1,
                                         "energy_j": sp.energy_j, "energy_savings_pct": sp.savings_pct},
                           "frequency_plan": json.loads(json.dumps(fp))}]}
    validate_plan(doc, "plan")
    bad = json.loads(json.dumps(doc))
    bad["strategies"][0]["frequency_plan"]["stages"][0][0][2] = 0
    with pytest.raises(InputError):
        validate_plan(bad, "plan")
    beyond = json.loads(json.dumps(doc))  # a clock for micro-batch 99 of gas: refused where the plan is read
    beyond["strategies"][0]["frequency_plan"]["stages"][1][0][1] = 99
    with pytest.raises(InputError, match=f"micro-batch 99, but the strategy runs {gas}") as e:
        validate_plan(beyond, "plan")
    assert e.value.field == "strategies[0].frequency_plan.stages[1]"


def test_single_stage_at_t_min_keeps_every_clock_at_maximum(tiny):
    cl, ests = tiny
    se = plan_clocks(ests[0], cl)  # pp 1, dp 2: every computation is on the critical path
    assert ests[0].strategy.pp == 1 and is_all_max(se, se.fastest())
    assert se.fastest().savings_pct == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("planner", ["envpipe", "global"])
def test_baseline_planners_give_feasible_t_min_points(tiny, planner):
    cl, ests = tiny
    pp2 = next(e for e in ests if e.strategy.pp == 2)
    perseus = plan_clocks(pp2, cl).fastest()
    se = plan_clocks(pp2, cl, planner=planner)
    sp = se.fastest()
    assert sp.time_s == pytest.approx(perseus.time_s)
    assert sp.energy_j <= sp.energy_max_clock_j + 1e-9
    assert perseus.energy_j <= sp.energy_j + 1e-9  # per-computation clocks never lose to the baselines here
    chosen = OBJECTIVES["energy"].best(se, 1.1 * sp.time_s)
    assert chosen is not None and chosen.time_s <= 1.1 * sp.time_s * (1 + 1e-9)


def test_choose_returns_none_when_t_min_is_over_the_bound(tiny):
    cl, ests = tiny
    se = plan_clocks(ests[-1], cl)
    assert OBJECTIVES["energy"].best(se, se.fastest_time_s * 0.99) is None
    with pytest.raises(ValueError):
        objective_named("speed")


def test_screening_keeps_the_ranking_bounded(tiny):
    cl, ests = tiny
    ranking: EnergyRanking = rank_strategies(ests, cl, objective="energy", max_slowdown=1.0, top_k=2)
    assert ranking.screened == len(ests) and ranking.evaluated <= 4  # 2·top_k planned at full resolution
    assert np.all(np.diff([r.point.energy_j for r in ranking.ranked]) >= -1e-12)


def test_slack_margin_keeps_slack_for_slowed_computations(tiny):
    from ampe.energy.inputs import dag_from_inputs
    from ampe.tradeoff.evaluate import evaluate_choice

    cl, ests = tiny
    pp2 = next(e for e in ests if e.strategy.pp == 2)
    g = 0.05
    exact, safe = plan_clocks(pp2, cl), plan_clocks(pp2, cl, margin=g)
    assert safe.t_min_s == pytest.approx(exact.t_min_s) and safe.margin == g
    pe, ps = exact.fastest(), safe.fastest()
    assert ps.time_s == pytest.approx(pe.time_s)  # still no slowdown
    assert pe.energy_j <= ps.energy_j < ps.energy_max_clock_j  # a little less saved, still saving
    inflated = dag_from_inputs(safe.replicas[0].inputs, margin=g)
    # slowed computations 5% longer than modelled: the margin plan still ends by T_min, the exact one does not
    assert evaluate_choice(inflated, ps.points[0].choice).time_s <= safe.t_min_s * (1 + 1e-9)
    assert evaluate_choice(inflated, pe.points[0].choice).time_s > exact.t_min_s * (1 + 1e-6)
    assert frequency_plan_of(safe, ps).margin == g


def test_freezing_leaves_the_frozen_stage_underloaded_and_the_planner_down_clocks_it():
    """FreezePipe + Perseus: with the old partition kept, a frozen prefix runs forward only; its stage, the slower
    one before freezing, becomes under-loaded, and the T_min plan lowers its clocks while the now critical stage
    stays at the maximum."""
    cl = cluster_from_dict({"name": "2xA100", "nodes": [{"name": "n", "gpu": "A100-40GB", "count": 2,
                                                         "intra_gbps": 600, "inter_gbps": 100}]})
    model = load_model("gpt2-medium")
    # stage 1 holds the LM head (an unaligned 50,257-column GEMM and the loss): stage 0 takes 15 blocks to be slower
    s = Strategy(pp=2, dp=1, tp=1, mbs=2, gbs=16, partition=(0, 17, model.num_layers), placement=(0, 1))

    def stages(m):
        est = CostModel(cl, m).estimate(s)
        se = plan_clocks(est, cl)
        fp = frequency_plan_of(se, se.fastest()).to_json()
        assert fp is not None
        return est.stage_times_s, [float(np.mean([f for _, _, f in st])) for st in fp["stages"]]

    (t0_before, t1_before), (mhz0_before, _) = stages(model)
    (t0_after, t1_after), (mhz0_after, mhz1_after) = stages(model.with_frozen_prefix(16))
    assert t0_before > t1_before and t0_after < 0.6 * t1_after  # stage 0 was the slower one; freezing unloads it
    assert mhz0_after < mhz0_before - 200
    # the critical stage keeps A100's full speed: its maximum clock or one the measured power cap makes as fast
    assert dvfs.time_ratio(cl.devices[0].gpu, mhz1_after) == pytest.approx(1.0)


def test_a_strategys_time_plan_does_not_depend_on_the_strategies_planned_with_it(het):
    """The direct point's LPs are warm-started from the optimal bases of the strategy's own earlier replicas; an LP
    with several optima can end at another vertex from another start. So the bases are never shared across
    strategies and a cached replica is reused only after the same earlier replicas: each strategy's clocks are the
    same planned alone, in another order, or among others (as in a parallel worker and in `ampe frontier --plan`)."""
    cl, _ = het
    cm = CostModel(cl, load_model("gpt2"))
    # replicas A100 pair then V100 pair, the same two in the other order, and other micro-batch counts
    ests = [cm.estimate(Strategy(2, 2, 1, mbs, 16, placement=pl)) for mbs in (2, 1, 4)
            for pl in ((0, 2, 1, 3), (2, 0, 3, 1))]
    assert all(len({tuple(g.name for g in r.inputs.gpus) for r in plan_clocks(e, cl).replicas}) == 2 for e in ests)

    def plans(ranking):
        return {r.index: [np.asarray(p.choice).tolist() for p in r.point.points] for r in ranking.ranked}

    n = len(ests)
    together = plans(rank_strategies(ests, cl, objective="time", top_k=n))
    backwards = {n - 1 - i: c for i, c in plans(rank_strategies(ests[::-1], cl, objective="time", top_k=n)).items()}
    alone = {i: plans(rank_strategies([e], cl, objective="time", top_k=1))[0] for i, e in enumerate(ests)}
    assert together == backwards == alone
