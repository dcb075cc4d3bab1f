"""The search with memory options (recomputation, ZeRO-1): the Perseus A40 configurations are found; defaults and
advice that fit the model (default global batch, stages without a block, what to do when nothing fits)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.zoo import load_model
from ampe.search.defaults import default_global_batch, stages_without_blocks, states_exceed_cluster
from ampe.search.engine import SearchOptions, memory_options, search

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


def a40s(n: int, per_node: int = 1):
    return cluster_from_dict({"name": f"a40x{n}", "nodes": [{"name": "a40", "gpu": "A40", "count": per_node,
                                                             "intra_gbps": 200, "inter_gbps": 100,
                                                             "repeat": n // per_node}]})


def test_memory_options_order():
    every = ("none", "selective", "full")
    assert memory_options("eager", 1) == [(every, 0)]
    assert memory_options("eager", 2) == [(every, 0), (every, 1)]
    assert memory_options("flash", 2, zero=(0,)) == [(("none", "full"), 0)]  # selective changes nothing
    assert memory_options("eager", 4, recompute=("none",), zero=(1,)) == [(("none",), 1)]
    assert memory_options("flash", 2, recompute=("selective",)) == []  # nothing left to try


def test_selective_alone_with_flash_attention_is_one_line_exit_2(run_cli):
    code, _, err = run_cli("search", "--cluster", Path(__file__).resolve().parents[2] / "cluster_specs" /
                           "local-cpu.yaml", "--model", "gpt2-tiny", "--attention", "flash", "--recompute", "selective")
    assert code == 2 and "--recompute" in err and "FlashAttention" in err and len(err.strip().splitlines()) == 1


def test_search_finds_the_perseus_gpt3_2_7b_pipeline(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", SPECS / "perseus-a40-8.yaml", "--model", "gpt3-2.7b", "--pp", "8",
                             "--global-batch", "1024", "--energy-planner", "none", "--top-k", "20", "--out", plan)
    assert code == 0, err
    doc = json.loads(plan.read_text())
    entries = doc["strategies"]
    assert all(e["pp"] == 8 for e in entries)
    perseus = [e for e in entries if e["mbs"] == 4]  # Perseus: mbs 4, 256 micro-batches
    assert perseus and perseus[0]["gas"] == 256 and perseus[0]["recompute"] in ("selective", "full")
    assert perseus[0]["predicted"]["max_memory_bytes"] <= 48 * 2**30
    assert perseus[0]["deepspeed"]["activation_checkpointing"]["partition_activations"] is False
    assert "recompute" in out  # the table's memory-options column
    breakdown = perseus[0]["predicted"]["memory_breakdown"]
    assert len(breakdown) == 8 and all(b["total"] <= 48 * 2**30 for b in breakdown)
    # recomputation per stage: the first stage (7 micro-batches in flight) recomputes, the last (1) does not
    per = perseus[0]["stage_recompute"]
    assert len(per) == 8 and per[0] != "none" and per[-1] == "none" and perseus[0]["recompute"] == per[0]
    # the plan format carries the list; readers check it
    from ampe.errors import InputError
    from ampe.formats.plan import PlanFile
    from tests.support.plans import validate_plan

    assert PlanFile.parse(doc, str(plan)).to_json() == doc
    bad = json.loads(plan.read_text())
    bad["strategies"][entries.index(perseus[0])]["stage_recompute"] = per[:3]
    with pytest.raises(InputError, match="stage_recompute"):
        validate_plan(bad, "p.json")
    bad["strategies"][entries.index(perseus[0])]["stage_recompute"] = ["none"] * 8
    with pytest.raises(InputError, match="recompute"):
        validate_plan(bad, "p.json")


def test_search_finds_the_perseus_gpt3_6_7b_3d_configuration(run_cli, tmp_path):
    # `ampe search --pp 4` lists Perseus's dp 2 · pp 4 · tp 2 at mbs 4 among its top 16, and `ampe evaluate` finds
    # that entry feasible. (Its fastest pp-4 strategy is dp 4 · tp 1 at mbs 1: docs/cost_model.md. Perseus's mbs 4
    # ranks 11th: the GEMMs are already large at mbs 1, and mbs 4 needs selective recomputation, which re-runs eager
    # attention's memory-bound s² passes.)
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", SPECS / "perseus-a40-16.yaml", "--model", "gpt3-6.7b", "--pp",
                             "4", "--global-batch", "1024", "--energy-planner", "none", "--top-k", "16", "--out", plan)
    assert code == 0, err
    entries = json.loads(plan.read_text())["strategies"]
    assert len(entries) == 16 and all(e["pp"] == 4 for e in entries)
    assert "4/2/2" in out and "4/4/1" in out  # the printed table
    perseus = [e for e in entries if (e["dp"], e["tp"], e["mbs"]) == (2, 2, 4)]
    assert perseus, [(e["dp"], e["tp"], e["mbs"]) for e in entries]
    best = perseus[0]
    assert best["gas"] == 128 and best["predicted"]["fits"]
    assert best["recompute"] != "none" or best.get("zero") == 1
    assert all(b["total"] <= 48 * 2**30 for b in best["predicted"]["memory_breakdown"])
    strategy = tmp_path / "perseus.json"
    strategy.write_text(json.dumps(best))
    code, _, err = run_cli("evaluate", "--cluster", SPECS / "perseus-a40-16.yaml", "--model", "gpt3-6.7b",
                             "--strategy", strategy, "--json", tmp_path / "eval.json")
    assert code == 0, err
    (result,) = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert result["fits"] and result["strategy"].get("stage_recompute") == best.get("stage_recompute")
    # without any memory option it does not fit
    cluster, model = load_cluster(SPECS / "perseus-a40-16.yaml"), load_model("gpt3-6.7b")
    plain = search(cluster, model, None, SearchOptions(gbs=1024, mbs_choices=(4,), local_search=0,
                                                        recompute=("none",), zero=(0,)))
    assert not [c for c in plain.ranked if (c.strategy.pp, c.strategy.dp, c.strategy.tp) == (4, 2, 2)]


def test_search_chooses_recomputation_per_stage():
    # GPT-3 2.7B on 4 × A40 at mbs 4 with recompute none or full: at pp 4, stage 0 keeps 4 micro-batches in
    # flight, and one block alone would keep 4 × s·b·h·(34 + 5·a·s/h) = 13.6 GB there: its 8 or so blocks must
    # recompute; the last stage keeps one micro-batch and has room for its blocks without recomputation. (At mbs 16
    # nothing fits at pp 4 once a block's backward working set — the 16 samples' s² score gradient, 4.3 GB — is
    # counted.)
    from dataclasses import replace

    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.strategy import Strategy
    from ampe.dp_assign import StageOption, brute_force, solve
    from ampe.search.engine import stage_costs

    cluster, model = a40s(4, 4), load_model("gpt3-2.7b")
    opts = SearchOptions(gbs=256, mbs_choices=(4,), local_search=0, recompute=("none", "full"))
    found = [c for c in search(cluster, model, None, opts).ranked if c.strategy.pp == 4]
    assert found
    s = found[0].strategy
    assert s.stage_recompute is not None and s.stage_recompute[0] == "full" and s.stage_recompute[-1] == "none"
    assert found[0].estimate.fits
    # cheaper than recomputing every stage on the same partition
    cm = CostModel(cluster, model)
    assert found[0].estimate.iteration_s < cm.estimate(replace(s, recompute="full", stage_recompute=None)).iteration_s
    # the DP over per-stage options on the real tables equals brute force over every partition
    base = Strategy(4, 1, 1, 4, 256, placement=s.placement)
    none, full = stage_costs(cm, base), stage_costs(cm, replace(base, recompute="full"))
    costs = replace(none, options=(StageOption(full.time_prefix, memory=full.memory),))
    best, brute = solve(costs, "full").best, brute_force(costs, "full")[0]
    assert best is not None and best.full_s == pytest.approx(brute.full_s, rel=1e-12)
    assert best.options[0] == 1 and best.options[-1] == 0


def test_default_global_batch_follows_tokens_per_batch():
    big = load_cluster(SPECS / "perseus-a40-16.yaml")
    gbs, why = default_global_batch(load_model("gpt3-6.7b"), big)
    assert gbs == 256 and "2M tokens" in why  # 2M tokens / 2048 = 1024, capped at 16 per device on 16 devices
    gbs, _ = default_global_batch(load_model("gpt3-1.3b"), a40s(64, 4))
    assert gbs == 512  # 1M tokens / 2048; under the cap of 16 × 64
    gbs, why = default_global_batch(load_model("gpt2-tiny"), a40s(4))
    assert gbs == 32 and "under" in why
    gbs, _ = default_global_batch(load_model("gpt2-tiny"), a40s(64, 4))
    assert gbs == 64  # at least one sample per device


def test_stages_without_blocks():
    m = load_model("gpt3-2.7b")  # 0 embed, 1 noop, 2..33 blocks, 34 noop, 35 norm, 36 logits, 37 noop
    assert stages_without_blocks(m, (0, 5, 34, 38)) == [2]
    assert stages_without_blocks(m, (0, 1, 30, 38)) == [0]
    assert stages_without_blocks(m, (0, 20, 38)) == []


def test_cli_prints_the_default_global_batch_and_warns_of_empty_stages(run_cli, tmp_path):
    spec = tmp_path / "a.yaml"
    spec.write_text("name: a\nnodes:\n  - {name: a40, gpu: A40, count: 4, intra_gbps: 200, inter_gbps: 100}\n")
    code, out, err = run_cli("search", "--cluster", spec, "--model", "gpt3-1.3b", "--energy-planner", "none",
                             "--top-k", "3")
    assert code == 0, err
    assert "global batch: 64 samples" in out  # 1M tokens / 2048 = 512, capped at 16 × 4 devices
    strategy = tmp_path / "s.json"
    strategy.write_text(json.dumps({"pp": 4, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8, "partition": [0, 1, 2, 27, 30]}))
    code, out, err = run_cli("evaluate", "--cluster", spec, "--model", "gpt3-1.3b", "--strategy", strategy)
    assert code == 0, err
    assert "stages 0, 1, 3 hold no transformer block" in err  # 24 blocks: layers 2..25
    assert "weights+grads+optimizer" in out and "recompute" in out  # the memory breakdown table


def test_advice_names_the_memory_options_that_would_fit(run_cli, tmp_path):
    spec = tmp_path / "a.yaml"
    spec.write_text("name: a\nnodes:\n  - {name: a40, gpu: A40, count: 1, intra_gbps: 200, inter_gbps: 100, "
                    "repeat: 4}\n")
    code, _, err = run_cli("search", "--cluster", spec, "--model", "llama-3.1-8b", "--global-batch", "16",
                           "--recompute", "none", "--zero", "0", "--energy-planner", "none")
    assert code == 2
    assert "no strategy fits in memory" in err and "would fit with --recompute none,selective,full" in err
    assert re.search(r"e\.g\. .*recompute=(full|selective)", err) and len(err.strip().splitlines()) == 1


def test_advice_says_when_the_model_states_alone_exceed_the_cluster(run_cli):
    cluster = load_cluster(SPECS / "perseus-a40-8.yaml")
    exceed, why = states_exceed_cluster(load_model("llama-3.1-70b"), cluster)
    assert exceed and "1182.7 GiB" in why  # 70.55e9 parameters × 18 bytes (bf16: BF16_Optimizer)
    assert not states_exceed_cluster(load_model("gpt3-6.7b"), cluster)[0]
    code, _, err = run_cli("search", "--cluster", SPECS / "perseus-a40-8.yaml", "--model", "llama-3.1-70b",
                           "--energy-planner", "none")
    assert code == 2 and "model states alone" in err and "exceed" in err


@pytest.mark.parametrize("flags", [("--recompute", "most"), ("--zero", "2")])
def test_bad_memory_option_flags_are_one_line_errors(run_cli, flags):
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny", *flags)
    assert code == 2 and flags[0] in err
