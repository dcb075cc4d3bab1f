"""One Objective per name (ampe.energy.objective): the names the CLI offers, which need prices, and each one's best
point against brute force over every synchronous time a frontier point gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pricing import PRICED
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.objective import OBJECTIVES, objective_named
from ampe.energy.strategy import plan_clocks

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


@pytest.fixture(scope="module")
def planned():
    cluster = load_cluster(SPECS / "perseus-a40-8.yaml")
    est = CostModel(cluster, load_model("gpt3-2.7b")).estimate(Strategy(4, 2, 1, 1, 16))
    return plan_clocks(est, cluster, max_time_s=1.2 * est.iteration_s)


def test_one_objective_per_name():
    assert tuple(OBJECTIVES) == ("time", "energy", "edp", "cost", "carbon")
    assert {o.name for o in OBJECTIVES.values() if o.priced} == set(PRICED)
    assert [o.name for o in OBJECTIVES.values() if not o.slows] == ["time"]
    with pytest.raises(ValueError, match="one of time, energy, edp, cost, carbon"):
        objective_named("speed")


@pytest.mark.parametrize("name", ["time", "energy", "edp"])
def test_best_point_against_every_frontier_time(planned, name):
    se, goal = planned, OBJECTIVES[name]
    bound = 1.1 * se.fastest_time_s
    best = goal.best(se, bound)
    assert best is not None and best.time_s <= bound * (1 + 1e-9)
    times = {se.t_prime_min_s} | {p.time_s for r in se.replicas for p in r.frontier.points}
    others = [se.at(t) for t in times if se.t_prime_min_s <= t and t + se.post_s <= bound]
    assert len(others) > 10
    low = min(goal.score(se, sp) for sp in others)
    assert goal.score(se, best) <= low * (1 + 1e-9)
    assert goal.best(se, 0.99 * se.fastest_time_s) is None


def test_priced_objectives_need_the_prices(planned):
    for name in PRICED:
        with pytest.raises(ValueError, match="needs the strategy's prices"):
            OBJECTIVES[name].best(planned)
