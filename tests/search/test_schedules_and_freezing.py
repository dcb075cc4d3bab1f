"""Schedules as a search dimension (Tessel) and frozen-layer re-planning (FreezePipe)."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pipeline import blocking_eq5, eq5, simulate
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.search.engine import SearchOptions, search
from ampe.search.frozen_replan import replan_frozen
from tests.conftest import AMP_PROFILE, SPECS


def eight_a100():
    return cluster_from_dict({"name": "a100x8", "nodes": [
        {"name": "n", "gpu": "A100-80GB", "count": 8, "intra_gbps": 2400, "inter_gbps": 200}]})


def test_gpipe_keeps_more_activations_than_1f1b():
    cm = CostModel(eight_a100(), load_model("gpt2-medium"))
    base = dict(pp=4, dp=2, tp=1, mbs=2, gbs=64)  # gas = 16 > pp
    f1 = cm.estimate(Strategy(**base, schedule="1f1b"))
    gp = cm.estimate(Strategy(**base, schedule="gpipe"))
    for j in range(4):
        assert gp.memory_bytes_per_stage[j] > f1.memory_bytes_per_stage[j]
    # with the same stage times, both schedules have the same fill/drain bubble; DeepSpeed's 1F1B also holds each
    # stage for the transfers on both of its sides in the steady state (AMP's Eq. 5 for GPipe hides them)
    t = [f + b for f, b in zip(f1.fwd_s[0], f1.bwd_s[0], strict=True)]
    e = [2 * x for x in f1.p2p_s[0]]
    assert f1.pipeline_s[0] == pytest.approx(blocking_eq5(t, e, 16))
    assert gp.pipeline_s[0] == pytest.approx(eq5(t, e, 16))
    assert gp.iteration_s < f1.iteration_s <= gp.iteration_s + 15 * 2 * max(e) * (1 + 1e-9)


def test_interleaved_shrinks_the_bubble_as_its_dag_predicts():
    # gpt2-large: gpt2-medium's LM head (an unaligned 50,257-column GEMM) outweighs its chunks' bubble gain
    cm = CostModel(eight_a100(), load_model("gpt2-large"))
    plain = cm.estimate(Strategy(pp=4, dp=2, tp=1, mbs=1, gbs=32, schedule="1f1b"), method="simulate")
    inter = cm.estimate(Strategy(pp=4, dp=2, tp=1, mbs=1, gbs=32, schedule="interleaved", virtual_stages=2),
                        method="simulate")
    assert inter.pipeline_s[0] < plain.pipeline_s[0]
    # the bubble shrinks by the number of chunks: compare with a DAG simulation of ideal equal chunks
    r = 0
    f, b = inter.fwd_s[r], inter.bwd_s[r]
    zero = [0.0] * (len(f) - 1)
    ideal = simulate(f, b, zero, zero, 16, "interleaved", 2).makespan_s
    assert inter.pipeline_s[0] >= ideal - 1e-12  # transfers only add
    eq = cm.estimate(Strategy(pp=4, dp=2, tp=1, mbs=1, gbs=32, schedule="interleaved", virtual_stages=2))
    assert eq.pipeline_s[0] == pytest.approx(inter.pipeline_s[0], rel=0.1)  # closed form tracks the DAG (±10%)


def test_search_picks_the_schedule_its_cost_model_predicts_fastest():
    cluster, model = eight_a100(), load_model("gpt2-medium")
    per_schedule = {}
    for sched in ("1f1b", "gpipe", "interleaved"):
        res = search(cluster, model, None, SearchOptions(gbs=32, schedules=(sched,), local_search=0))
        per_schedule[sched] = res.ranked[0].estimate.iteration_s
    both = search(cluster, model, None, SearchOptions(gbs=32, schedules=("1f1b", "gpipe", "interleaved"),
                                                      local_search=0))
    best = both.ranked[0]
    assert best.estimate.iteration_s == pytest.approx(min(per_schedule.values()))
    fastest = min(per_schedule, key=lambda k: (per_schedule[k], {"1f1b": 0, "interleaved": 1, "gpipe": 2}[k]))
    assert best.strategy.schedule == fastest
    assert {c.strategy.schedule for c in both.ranked} >= {"1f1b", "gpipe", "interleaved"}


def test_plan_says_when_deepspeed_cannot_run_a_schedule(run_cli, tmp_path):
    plan = tmp_path / "p.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "mixed-a100-a40.yaml", "--model", "gpt2-medium",
                           "--schedules", "1f1b,gpipe,interleaved", "--top-k", "40", "--out", plan,
                           "--energy-planner", "none")  # the runtime notes are the search's (energy: test_caveats)
    assert code == 0, err
    entries = json.loads(plan.read_text())["strategies"]
    for e in entries:
        # GPT-2's 50,257-word vocabulary splits over no tp > 1: those strategies are costed but not runnable either
        assert e["runtime"]["deepspeed"] == (e["schedule"] == "1f1b" and e["tp"] == 1)
        if e["schedule"] != "1f1b":
            assert "DeepSpeed" in e["runtime"]["note"]
            assert "not_runnable" in [c["kind"] for c in e["caveats"]]
        if e["tp"] > 1:
            assert f"tp={e['tp']} does not divide the model's vocabulary (50257)" in e["runtime"]["note"]
    clean = [not e.get("caveats") for e in entries]
    assert clean[0] and clean == sorted(clean, reverse=True)  # a caveated strategy never ranks before a clean one
    # asked for alone, a schedule stock DeepSpeed cannot run is still planned and costed, and marked
    code, _, err = run_cli("search", "--cluster", SPECS / "mixed-a100-a40.yaml", "--model", "gpt2-medium",
                           "--schedules", "gpipe", "--top-k", "3", "--out", plan, "--energy-planner", "none")
    assert code == 0, err
    entries = json.loads(plan.read_text())["strategies"]
    assert entries and all(e["schedule"] == "gpipe" and "not_runnable" in [c["kind"] for c in e["caveats"]]
                           for e in entries)


def test_interleaved_strategies_carry_one_frequency_list_per_device_stage(run_cli, tmp_path):
    # The interleaved schedule's frequency plan has one list per device stage, holding every chunk's instructions in
    # execution order (the plan's reader once wanted pp x chunks lists and refused the plan it had just made).
    plan = tmp_path / "p.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "mixed-h100-a100.yaml", "--model", "gpt3-1.3b",
                           "--global-batch", "64", "--schedules", "interleaved", "--out", plan)
    assert code == 0, err
    inter = [e for e in json.loads(plan.read_text())["strategies"] if e["schedule"] == "interleaved"]
    assert inter
    for e in inter:
        stages = e["frequency_plan"]["stages"]
        assert len(stages) == e["pp"]
        assert all(len(lst) == 2 * e["gas"] * e["virtual_stages"] for lst in stages)


def test_freezing_moves_layers_toward_the_frozen_side_and_cuts_iteration_time():
    cluster = load_cluster(SPECS / "amp-homogeneous.yaml")
    model = load_model("gpt2-amp")
    from ampe.costmodel.profile import load_profile

    cm = CostModel(cluster, model, load_profile(AMP_PROFILE))
    old = search(cluster, model, cm.profile, SearchOptions(gbs=32, local_search=0)).ranked
    old = next(c for c in old if c.strategy.pp >= 4).strategy
    r = replan_frozen(cm, old, frozen_layers=14)
    assert r.repartitioned is not None
    assert r.repartitioned.iteration_s < r.keep.iteration_s
    new_first = r.repartitioned.strategy.partition[1]
    assert new_first > old.partition[1]  # the first stage (all frozen) takes more layers
    # and freezing by itself helps even with the old partition
    assert r.keep.iteration_s < cm.estimate(old).iteration_s


def test_replan_cli(run_cli, tmp_path):
    plan = tmp_path / "p.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "amp-het-cluster.yaml", "--model", "gpt2-amp",
                           "--profile", AMP_PROFILE, "--top-k", "2", "--out", plan)
    assert code == 0, err
    code, out, err = run_cli("replan", "--plan", plan, "--frozen-layers", "10")
    assert code == 0, err
    assert "re-partitioned" in out and "gain" in out
    code, _, err = run_cli("replan", "--plan", plan, "--frozen-layers", "99")
    assert code == 2 and "--frozen-layers" in err
    # --search --out: the best of the re-searched, re-partitioned and old strategies comes first, with clocks
    out_plan = tmp_path / "frozen.json"
    code, _, err = run_cli("replan", "--plan", plan, "--frozen-layers", "10", "--search", "--out", out_plan)
    assert code == 0, err
    doc = json.loads(out_plan.read_text())
    names = [e["placement_name"] for e in doc["strategies"]]
    times = [e["predicted"]["plan_time_s"] for e in doc["strategies"]]
    assert "re-searched" in names and times == sorted(times) and doc["frozen_layers"] == 10
    assert all("energy_j" in e["predicted"] and "frequency_plan" in e for e in doc["strategies"])
    # its clocks are planned here by time: none of the old search's energy figures (evaluated, bound, seconds) stay
    assert doc["search"]["energy"] == {"objective": "time", "planner": "perseus"}
    assert doc["search"]["replanned_from"]["rank"] == 1
