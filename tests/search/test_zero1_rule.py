"""The documented ZeRO-1 rule (docs/cost_model.md): ZeRO-1 is kept only where nothing fits without it, or where it is
faster even after handing back its smaller optimizer step. On devices that time-share processors (local-cpu-4: four
ranks on two cores) each processor's tail runs its ranks' optimizer steps one after another, so the step ZeRO-1
shrinks is handed back once per rank there (ampe.search.engine.optimizer_credit). Oracle: each level costed on its
own."""

from __future__ import annotations

from types import SimpleNamespace

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.zoo import load_model
from ampe.search.engine import _best_for_options, best_for_placement, optimizer_credit
from ampe.search.space import Degrees
from tests.conftest import SPECS

LEVELS = ("none", "selective", "full")


def test_zero1_is_not_taken_where_everything_fits_without_it_and_only_its_optimizer_step_is_faster():
    cm = CostModel(load_cluster(SPECS / "local-cpu-4.yaml"), load_model("gpt2-tiny"), None)
    placement = (0, 1, 2, 3)
    assert optimizer_credit(cm, placement) == 2 / 0.91  # two ranks per core, at the spec's sharing efficiency
    for d in (Degrees(2, 2, 1, 4, 8), Degrees(1, 4, 1, 2, 8), Degrees(2, 2, 1, 2, 8)):
        plain = _best_for_options(cm, d, placement, 4, "eq5", LEVELS, 0, None)
        zero1 = _best_for_options(cm, d, placement, 4, "eq5", LEVELS, 1, None)
        assert plain is not None and plain.fits and zero1 is not None
        chosen = best_for_placement(cm, d, placement)
        assert chosen is not None
        saved = plain.optimizer_s - zero1.optimizer_s
        pipeline_faster = zero1.iteration_s + optimizer_credit(cm, placement) * saved < plain.iteration_s
        assert chosen.strategy.zero == (1 if pipeline_faster else 0), d
    # the case of the issue: modelled faster only through the optimizer step on the shared cores, so no ZeRO-1
    assert best_for_placement(cm, Degrees(2, 2, 1, 4, 8), placement).strategy.zero == 0


def test_on_devices_of_their_own_one_optimizer_step_is_handed_back():
    cm = CostModel(load_cluster(SPECS / "local-cpu.yaml"), load_model("gpt2-tiny"), None)
    assert optimizer_credit(cm, (0, 1)) == 1.0


def test_a_plan_records_its_objective_and_replan_says_what_it_chose_by(run_cli, tmp_path):
    import json

    from ampe.cli._replan_change import objective_line

    out = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--global-batch",
                           "8", "--top-k", "1", "--energy-planner", "none", "--out", out)
    assert code == 0, err
    assert json.loads(out.read_text())["inputs"]["objective"] == "time"
    assert objective_line("time", "the default") == ("chosen by time (the default): replan keeps the iteration time "
                                                     "(and the fewest moves among near-ties)")
    assert objective_line("cost", "the plan's objective", 1.25).startswith(
        "chosen by cost (the plan's objective): the least money per iteration within 1.2500 s/iter")


def test_the_price_line_lists_every_node_group_a_ranked_strategy_uses():
    from ampe.cli._cost import _all_prices

    v100 = "0.45/GPU-h (nodes[0].price_per_hour), 0.09/kWh, 45 gCO2e/kWh, PUE 1.1 (nodes[0])"
    t4 = "0.12/GPU-h (nodes[1].price_per_hour), 0.21/kWh, 420 gCO2e/kWh, PUE 1.4 (nodes[1])"
    costs = [SimpleNamespace(prices=p) for p in (v100, f"{v100}; {t4}", v100)]  # the PlanCost field it reads
    assert _all_prices(costs) == f"{v100}; {t4}"
