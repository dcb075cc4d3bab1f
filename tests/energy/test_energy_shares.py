"""Uneven shares in the energy planner: each replica's DAG runs its own micro-batches, the all-max point is the
cost model's iteration, and the frequency plan is checked against each replica's share."""

from __future__ import annotations

from dataclasses import replace

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.inputs import inputs_from_estimate, job_of, replica_inputs
from ampe.energy.strategy import frequency_plan_of, plan_clocks
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
    plan = frequency_plan_of(se, se.fastest())
    assert plan.check_shape(2, 3, (6, 1, 5)) is None
    # every replica held to the largest share: the A40 replica's one micro-batch is not a whole iteration of 6
    assert plan.check_shape(2, 3, 6) is not None
    assert "replicas[1]" in (plan.check_shape(2, 3, (6, 2, 5)) or "")


def test_shares_over_the_dag_bound_fall_back_to_equal(planned) -> None:
    import ampe.planning as planning
    from ampe.search.engine import Candidate

    cluster, est, _ = planned
    model = load_model("gpt3-1.3b")
    kept = [Candidate(est, "p")]
    assert planning.plannable_shares(kept, cluster, model, None, "eq5") == kept  # 72 nodes: within the bound
    assert planning.plannable_shares(kept, cluster, model, None, "eq5", max_nodes=72) == kept
    [got] = planning.plannable_shares(kept, cluster, model, None, "eq5", max_nodes=71)
    assert got.strategy.replica_gas is None and got.strategy.gbs == 12
    assert got.estimate.iteration_s > est.iteration_s


TWO_TYPES = """name: two-types
nodes:
  - {name: a100, gpu: A100-80GB, count: 2, intra_gbps: 2400, inter_gbps: 100}
  - {name: a40, gpu: A40, count: 2, intra_gbps: 200, inter_gbps: 100}
"""


def test_shares_and_clocks_chosen_together_equal_brute_force(tmp_path) -> None:
    """Two replicas (A100s, A40s): the energy ranking over the time-optimal split and its share variants chooses
    the same point as the ranking over every split of the batch (shares × frontier points)."""
    from ampe.energy.ranking import rank_strategies
    from ampe.planning import PlanRequest, with_share_variants
    from ampe.search.engine import Candidate, SearchOptions
    from ampe.search.shares import with_best_shares

    spec = tmp_path / "two.yaml"
    spec.write_text(TWO_TYPES)
    cluster, model = load_cluster(spec), load_model("gpt3-1.3b")
    cm = CostModel(cluster, model)
    s = Strategy(pp=2, dp=2, tp=1, mbs=1, gbs=10, placement=(0, 2, 1, 3))  # replica 0: A100s, replica 1: A40s
    best = with_best_shares(cm, cm.estimate(s))
    assert best.strategy.uneven
    objective = "energy"
    request = PlanRequest(search=SearchOptions(gbs=10), objective=objective, max_slowdown=0.1)
    planned = with_share_variants([Candidate(best, "p")], cm, request)
    every = [e for e in (cm.estimate(replace_shares(s, u)) for u in range(1, 10)) if e.within_capacity]
    assert len(planned) > 1

    def chosen(ests):
        top = rank_strategies(ests, cluster, objective=objective, max_slowdown=0.1, top_k=10).ranked[0]
        return ests[top.index].strategy.shares, top.point.energy_j, top.point.time_s

    got, want = chosen([c.estimate for c in planned]), chosen(every)
    assert got[0] == want[0] and got[1] == pytest.approx(want[1], rel=1e-9) and got[2] == pytest.approx(want[2])


def replace_shares(s: Strategy, first: int) -> Strategy:
    from ampe.costmodel.strategy import with_shares

    return with_shares(s, (first, s.gbs // s.mbs - first))


def test_one_schedule_for_replicas_of_different_shares_is_refused(planned) -> None:
    """A plan with only `stages` (no per-replica lists) cannot serve replicas that run 5 and 3 micro-batches."""
    _, _, se = planned
    whole = frequency_plan_of(se, se.fastest()).to_json()
    alone = FrequencyPlan.model_validate({k: v for k, v in whole.items() if k not in ("replicas", "replica_plan")})
    assert "different numbers of micro-batches" in (alone.check_shape(2, 3, (6, 1, 5)) or "")


@pytest.mark.parametrize("replica_gas", [(6, 1, 5), None])
def test_replica_inputs_equal_one_build_per_replica(replica_gas) -> None:
    """replica_inputs builds one inputs object per distinct replica: each replica's equals what
    inputs_from_estimate builds for it alone, and replicas with equal figures share one object."""
    cluster = load_cluster(SPECS / "mixed-a100-a40.yaml")
    est = CostModel(cluster, load_model("gpt3-1.3b")).estimate(replace(UNEVEN, replica_gas=replica_gas))
    types = {g.name: g for g in cluster.gpu_types()}
    got = replica_inputs(est, cluster)
    s = est.strategy
    alone = [inputs_from_estimate(est, r, [types[n] for n in est.stage_gpu[r]], s.shares[r], tp=s.tp,
                                  schedule=s.schedule, virtual_stages=s.virtual_stages) for r in range(s.dp)]
    assert list(got) == alone
    # replicas 0 and 2 both run on A100s: one object where their figures (and shares) are equal
    assert (got[0] is got[2]) == (alone[0] == alone[2]) and got[0] is not got[1]
    assert (replica_gas is None) == (got[0] is got[2])
