"""Uneven shares in the energy planner: each replica's DAG runs its own micro-batches, the all-max point is the
cost model's iteration, and the frequency plan is checked against each replica's share."""

from __future__ import annotations

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.inputs import job_of, replica_inputs
from ampe.energy.strategy import frequency_plan_json, plan_clocks
from ampe.formats.frequency_plan import FrequencyPlan
from tests.conftest import SPECS

# replica 0 on two A100s, replica 1 on two A40s, replica 2 on two A100s; the A40 replica runs one micro-batch
UNEVEN = Strategy(pp=2, dp=3, tp=1, mbs=1, gbs=12, placement=(0, 16, 2, 1, 17, 3), replica_gas=(6, 1, 5))


@pytest.fixture(scope="module")
def planned():
    cluster = load_cluster(SPECS / "mixed-a100-a40.yaml")
    est = CostModel(cluster, load_model("gpt3-1.3b")).estimate(UNEVEN)
    return cluster, est, plan_clocks(est, cluster)


def test_each_replica_plans_its_own_share(planned) -> None:
    cluster, est, se = planned
    assert [i.num_microbatches for i in replica_inputs(est, cluster)] == [6, 1, 5]
    # forward and backward of each micro-batch on each of the two stages, per replica
    assert [int(r.dag.computation_mask.sum()) for r in se.replicas] == [2 * 2 * g for g in (6, 1, 5)]
    assert se.fastest().time_s == pytest.approx(est.iteration_s, rel=1e-6)
    # the work bound counts each distinct replica's own DAG
    assert job_of(0, est, cluster).nodes == sum(2 * 2 * g + 2 * g for g in (6, 1, 5))


def test_frequency_plan_is_checked_per_replica(planned) -> None:
    _, _, se = planned
    plan = FrequencyPlan.model_validate(frequency_plan_json(se, se.fastest()))
    assert plan.check_shape(2, 3, (6, 1, 5)) is None
    # every replica held to the largest share: the A40 replica's one micro-batch is not a whole iteration of 6
    assert plan.check_shape(2, 3, 6) is not None
    assert "replicas[1]" in (plan.check_shape(2, 3, (6, 2, 5)) or "")


def test_shares_over_the_dag_bound_fall_back_to_equal(planned, monkeypatch) -> None:
    import ampe.planning as planning
    from ampe.search.engine import Candidate

    cluster, est, _ = planned
    model = load_model("gpt3-1.3b")
    kept = [Candidate(est, "p")]
    assert planning.plannable_shares(kept, cluster, model, None, "eq5") == kept  # 72 nodes: within the bound
    monkeypatch.setattr(planning, "MAX_DAG_NODES", 71)
    [got] = planning.plannable_shares(kept, cluster, model, None, "eq5")
    assert got.strategy.replica_gas is None and got.strategy.gbs == 12
    assert got.estimate.iteration_s > est.iteration_s
