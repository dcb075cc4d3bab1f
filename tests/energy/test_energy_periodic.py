"""The folded LP of many identical micro-batches (ampe.tradeoff.periodic): its plans are schedules of the whole DAG,
as cheap as the whole LP's within a small margin, and it folds only 1F1B pipelines whose all-max middle repeats."""

from __future__ import annotations

import numpy as np
import pytest

import ampe.tradeoff.direct as direct
from ampe.costmodel.catalog import CATALOG
from ampe.energy.inputs import PipelineInputs, dag_from_inputs
from ampe.tradeoff.evaluate import OptionTable, earliest, evaluate_batch, fastest_choice
from ampe.tradeoff.periodic import periodic_fold

CASES = [((0.011, 0.010, 0.013), 32, ("A100-80GB",) * 3),
         ((0.02, 0.02, 0.017, 0.026), 48, ("A100-80GB", "A100-80GB", "V100-32GB", "V100-32GB")),
         ((0.012, 0.015, 0.011, 0.014, 0.013), 40, ("A40",) * 5)]


SMALL = 0  # fold_from for these DAGs: they are small (a few hundred computations), folded as the large ones are


def _dag(fwd, m, gpus, schedule="1f1b"):
    inp = PipelineInputs(fwd, tuple(2 * x for x in fwd), tuple(CATALOG[g] for g in gpus), m,
                         p2p_forward_s=(0.0007,) * (len(fwd) - 1), schedule=schedule)
    dag = dag_from_inputs(inp)
    return dag, OptionTable.of(dag)


def _all_max(dag, table):
    finish = earliest(dag, table.time_s[np.arange(len(dag.nodes)), fastest_choice(dag)][None, :])[1][0]
    return finish, float(finish.max())


@pytest.mark.parametrize("fwd,m,gpus", CASES)
def test_folded_plan_is_a_schedule_of_the_whole_dag(fwd, m, gpus):
    dag, table = _dag(fwd, m, gpus)
    finish_max, t_max = _all_max(dag, table)
    fold = periodic_fold(dag, finish_max, SMALL)
    assert fold is not None
    n, kinds = len(fwd), 2 * len(fwd)
    head = n + (m - 2 * n) % fold.block  # the warm-up (and the middle's remainder), then one block, then the drain
    assert fold.cls.max() + 1 == kinds * (head + fold.block + n) < kinds * m
    for deadline in (t_max, 1.04 * t_max):
        plan = direct.relaxed_plan(dag, table, deadline, fold=fold)
        assert plan is not None
        durations, finish = plan
        ops = dag.computation_mask
        # the planned durations fit the deadline on the whole DAG (every dependency, transfers included)
        assert earliest(dag, durations[None, :])[1].max() <= deadline * (1 + 1e-7)
        # and the planned finishes are one such schedule: each computation after its predecessors
        start = np.where(ops, finish - durations, np.nan)
        own = np.where(ops, finish, np.nan)
        for v in np.flatnonzero(ops).tolist():
            for p in dag.preds[v]:
                lag = 0.0
                while not ops[p]:
                    lag += durations[p]
                    p = dag.preds[p][0]
                assert own[p] + lag <= start[v] + 1e-6 * t_max
        # as cheap as the whole LP within 1 % of the all-max energy (it is the best periodic schedule)
        folded = _relaxed_cost(dag, table, durations)
        full = _relaxed_cost(dag, table, direct.relaxed_plan(dag, table, deadline)[0])
        e_max = float(evaluate_batch(dag, table, fastest_choice(dag)[None, :])[2][0])
        assert full - 1e-6 * e_max <= folded <= full + 0.01 * e_max


def _relaxed_cost(dag, table, durations):
    """Σ over computations of the hull cost at its planned duration (J): the relaxation's objective."""
    total = 0.0
    for v in np.flatnonzero(dag.computation_mask).tolist():
        row = table.row_of[v]
        times, ids = table.row_pareto[row]
        if len(times) < 2:
            total += float(table.row_effective_j[row, ids][0])
            continue
        ht, hc = direct._hull(times, table.row_effective_j[row, ids])
        total += float(np.interp(durations[v], ht, hc))
    return total


@pytest.mark.parametrize("fwd,m,gpus", CASES)
def test_point_with_the_fold_meets_the_deadline_and_costs_as_without(fwd, m, gpus):
    dag, table = _dag(fwd, m, gpus)
    _, t_max = _all_max(dag, table)
    e_max = float(evaluate_batch(dag, table, fastest_choice(dag)[None, :])[1][0])
    _, folded = direct.point_by(dag, table=table, fold_from=SMALL)
    _, whole = direct.point_by(dag, table=table, fold_from=10**9)  # never folded
    assert folded.time_s <= t_max * (1 + 1e-12) and whole.time_s <= t_max * (1 + 1e-12)
    assert folded.energy_j < e_max  # imbalanced stages: something saved
    assert abs(folded.effective_j - whole.effective_j) <= 0.01 * e_max


def test_what_does_not_fold():
    fwd, gpus = (0.011, 0.010, 0.013), ("A100-80GB",) * 3
    dag, table = _dag(fwd, 32, gpus)
    assert periodic_fold(dag, _all_max(dag, table)[0], 2 * 3 * 32 + 1) is None  # one computation more than it has
    assert periodic_fold(dag, _all_max(dag, table)[0], 2 * 3 * 32) is not None
    dag, table = _dag(fwd, 12, gpus)  # 6 middle micro-batches: too few to fold
    assert periodic_fold(dag, _all_max(dag, table)[0], SMALL) is None
    dag, table = _dag(fwd, 32, gpus, schedule="gpipe")
    assert periodic_fold(dag, _all_max(dag, table)[0], SMALL) is None
    dag, table = _dag(fwd, 32, gpus)
    finish, t_max = _all_max(dag, table)
    noisy = finish + np.random.default_rng(0).uniform(0, 1e-3 * t_max, len(finish))  # a middle that never repeats
    assert periodic_fold(dag, noisy, SMALL) is None


def test_a_longer_transient_keeps_a_longer_warm_up():
    fwd, gpus = (0.011, 0.010, 0.013), ("A100-80GB",) * 3
    dag, table = _dag(fwd, 48, gpus)
    finish, t_max = _all_max(dag, table)
    short = periodic_fold(dag, finish, SMALL)
    mb = np.array([node.microbatch for node in dag.nodes])
    early = mb < 2 * 3  # the first 2N micro-batches made not to repeat
    late = finish + np.where(early, np.random.default_rng(1).uniform(0, 1e-4 * t_max, len(finish)), 0.0)
    longer = periodic_fold(dag, late, SMALL)
    assert short is not None and longer is not None
    assert longer.cls.max() > short.cls.max()  # more micro-batches kept whole
    first_folded = min(int(mb[v]) for v, o in zip(np.flatnonzero(dag.computation_mask), longer.offset, strict=True)
                       if o > 0)
    assert first_folded >= 2 * 3 + longer.block  # nothing of the perturbed warm-up is folded
    durations, _ = direct.relaxed_plan(dag, table, t_max, fold=longer)
    assert earliest(dag, durations[None, :])[1].max() <= t_max * (1 + 1e-7)
