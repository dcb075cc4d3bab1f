"""Issue 33's acceptance on this machine's CPUs: ``ampe profile --model llama-tiny --tp 2 --device cpu`` writes tp-2
rows (every layer, each shard measured with its all-reduces), ``ampe search`` ranks tp-2 Llama strategies as
runnable, and ``ampe trial`` runs one to ``ok`` (torchrun, gloo, DeepSpeed), its memory within 10 % of the plan."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.io import read_json

pytest.importorskip("deepspeed")

MODEL = "llama-tiny"


@pytest.mark.trial
def test_profile_search_and_trial_a_tp2_llama_plan(tmp_path, run_cli):
    from conftest import SPECS  # tests/conftest.py

    model = load_model(MODEL)
    profile = tmp_path / "profile.csv"
    code, _, err = run_cli("profile", "--model", MODEL, "--device", "cpu", "--tp", "1,2", "--mbs", "2",
                           "--recompute", "none", "--warmup", "0", "--repeats", "1", "--out", profile)
    assert code == 0, err
    prof = load_profile(profile)
    assert all(prof.covers(MODEL, "cpu", tp, model.num_layers) for tp in (1, 2))
    block = model.layers[1]
    mask = CATALOG["cpu"].mask_bytes(model.bytes_per_elem)
    for tp in (1, 2):  # each shard keeps its share of the block's activations, as the model counts them
        assert prof.layer_memory(MODEL, "cpu", tp, 1, 2) == pytest.approx(2 * block.act_bytes(tp, mask), rel=1e-3)

    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", SPECS / "local-cpu.yaml", "--model", MODEL, "--profile", profile,
                           "--global-batch", "4", "--pp", "1", "--top-k", "20", "--energy-planner", "none",
                           "--out", plan)
    assert code == 0, err
    doc = read_json(plan)
    tp2 = [e for e in doc["strategies"] if e["tp"] == 2]
    assert tp2 and all(e["runtime"]["deepspeed"] for e in doc["strategies"])
    doc["strategies"] = [{**tp2[0], "rank": 1}]  # trial the best tp-2 strategy
    only = tmp_path / "tp2.json"
    only.write_text(json.dumps(doc))

    results = tmp_path / "trials"
    code, _, err = run_cli("trial", "--plan", only, "--top-k", "1", "--warmup", "2", "--iters", "1", "--timeout",
                           "300", "--out", results, "--progress", "none", "--freq-backend", "none")
    assert code == 0, err
    (line,) = [json.loads(x) for x in (results / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "ok", line.get("reason")
    assert line["strategy"]["tp"] == 2 and len(line["peak_memory_bytes_per_rank"]) == 2
    # the record's prediction is the footprint; the trace counts tensors: on the CPU type the footprint is the
    # allocated peak plus the process's context (no workspaces, no allocator fragmentation)
    cpu = CATALOG["cpu"]
    assert cpu.workspace_bytes == 0 and cpu.fragmentation == 0
    predicted = line["predicted_max_memory_bytes"] - cpu.context_bytes
    assert max(line["peak_memory_bytes_per_rank"]) == pytest.approx(predicted, rel=0.10)
