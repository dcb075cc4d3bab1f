"""A strategy's caveats (issue 32 item 2, issue 33 item 5): one type (``ampe.formats.plan.Caveat``) for memory at risk
and not runnable, shown in the plan, the search table and trial records, and every strategy with one ranked after
every strategy without — under the time objective with and without the energy planner.

The at-risk case is the H200 record (Llama-3.2-1B, seq 4096, flash, one H200) with a cluster spec that asks a wide
reserve (45 % of the device): mbs 4 and 8 are faster but leave less than the reserve free, mbs 2 fits with
margin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.formats.plan import Caveat, plan_from_json
from ampe.planning import PlanRequest, make_plan
from ampe.search.engine import SearchOptions

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "tests" / "data" / "h200" / "gpu_check"
SPECS = ROOT / "cluster_specs"


def _h200(reserve: float):
    spec = {"name": "one-H200", "nodes": [{"name": "node0", "gpu": "H200", "count": 1, "intra_gbps": 3600,
                                           "inter_gbps": 100}], "gpu_types": {"H200": {"memory_reserve": reserve}}}
    return cluster_from_dict(spec), load_model(str(H200 / "s4096.yaml"), "flash"), \
        load_profile(H200 / "profile_s4096.csv", known_devices=["H200"])


def test_a_footprint_within_the_reserve_is_at_risk_not_out_of_memory():
    cluster, model, profile = _h200(0.45)
    cm = CostModel(cluster, model, profile)
    mbs2, mbs4 = (cm.estimate(Strategy(1, 1, 1, mbs, 8, expandable_segments=False)) for mbs in (2, 4))
    capacity = cluster.devices[0].gpu.memory_bytes
    assert mbs2.fits and mbs2.memory_risk is None and not mbs2.caveats
    assert 0.45 * capacity > capacity - mbs4.max_memory_bytes > 0  # within capacity, not within the reserve
    assert not mbs4.fits and mbs4.within_capacity and mbs4.oom_reason is None
    assert mbs4.caveats == (Caveat(kind="memory_at_risk", note=mbs4.memory_risk),)
    assert "device 0 (node0-0)" in mbs4.memory_risk and "reserve of 62.55 GiB (45 %)" in mbs4.memory_risk


@pytest.mark.parametrize("planner", ["none", "perseus"])
def test_at_risk_strategies_rank_after_those_that_fit(planner):
    cluster, model, profile = _h200(0.45)
    opts = SearchOptions(gbs=8, top_k=3, recompute=("none",), zero=(0,), expandable_segments=False)
    made = make_plan(cluster, model, profile, PlanRequest(search=opts, energy_planner=planner))
    entries = made.plan.strategies
    risky = [e for e in entries if e.caveats]
    assert [e.mbs for e in entries if not e.caveats] == [2, 1] and all(e.mbs in (4, 8) for e in risky)
    assert risky and entries[:2] == [e for e in entries if not e.caveats]  # those that fit rank first
    assert max(e.predicted.iteration_s for e in risky) < entries[0].predicted.iteration_s  # though slower
    assert all(not e.predicted.fits and [c.kind for c in e.caveats] == ["memory_at_risk"] for e in risky)
    doc = made.plan.to_json()
    assert doc["strategies"][2]["caveats"][0]["kind"] == "memory_at_risk" and "caveats" not in doc["strategies"][0]
    assert plan_from_json(json.loads(json.dumps(doc)), "plan").strategies[2].caveats == entries[2].caveats
    assert all(e.expandable_segments is False for e in entries)


def test_strategies_the_runtime_cannot_run_rank_after_runnable_ones():
    """GPipe is costed but stock DeepSpeed runs only 1F1B: every GPipe strategy carries a not_runnable caveat and
    ranks after every 1F1B one, whatever their times."""
    cluster = load_cluster(SPECS / "local-cpu-4.yaml")
    opts = SearchOptions(gbs=8, top_k=50, schedules=("1f1b", "gpipe"), local_search=0)
    entries = make_plan(cluster, load_model("gpt2-tiny"), None,
                        PlanRequest(search=opts, energy_planner="none")).plan.strategies
    kinds = [[c.kind for c in e.caveats] for e in entries]
    gpipe = [e.schedule == "gpipe" for e in entries]
    assert any(gpipe) and not all(gpipe)
    assert all((k == ["not_runnable"]) == g for k, g in zip(kinds, gpipe, strict=True))
    first_gpipe = gpipe.index(True)
    assert not any(gpipe[:first_gpipe]) and all(gpipe[first_gpipe:])
    assert "1F1B" in entries[first_gpipe].caveats[0].note


def test_the_search_table_marks_and_explains_caveats(run_cli, tmp_path):
    spec = tmp_path / "h200.yaml"
    spec.write_text("name: one-H200\nnodes:\n  - {name: node0, gpu: H200, count: 1, intra_gbps: 3600, "
                    "inter_gbps: 100}\ngpu_types:\n  H200: {memory_reserve: 0.45}\n")
    out_plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", spec, "--model", H200 / "s4096.yaml", "--profile",
                             H200 / "profile_s4096.csv", "--attention", "flash", "--recompute", "none", "--zero", "0",
                             "--global-batch", "8", "--top-k", "3", "--energy-planner", "none", "--out", out_plan)
    assert code == 0, err
    assert "caveats" in out and "at risk (ranked after every strategy without a caveat)" in out
    assert "expandable_segments True" in out  # the default on a cluster with GPUs
    plan = json.loads(out_plan.read_text())
    assert all(e["expandable_segments"] is True for e in plan["strategies"])
    assert plan["strategies"][0]["mbs"] == 2 and plan["strategies"][2]["caveats"][0]["kind"] == "memory_at_risk"


def test_a_cpu_cluster_leaves_the_allocator_unset_unless_asked(run_cli, tmp_path):
    for flag, want in ((None, None), ("off", False), ("on", True)):
        out_plan = tmp_path / f"{flag}.json"
        code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", "--top-k", "2",
                               "--energy-planner", "none", "--out", out_plan,
                               *(("--expandable-segments", flag) if flag else ()))
        assert code == 0, err
        assert {e.get("expandable_segments") for e in json.loads(out_plan.read_text())["strategies"]} == {want}
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny",
                           "--expandable-segments", "maybe")
    assert code == 2 and "--expandable-segments" in err
