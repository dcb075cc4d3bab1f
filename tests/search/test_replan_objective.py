"""``ampe replan --objective``: the re-plan after a cluster change chooses by the objective (time, energy, edp, cost,
carbon) the search ranks by, defaults to the plan's own, says which it chose by, records it in the written plan,
and refuses an objective it cannot price. Oracle: brute force over the printed candidates (the least figure within
the slowdown bound, ties within 0.5 % to the smallest change) and over the written plan's priced entries."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import AMP_PROFILE, SPECS

MG = {"mg": 1e-3, "g": 1.0, "µg": 1e-6}


@pytest.fixture(scope="module")
def priced_plan(tmp_path_factory):
    """A time-ranked plan of gpt2-amp on AMP's heterogeneous cluster with prices (V100s on hydro power, the T4 node
    on the grid): its rank 1 is pp 8 × dp 2, so losing p3-1 leaves pp 6 candidates 0–23 % apart."""
    from ampe.cli import main

    plan = tmp_path_factory.mktemp("priced") / "plan.json"
    assert main(["search", "--cluster", str(SPECS / "amp-het-priced.yaml"), "--model", "gpt2-amp", "--profile",
                 str(AMP_PROFILE), "--global-batch", "32", "--top-k", "1", "--energy-planner", "none", "--out",
                 str(plan)]) == 0
    return plan


def _rows(out: str) -> list[tuple[bool, list[str]]]:
    """The candidates table's rows as (chosen, cells), whether drawn with box characters or plain (cells apart by
    two or more spaces)."""
    rows = []
    for line in out.splitlines():
        if not re.search(r"\d+/\d+/\d+ .*[+-][\d.]+%", line):
            continue
        cells = [c.strip() for c in re.split(r"[│┃]|\s{2,}", line) if c.strip()]
        chosen = cells[0] == "*"
        rows.append((chosen, cells[1:] if chosen else cells))
    return rows


def _candidates(out: str) -> list[dict]:
    """Rows of a re-plan's table under an objective other than time: how, pp/dp/tp, mbs, s/iter, vs before, the
    objective's figure, ranks moved, layers moved."""
    return [{"chosen": chosen, "how": c[0], "s": float(c[3]), "figure": c[5], "distance": int(c[6]) + int(c[7])}
            for chosen, c in _rows(out)]


def _grams(figure: str) -> float | None:
    if figure == "beyond bound":
        return None
    value, unit, _ = figure.split(" ", 2)
    return float(value) * MG[unit]


def _brute_force(rows: list[dict]) -> str:
    """The least figure within the bound; among those within 0.5 % of it, the smallest change, then the least."""
    priced = [(g, r) for r in rows if (g := _grams(r["figure"])) is not None]
    best = min(g for g, _ in priced)
    return min(((r["distance"], g, r["how"]) for g, r in priced if g <= best * 1.005))[2]


def test_carbon_chooses_another_candidate_than_time_and_the_plan_records_it(priced_plan, run_cli, tmp_path):
    out_plan = tmp_path / "carbon.json"
    code, out, err = run_cli("replan", "--plan", priced_plan, "--without", "p3-1", "--objective", "carbon",
                             "--max-slowdown", "40%", "--top-k", "4", "--out", out_plan)
    assert code == 0, err
    rows = _candidates(out)
    assert len(rows) >= 3 and sum(r["chosen"] for r in rows) == 1, out
    chosen = next(r for r in rows if r["chosen"])
    assert chosen["how"] == _brute_force(rows)
    assert "chosen by carbon (--objective): the least CO2e per iteration within" in out
    # by time the fastest wins (no other candidate is within 0.5 % of it): not the same candidate
    code, out_t, err = run_cli("replan", "--plan", priced_plan, "--without", "p3-1", "--objective", "time")
    assert code == 0, err
    by_time = next(r for r in _candidates_time(out_t) if r["chosen"])
    assert by_time["how"] == min(_candidates_time(out_t), key=lambda r: r["s"])["how"] != chosen["how"]
    assert "chosen by time (--objective)" in out_t
    # the written plan: the objective recorded, the chosen strategy first, and it emits the least CO2e of the four
    # it holds (priced by the plan writer, not the choice)
    doc = json.loads(out_plan.read_text())
    assert doc["inputs"]["objective"] == "carbon" and doc["search"]["replanned_from"]["objective"] == "carbon"
    assert doc["search"]["energy"]["objective"] == "carbon" and doc["search"]["energy"]["max_slowdown"] == 0.4
    entries = doc["strategies"]
    assert len(entries) == 4 and entries[0]["placement_name"] == chosen["how"]
    grams = [e["predicted"]["cost"]["co2e_g_per_iteration"] for e in entries]
    assert grams[0] == min(grams) and grams[0] == pytest.approx(_grams(chosen["figure"]), rel=1e-3)
    assert entries[0]["predicted"]["plan_time_s"] <= 1.4 * min(r["s"] for r in rows) * (1 + 1e-6)


def _candidates_time(out: str) -> list[dict]:
    """Rows of a time re-plan's table (no objective column)."""
    return [{"chosen": chosen, "how": c[0], "s": float(c[3])} for chosen, c in _rows(out)]


def test_the_default_objective_is_the_plans_own_else_time(priced_plan, run_cli, tmp_path):
    doc = json.loads(priced_plan.read_text())
    by_carbon = tmp_path / "by_carbon.json"
    by_carbon.write_text(json.dumps({**doc, "inputs": {**doc["inputs"], "objective": "carbon"}}))
    code, out, err = run_cli("replan", "--plan", by_carbon, "--without", "p3-1", "--max-slowdown", "40%")
    assert code == 0, err
    assert "chosen by carbon (the plan's objective)" in out
    assert next(r for r in _candidates(out) if r["chosen"])["how"] == _brute_force(_candidates(out))
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({**doc, "inputs": {k: v for k, v in doc["inputs"].items() if k != "objective"}}))
    code, out, err = run_cli("replan", "--plan", plain, "--without", "p3-1", "--energy-planner", "none")
    assert code == 0, err
    assert "chosen by time (the default): replan keeps the iteration time" in out


@pytest.mark.parametrize("flags, where, says", [
    (("--objective", "cost"), "local-cpu.yaml: price_per_hour:", "--objective cost needs it"),
    (("--objective", "carbon"), "local-cpu.yaml: carbon_g_per_kwh:", "--objective carbon needs it"),
    (("--objective", "energy", "--energy-planner", "none"), "--objective", "needs an energy planner"),
    (("--objective", "time", "--max-slowdown", "10%"), "--max-slowdown", "applies to --objective energy"),
])
def test_what_cannot_be_chosen_by_is_refused_in_one_line(run_cli, tmp_path, flags, where, says):
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--global-batch",
                           "8", "--top-k", "1", "--energy-planner", "none", "--out", plan)
    assert code == 0, err
    code, out, err = run_cli("replan", "--plan", plan, "--slow", "0=2", *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and where in err and says in err, err
    assert "candidates" not in out  # refused before any re-planning


def test_objective_flags_belong_to_a_cluster_change(run_cli, tmp_path):
    code, _, err = run_cli("replan", "--plan", tmp_path / "none.json", "--frozen-layers", "1", "--objective",
                           "energy")
    assert code == 2 and "--objective" in err and "only after a cluster change" in err, err


def test_a_time_replan_of_an_energy_plan_records_time(tmp_path, run_cli):
    """The old plan's energy choice is not copied into a re-plan chosen by time."""
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "amp-het-cluster.yaml", "--model", "gpt2-amp", "--profile",
                           AMP_PROFILE, "--global-batch", "32", "--top-k", "1", "--objective", "energy", "--out", plan)
    assert code == 0, err
    assert json.loads(plan.read_text())["search"]["energy"]["objective"] == "energy"
    out_plan = tmp_path / "re.json"
    code, _, err = run_cli("replan", "--plan", plan, "--without", "p3-1", "--objective", "time", "--out", out_plan)
    assert code == 0, err
    got = json.loads(out_plan.read_text())
    assert got["inputs"]["objective"] == "time" and got["search"]["energy"]["objective"] == "time"
    assert "bound_s" not in got["search"]["energy"]


def test_an_added_node_without_prices_is_refused_before_replanning(priced_plan, run_cli, tmp_path):
    add = tmp_path / "add.yaml"
    add.write_text("nodes:\n  - {name: extra, gpu: V100-16GB, count: 4, intra_gbps: 170, inter_gbps: 10}\n")
    code, out, err = run_cli("replan", "--plan", priced_plan, "--add", add, "--objective", "cost")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "add.yaml" in err and "price_per_hour" in err, err
    assert "candidates" not in out
