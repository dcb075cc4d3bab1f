"""``ampe profile`` on a Llama-family model: every layer under each recomputation, measured as the trial worker runs
it, with the attention kernel recorded; ``ampe search --profile`` then uses those rows, recomputation included, and
says so.

The profile is timed with the measuring thread's CPU time (``profiler.clock``), not wall time: two busy processes
beside the test slow the wall clock, not the work a layer does, so the comparisons of times below stay honest on a
loaded machine (the profiler runs torch on one thread)."""

from __future__ import annotations

import csv
import json
import time

import numpy as np
import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.profiling import profiler
from tests.conftest import ROOT

CPU_CLUSTER = ROOT / "tests" / "data" / "cpu_trials_quiet" / "local-cpu.yaml"
MODES = ("none", "selective", "full")


@pytest.fixture(scope="module")
def llama_profile(tmp_path_factory):
    from ampe.cli import main

    out = tmp_path_factory.mktemp("llama") / "profile.csv"
    mp = pytest.MonkeyPatch()
    mp.setattr(profiler, "clock", time.thread_time)
    try:
        assert main(["profile", "--model", "llama-tiny", "--device", "cpu", "--mbs", "1,2", "--warmup", "1",
                     "--repeats", "3", "--out", str(out)]) == 0
    finally:
        mp.undo()
    return out


def _rows(path):
    with path.open() as f:
        return list(csv.DictReader(f))


def test_every_layer_has_a_row_per_recompute_mode_with_its_attention(llama_profile):
    model = load_model("llama-tiny")
    rows = _rows(llama_profile)
    got = {(int(r["mbs"]), int(r["layer"]), r["recompute"]) for r in rows}
    assert got == {(m, i, mode) for m in (1, 2) for i in range(model.num_layers) for mode in MODES}
    assert len(rows) == len(got)
    assert {r["attention"] for r in rows} == {"eager"} and model.attention == "eager"  # llama-tiny: fp32, eager
    assert [r["layer_kind"] for r in rows if r["recompute"] == "none" and r["mbs"] == "1"] == \
        [layer.kind for layer in model.layers]


def test_recompute_rows_measure_what_the_worker_runs(llama_profile):
    model = load_model("llama-tiny")
    prof = load_profile(llama_profile)
    cfg = model.config
    for mbs in (1, 2):
        blocks = [i for i, layer in enumerate(model.layers) if layer.kind == "transformer"]
        none = [prof.recompute_sample("llama-tiny", "cpu", 1, i, mbs, "none") for i in blocks]
        sel = [prof.recompute_sample("llama-tiny", "cpu", 1, i, mbs, "selective") for i in blocks]
        full = [prof.recompute_sample("llama-tiny", "cpu", 1, i, mbs, "full") for i in blocks]
        # full: the checkpointed block keeps only its input (mbs·s·h fp32 elements) ...
        for f in full:
            assert f.memory_bytes == pytest.approx(mbs * cfg.seq_len * cfg.hidden * 4, rel=0.02)
        # ... and its backward re-runs its forward (CPU time: the sum over the blocks, medians of 3 repeats)
        extra = sum(f.backward_s for f in full) - sum(n.backward_s for n in none)
        assert extra >= 0.6 * sum(n.forward_s for n in none), (extra, [n.forward_s for n in none])
        # selective with eager attention drops the s² scores and probabilities: less kept than without
        for s, n in zip(sel, none, strict=True):
            assert s.memory_bytes < n.memory_bytes
            assert n.memory_bytes - s.memory_bytes >= mbs * cfg.heads * cfg.seq_len ** 2 * 4  # at least the probs
    # layers the modes leave alone run unchanged in the worker: their rows repeat the plain measurement
    for i, layer in enumerate(model.layers):
        if layer.kind != "transformer":
            plain = prof.recompute_sample("llama-tiny", "cpu", 1, i, 1, "none")
            for mode in MODES[1:]:
                assert prof.recompute_sample("llama-tiny", "cpu", 1, i, 1, mode) == plain


def test_the_cost_model_uses_the_measured_recompute_rows(llama_profile):
    model = load_model("llama-tiny")
    prof = load_profile(llama_profile)
    cm = CostModel(load_cluster(CPU_CLUSTER), model, prof)
    cpu = cm.cluster.devices[0].gpu
    for mode in MODES:
        lt = cm.layer_times(cpu, 1, 2, recompute=mode)
        acts = cm.layer_activations(cpu, 1, 2, mode)
        assert lt.source == "profile"
        for i in range(model.num_layers):
            s = prof.recompute_sample("llama-tiny", "cpu", 1, i, 2, mode)
            assert (lt.forward_s[i], lt.backward_s[i], acts[i]) == pytest.approx((s.forward_s, s.backward_s,
                                                                                  s.memory_bytes))


def test_search_with_the_profile_uses_it_and_says_so(llama_profile, tmp_path, run_cli):
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", CPU_CLUSTER, "--model", "llama-tiny", "--profile", llama_profile,
                             "--global-batch", "4", "--recompute", "full", "--energy-planner", "none",
                             "--out", plan)
    assert code == 0, err
    assert ("profile: 8 layers of llama-tiny on cpu (tp 1, mbs 1,2), eager attention, recompute none/selective/full "
            "measured") in out
    assert "warning" not in err
    strategies = json.loads(plan.read_text())["strategies"]
    assert strategies
    for s in strategies:
        want = "profile" if s["tp"] == 1 else "profile-tp1+roofline"
        assert s["predicted"]["compute_source"] == want
    # the plan's stage times are the measured full-recompute rows (pp 1, one device per replica at tp 1)
    best = next(s for s in strategies if s["tp"] == 1 and s["pp"] == 1)
    prof = load_profile(llama_profile)
    measured = sum(prof.recompute_sample("llama-tiny", "cpu", 1, i, best["mbs"], "full").forward_s
                   + prof.recompute_sample("llama-tiny", "cpu", 1, i, best["mbs"], "full").backward_s
                   for i in range(8))
    assert best["predicted"]["stage_times_s"] == pytest.approx([measured], rel=1e-6)


def test_rows_of_another_attention_kernel_are_not_used_silently(llama_profile, run_cli):
    code, out, err = run_cli("search", "--cluster", CPU_CLUSTER, "--model", "llama-tiny", "--attention", "flash",
                             "--profile", llama_profile, "--global-batch", "4", "--energy-planner", "none")
    assert code == 0, err
    assert "profile: no rows of llama-tiny with flash attention" in out and "roofline" in out
    assert "measured with eager attention are not used" in err
    model = load_model("llama-tiny", "flash")
    cm = CostModel(load_cluster(CPU_CLUSTER), model, load_profile(llama_profile))
    lt = cm.layer_times(cm.cluster.devices[0].gpu, 1, 1)
    assert lt.source == "roofline"
    assert not np.isnan(lt.forward_s).any()


def test_a_flash_profile_is_used_for_the_flash_model(llama_profile, tmp_path, run_cli):
    flash_csv = tmp_path / "flash.csv"
    code, _, err = run_cli("profile", "--model", "llama-tiny", "--attention", "flash", "--recompute", "none,full",
                           "--warmup", "0", "--repeats", "1", "--out", flash_csv)
    assert code == 0, err
    rows = _rows(flash_csv)
    assert {r["attention"] for r in rows} == {"flash"} and {r["recompute"] for r in rows} == {"none", "full"}
    # SDPA keeps no s² probabilities: a flash block keeps less than an eager one (about what selective keeps)
    eager = load_profile(llama_profile)
    flash = load_profile(flash_csv)
    e = eager.layer_memory("llama-tiny", "cpu", 1, 1, 1)
    f = flash.layer_memory("llama-tiny", "cpu", 1, 1, 1)
    assert f < e and f == pytest.approx(eager.recompute_sample("llama-tiny", "cpu", 1, 1, 1, "selective").memory_bytes,
                                        rel=0.05)
    # both kernels in one file: each model variant takes its own rows, and says which
    both = tmp_path / "both.csv"
    both.write_text(llama_profile.read_text() + "".join(flash_csv.read_text().splitlines(keepends=True)[1:]))
    code, out, err = run_cli("search", "--cluster", CPU_CLUSTER, "--model", "llama-tiny", "--attention", "flash",
                             "--profile", both, "--global-batch", "4", "--energy-planner", "none")
    assert code == 0, err
    assert ("profile: 8 layers of llama-tiny on cpu (tp 1, mbs 1), flash attention, recompute none/full measured"
            in out) and "(eager attention rows left out)" in out
    assert "not used" not in err  # a profile of both kernels is no mistake: no warning


@pytest.mark.parametrize("config, attention", [
    # Qwen2: Q/K/V biases, a tied LM head (its own copy of the embedding when profiled alone)
    ({"model_type": "qwen2", "_name_or_path": "tiny-qwen", "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 512, "num_hidden_layers": 2,
      "max_position_embeddings": 64, "tie_word_embeddings": True, "torch_dtype": "float32"}, "auto"),
    # Mistral: a sliding window narrower than the sequence (a band mask), through SDPA
    ({"model_type": "mistral", "_name_or_path": "tiny-mistral", "hidden_size": 64, "num_attention_heads": 4,
      "num_key_value_heads": 1, "intermediate_size": 128, "vocab_size": 512, "num_hidden_layers": 2,
      "max_position_embeddings": 64, "sliding_window": 16, "torch_dtype": "float32"}, "flash"),
])
def test_a_hugging_face_config_is_profiled_and_searched(tmp_path, run_cli, config, attention):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = tmp_path / "p.csv"
    code, _, err = run_cli("profile", "--model", path, "--attention", attention, "--recompute", "none,full",
                           "--warmup", "0", "--repeats", "1", "--out", out)
    assert code == 0, err
    model = load_model(str(path), None if attention == "auto" else attention)
    rows = _rows(out)
    assert {(int(r["layer"]), r["recompute"]) for r in rows} == {(i, m) for i in range(model.num_layers)
                                                                  for m in ("none", "full")}
    assert {r["model"] for r in rows} == {config["_name_or_path"]} and {r["attention"] for r in rows} == \
        {model.attention}
    code, stdout, err = run_cli("search", "--cluster", CPU_CLUSTER, "--model", path, "--attention", attention,
                                "--profile", out, "--global-batch", "2", "--energy-planner", "none")
    assert code == 0, err
    assert f"profile: {model.num_layers} layers of {model.name} on cpu (tp 1, mbs 1), {model.attention} attention" \
        in stdout
