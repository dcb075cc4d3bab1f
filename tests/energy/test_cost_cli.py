"""``ampe search --objective cost|carbon`` end to end on the bundled priced spec: the plan's money and CO2e figures,
the table, the ranking, and the one-line refusals of a spec without prices."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampe.costmodel.pricing import J_PER_KWH
from tests.support.plans import validate_plan

ROOT = Path(__file__).resolve().parents[2]
PRICED = ROOT / "cluster_specs" / "amp-het-priced.yaml"
PLAIN = ROOT / "cluster_specs" / "amp-het-cluster.yaml"
PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"
ARGS = ("--model", "gpt2-amp", "--profile", PROFILE, "--global-batch", "32", "--top-k", "3")
SITES = {"V100-16GB": (0.45, 0.09, 45, 1.1), "T4": (0.12, 0.21, 420, 1.4)}  # the spec's: price, kWh, g/kWh, PUE


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    from ampe.cli import main

    d = tmp_path_factory.mktemp("cost")
    for objective in ("cost", "carbon", "time"):
        code = main(["search", "--cluster", str(PRICED), *map(str, ARGS), "--objective", objective,
                     "--iterations", "1000", "--out", str(d / f"{objective}.json")])
        assert code == 0
    return {o: validate_plan(json.loads((d / f"{o}.json").read_text()), o) for o in ("cost", "carbon", "time")}


def test_plan_carries_money_and_co2e_that_add_up(plans):
    for doc in plans.values():
        gpu = {d["id"]: d["gpu"] for d in doc["devices"]}
        for e in doc["strategies"]:
            p, c = e["predicted"], e["predicted"]["cost"]
            used = set(e["placement"])
            assert c["currency"] == "USD" and c["devices"] == len(used) == 16
            assert c["gpu_hours_per_iteration"] == pytest.approx(16 * p["plan_time_s"] / 3600)
            rent = sum(SITES[gpu[d]][0] for d in used) * p["plan_time_s"] / 3600
            assert c["rent_per_iteration"] == pytest.approx(rent, rel=1e-9)
            # every device's joules at its own site: facility kWh lies between the cheapest and dearest PUE's
            kwh = p["energy_j"] / J_PER_KWH
            assert 1.1 * kwh < c["energy_kwh_per_iteration"] < 1.4 * kwh
            assert 0.09 * 1.1 * kwh < c["electricity_per_iteration"] < 0.21 * 1.4 * kwh
            assert 45 * 1.1 * kwh < c["co2e_g_per_iteration"] < 420 * 1.4 * kwh
            assert c["per_iteration"] == pytest.approx(c["rent_per_iteration"] + c["electricity_per_iteration"])
            assert c["per_million_tokens"] == pytest.approx(c["per_iteration"] / (32 * 1024) * 1e6)
            assert c["iterations"] == 1000 and c["per_run"] == pytest.approx(1000 * c["per_iteration"])
            assert c["co2e_kg_per_run"] == pytest.approx(c["co2e_g_per_iteration"])  # 1000 iterations, g → kg
            assert "nodes[0].price_per_hour" in c["prices"] and "nodes[1]" in c["prices"]
            assert c["energy_source"].startswith("modelled")


@pytest.mark.parametrize("objective,figure", [("cost", "per_iteration"), ("carbon", "co2e_g_per_iteration")])
def test_ranked_by_the_objective_within_the_bound(plans, objective, figure):
    doc = plans[objective]
    assert doc["search"]["energy"]["objective"] == objective
    inside = [e for e in doc["strategies"] if e["predicted"]["within_slowdown"]]
    values = [e["predicted"]["cost"][figure] for e in inside]
    assert inside and values == sorted(values)
    # the rank-1 point is at least as good as the time objective's rank 1 (a point the objective could choose)
    best_time = plans["time"]["strategies"][0]["predicted"]["cost"][figure]
    assert values[0] <= best_time * (1 + 1e-9)


def test_table_shows_money_co2e_and_where_they_came_from(run_cli, tmp_path, plans):
    """With --priced-direct (the table does not depend on how the points were found), which the plan records."""
    plan = tmp_path / "direct.json"
    code, out, err = run_cli("search", "--cluster", PRICED, *ARGS, "--objective", "carbon", "--priced-direct",
                             "--out", plan)
    assert code == 0, err
    doc = json.loads(plan.read_text())
    assert doc["search"]["energy"]["priced_direct"] is True
    # each strategy records its path: direct within the bound; traced (absent) by default on this small spec
    assert [e["predicted"]["cost"].get("direct") for e in doc["strategies"]] \
        == [True if e["predicted"]["within_slowdown"] else None for e in doc["strategies"]]
    # with a point at the bound's end (it cuts the carbon windows here), the direct points come within 0.01 % of the
    # traced ones, strategy by strategy (the window's midpoint alone: 0.6–1.4 % more CO2e)
    assert [e["predicted"]["cost"]["co2e_g_per_iteration"] for e in doc["strategies"]] == pytest.approx(
        [e["predicted"]["cost"]["co2e_g_per_iteration"] for e in plans["carbon"]["strategies"]], rel=1e-4)
    assert all("priced_direct" not in p["search"]["energy"] for p in plans.values())  # auto: not written
    assert all("direct" not in e["predicted"]["cost"] for p in plans.values() for e in p["strategies"])
    assert "money and emissions per iteration" in out and "CO2e/iter" in out and "USD/iter" in out
    assert "Prices from the cluster spec" in out and "gpu_types" not in out and "PUE 1.4 (nodes[1])" in out
    assert "no embodied carbon" in out
    assert "--devices auto also prices" in out  # two GPU types, every device used: the hint


@pytest.mark.parametrize("spec,objective,field", [
    (PLAIN, "cost", "price_per_hour"), (PLAIN, "carbon", "carbon_g_per_kwh"),
])
def test_a_spec_without_prices_is_refused_in_one_line(run_cli, monkeypatch, spec, objective, field):
    import ampe.planning

    def no_search(*args, **kwargs):
        raise AssertionError("searched before refusing")

    monkeypatch.setattr(ampe.planning, "search", no_search)  # refused before any work
    code, _, err = run_cli("search", "--cluster", spec, *ARGS, "--objective", objective)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert str(spec) in err and field in err and f"--objective {objective}" in err


@pytest.mark.parametrize("path", [("--priced-direct",), ("--priced-path", "traced")])
@pytest.mark.parametrize("extra", [("--objective", "time"), ("--objective", "energy"),
                                   ("--objective", "cost", "--energy-planner", "global")])
def test_priced_direct_elsewhere_is_refused_in_one_line(run_cli, extra, path):
    code, _, err = run_cli("search", "--cluster", PRICED, *ARGS, *path, *extra)
    assert code == 2 and "--priced-path" in err and "--priced-direct" in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_a_partly_priced_spec_names_the_missing_node(run_cli, tmp_path):
    spec = tmp_path / "half.yaml"
    spec.write_text(PRICED.read_text().replace("price_per_hour: 0.12, electricity_per_kwh: 0.21,", ""))
    code, _, err = run_cli("search", "--cluster", spec, *ARGS, "--objective", "cost")
    assert code == 2 and "nodes[1].price_per_hour" in err and len(err.strip().splitlines()) == 1, err
    code, out, err = run_cli("search", "--cluster", spec, *ARGS, "--objective", "carbon")  # carbon has its figures
    assert code == 0, err
    assert "CO2e/iter" in out
