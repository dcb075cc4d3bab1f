"""The point solved directly (time objective): never slower than its deadline, close to the traced frontier."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.energy.direct import point_by
from ampe.energy.evaluate import OptionTable, evaluate_batch, fastest_choice
from ampe.energy.frontier import trace_frontier
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
