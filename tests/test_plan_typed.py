"""The plan is typed end to end: ``make_plan`` builds the reader's models, and what it writes reads back to the same
JSON, key order included (the writer sets exactly the fields the reader would)."""

from __future__ import annotations

import json

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.formats.plan import PlanCost, PlanFile, StrategyEntry, TrainingRunFigures
from ampe.planning import PlanRequest, make_plan
from ampe.search.engine import SearchOptions
from tests.conftest import SPECS
from tests.support.golden_plans import AMP_PROFILE, ROOT


def test_a_priced_energy_plan_is_built_typed_and_reads_back_byte_for_byte():
    request = PlanRequest(search=SearchOptions(gbs=8, top_k=2), objective="cost", max_slowdown=0.05,
                          pipeline_degrees=(4,), iterations=1000)
    made = make_plan(load_cluster(SPECS / "amp-het-priced.yaml"), load_model("gpt2-amp"),
                     load_profile(ROOT / AMP_PROFILE), request)
    entries = made.plan.strategies
    assert entries and all(isinstance(e, StrategyEntry) for e in entries)
    for e in entries:
        cost, run = e.predicted.cost, e.predicted.training_run
        assert isinstance(cost, PlanCost) and isinstance(run, TrainingRunFigures)
        assert run.iterations == cost.iterations == 1000
        assert cost.per_run is not None and cost.per_iteration is not None
        assert abs(cost.per_run - 1000 * cost.per_iteration) <= 1e-9 * cost.per_run  # one run = 1000 iterations
        assert e.predicted.energy_j is not None and e.predicted.plan_time_s is not None
        # the run's kWh and hours are the iteration's joules and seconds times the iterations
        assert abs(run.energy_kwh - 1000 * e.predicted.energy_j / 3.6e6) <= 1e-9 * run.energy_kwh
        assert abs(run.hours - 1000 * e.predicted.plan_time_s / 3600) <= 1e-9 * run.hours
    written = json.dumps(made.plan.to_json())
    assert json.dumps(PlanFile.parse(json.loads(written), "plan.json").to_json()) == written
    assert '"amp_iteration_s"' not in written and '"tokens": null' in written  # unset stays out; set None stays
