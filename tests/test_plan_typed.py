"""The plan is typed end to end: ``make_plan`` builds the reader's models, and what it writes reads back to the same
JSON, key order included (the writer sets exactly the fields the reader would)."""

from __future__ import annotations

import json

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan import (
    EnergyStats,
    PlanCost,
    PlanFile,
    ReplannedFrom,
    SearchStats,
    StrategyEntry,
    TrainingRunFigures,
)
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
    energy = made.plan.search.energy  # the search section is the reader's model too
    assert isinstance(energy, EnergyStats) and energy.objective == "cost" and energy.planner == "perseus"
    assert energy.bound_s is not None and energy.fastest_s is not None
    assert abs(energy.bound_s - 1.05 * energy.fastest_s) <= 1e-9 * energy.bound_s  # the 5 % bound
    assert made.plan.search.method == "eq5" and made.plan.search.replanned_from is None
    assert any(isinstance(e.frequency_plan, FrequencyPlan) for e in entries)
    written = json.dumps(made.plan.to_json())
    assert json.dumps(PlanFile.parse(json.loads(written), "plan.json").to_json()) == written
    assert '"amp_iteration_s"' not in written and '"tokens": null' in written  # unset stays out; set None stays


def test_the_search_section_keeps_its_writers_key_order_and_leaves_absent_fields_out():
    """A re-plan copies an old plan's ``search`` section and adds to it: the copied keys stay where they were, new
    ones come last in the order added, and declared fields the old plan lacks stay absent (no nulls)."""
    old = SearchStats.parse({"candidates": 3, "pruned_oom": 0, "seconds": 0.5, "cost_model": "amp",
                             "ampe_predicts_oom": 1, "later_version": {"x": 1}}, "old.json")  # an AMP plan's
    new = old.edited(replanned_from=ReplannedFrom(plan="old.json", rank=1)).edited(
        energy=EnergyStats(planner="perseus", objective="time"))
    doc = new.to_json()
    assert list(doc) == ["candidates", "pruned_oom", "seconds", "cost_model", "ampe_predicts_oom", "later_version",
                         "replanned_from", "energy"]
    assert list(doc["energy"]) == ["planner", "objective"] and doc["replanned_from"] == {"plan": "old.json", "rank": 1}
    again = SearchStats.parse(json.loads(json.dumps(doc)), "new.json")  # read back: the same keys, in order
    assert json.dumps(again.to_json()) == json.dumps(doc)
    replaced = again.edited(energy=EnergyStats(objective="energy"))  # a key it has keeps its place
    assert list(replaced.to_json())[-2:] == ["replanned_from", "energy"]
    moved = again.edited(drop=("replanned_from",)).edited(replanned_from=ReplannedFrom(plan="b.json", rank=2))
    assert list(moved.to_json())[-2:] == ["energy", "replanned_from"]
