"""Real CPU DeepSpeed trials (torchrun, gloo, world size 2, gpt2-tiny and llama-tiny, fp32; gpt2-tiny also bf16)
with activation recomputation, ZeRO-1 and mixed precision: each rank's measured tensor peak against the cost model's
memory (within 10 %). Times are compared in benchmarks/memory_options_cpu.py, not asserted here."""

from __future__ import annotations

import pytest

from ampe.costmodel.zoo import load_model
from tests.support.worker_runs import predicted, run_trial

GPT2_PP2 = {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "partition": [0, 4, load_model("gpt2-tiny").num_layers]}


@pytest.fixture(scope="module")
def gpt2_pp2_plain(tmp_path_factory) -> list[dict]:
    """Every rank's report of one fp32 gpt2-tiny pp 2 trial without memory options: the reference that the
    recomputation and bf16 runs below are compared with (run once for the module)."""
    return run_trial(tmp_path_factory.mktemp("plain"), GPT2_PP2)


@pytest.mark.trial
@pytest.mark.parametrize("model", ["gpt2-tiny", "llama-tiny"])
def test_zero1_trial_memory_matches_the_model(tmp_path, model):
    strategy = {"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 8, "zero": 1}
    ranks = run_trial(tmp_path, strategy, model)
    # DeepSpeed's ZeRO-1 optimizer: fp32 copy of the rank's half, its Adam m and v, the reduction buckets
    for r, want in zip(ranks, predicted(strategy, model), strict=True):
        assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10)


@pytest.mark.trial
def test_full_recompute_trial_memory_against_the_model(tmp_path, gpt2_pp2_plain):
    model, base = "gpt2-tiny", GPT2_PP2
    full = {**base, "recompute": "full"}
    plain_ranks, full_ranks = gpt2_pp2_plain, run_trial(tmp_path, full, model)
    for ranks, strategy in ((plain_ranks, base), (full_ranks, full)):
        for r, want in zip(ranks, predicted(strategy, model), strict=True):
            assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10)
    # recomputation keeps less on the stage with two micro-batches in flight (times: benchmarks, not asserted here)
    assert full_ranks[0]["peak_memory_bytes"] < plain_ranks[0]["peak_memory_bytes"]
    # per stage: only stage 0 (two micro-batches in flight) recomputes; each rank builds and checkpoints its own
    mixed = {**base, "stage_recompute": ["full", "none"]}
    (tmp_path / "mixed").mkdir()
    mixed_ranks = run_trial(tmp_path / "mixed", mixed, model)
    for r, want in zip(mixed_ranks, predicted(mixed, model), strict=True):
        assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10)
    # stage 0 recomputed, stage 1 did not: the model's per-stage figures say so exactly; the measured peaks (each
    # within 10 % above) move by a few % with p2p timing under load, so they are compared only where far apart
    assert predicted(mixed, model) == [predicted(full, model)[0], predicted(base, model)[1]]
    assert mixed_ranks[0]["peak_memory_bytes"] < plain_ranks[0]["peak_memory_bytes"]


@pytest.mark.trial
def test_selective_recompute_trial_memory_against_the_model(tmp_path, gpt2_pp2_plain):
    """Selective recomputation (core attention re-run in backward) on stage 0 only: its blocks keep no scores,
    softmax or dropout mask, the other stage keeps everything; both within 10 % of the model."""
    model, base = "gpt2-tiny", GPT2_PP2
    selective = {**base, "recompute": "selective", "stage_recompute": ["selective", "none"]}
    plain, sel = gpt2_pp2_plain, run_trial(tmp_path, selective, model)
    for ranks, strategy in ((plain, base), (sel, selective)):
        for r, want in zip(ranks, predicted(strategy, model), strict=True):
            assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10), (strategy, r["rank"])
    assert sel[0]["peak_memory_bytes"] < plain[0]["peak_memory_bytes"]
    assert predicted(selective, model)[1] == predicted(base, model)[1]  # stage 1 keeps everything


@pytest.mark.trial
def test_bf16_mixed_precision_trial_memory_matches_the_model(tmp_path, gpt2_pp2_plain):
    """bf16 weights and gradients with DeepSpeed's fp32 master weights and Adam states (16 bytes per parameter) and
    bf16 activations: each rank's measured peak within 10 % of the model, and below the fp32 run's."""
    base = GPT2_PP2
    half, full = run_trial(tmp_path, base, dtype="bf16"), gpt2_pp2_plain
    for r, want in zip(half, predicted(base, dtype="bf16"), strict=True):
        assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10)
    assert all(h["peak_memory_bytes"] < f["peak_memory_bytes"] for h, f in zip(half, full, strict=True))


@pytest.mark.trial
@pytest.mark.parametrize("attention", ["eager", "flash"])
def test_llama_attention_and_recompute_run_as_planned_and_match_the_memory_model(tmp_path, attention):
    """Issue 24: the kernel the plan names is the kernel that runs. llama-tiny (GQA 4:2), pp 2, for each attention
    kernel: no recomputation, selective on stage 0 only, and full — each rank's peak within 10 % of the model, the
    worker's record naming the kernel torch ran (SDPA's CPU flash kernel, or the written-out form) and the plan's
    optimizer. benchmarks/llama_cpu.py runs the same at seq 1024 (llama-small) and prints the errors and time ranks."""
    parts = [0, 3, load_model("llama-tiny").num_layers]
    base = {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "partition": parts}
    runs = {"none": base, "selective": {**base, "stage_recompute": ["selective", "none"]},
            "full": {**base, "recompute": "full"}}
    peaks = {}
    for name, strategy in runs.items():
        (tmp_path / name).mkdir()
        ranks = run_trial(tmp_path / name, strategy, "llama-tiny", attention=attention, timed_iters=1)
        kernel = "sdpa-flash" if attention == "flash" else "eager"
        for r, want in zip(ranks, predicted(strategy, "llama-tiny", attention=attention), strict=True):
            assert r["peak_memory_bytes"] == pytest.approx(want, rel=0.10), (name, r["rank"])
            assert (r["attention"], r["attention_kernel"]) == (attention, kernel)
            assert r["optimizer"] == "torch.optim.AdamW(fused)"
        peaks[name] = ranks[0]["peak_memory_bytes"]
    assert peaks["full"] < peaks["none"]  # stage 0 keeps two micro-batches: recomputation shows there
    if attention == "eager":
        assert peaks["selective"] < peaks["none"]  # the scores are dropped
    else:  # FlashAttention keeps no scores: selective recomputation has nothing to drop (the model says the same)
        assert predicted(runs["selective"], "llama-tiny", attention="flash")[0] == \
            predicted(base, "llama-tiny", attention="flash")[0]
