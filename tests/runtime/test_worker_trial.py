"""Real DeepSpeed trials on CPU (torchrun, gloo, world size 2, gpt2-tiny): the worker honours the explicit partition,
keeps tied weights identical, applies and checks the frequency plan, and writes the contract's JSON files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from ampe.costmodel.zoo import load_model
from ampe.runtime.gpt_pipe import build_layer
from ampe.runtime.hook import deepspeed_order
from ampe.runtime.tensor_parallel import TpGroup
from tests.support.worker_runs import launch

ROOT = Path(__file__).resolve().parents[2]
RANK_KEYS = {"rank", "stage", "replica", "shard", "device", "iteration_s", "peak_memory_bytes", "memory_source",
             "energy_j", "energy_source", "instructions_ok", "instruction_mismatch", "emulated"}
RESULT_KEYS = {"status", "iteration_s_mean", "iteration_s_std", "iteration_s", "peak_memory_bytes_per_rank",
               "energy_j_per_iter", "energy_source", "plan_applied"}


def run_trial(tmp_path: Path, strategy: dict, **job) -> tuple[subprocess.CompletedProcess, Path]:
    return launch(tmp_path, strategy, **job), tmp_path


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.trial
def test_pp2_trial_partition_tied_weights_and_plan(tmp_path):
    # Stage 0 gets a correct plan (forwards at 1500 MHz: 1.6× longer under the cpu DVFS model), stage 1 a GPipe-
    # ordered one that DeepSpeed's 1F1B cannot follow: one run exercises applying and rejecting a plan.
    stage0 = [[i, m, 1500 if i == "forward" else 3000] for i, m in deepspeed_order(0, 2, 4)]
    stage1 = [["forward", m, 3000] for m in range(4)] + [["backward", m, 3000] for m in range(4)]
    strategy = {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "partition": [0, 4, 10], "placement": [1, 0],
                "tf32": True}
    proc, out = run_trial(tmp_path, strategy, freq_backend="emulate", tf32=True,
                          frequency_plan={"stages": [stage0, stage1], "time_s": None, "energy_j": None})
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _load(out / "result.json")
    ranks = [_load(out / f"rank{r}.json") for r in range(2)]
    assert set(result) >= RESULT_KEYS and result["status"] == "ok"
    for r in ranks:
        assert set(r) >= RANK_KEYS
        assert len(r["iteration_s"]) == 3 and all(t > 0 for t in r["iteration_s"])
        assert r["memory_source"] == "cpu_alloc_trace"
        b = r["memory_breakdown"]
        assert b["optimizer_states"] == 2 * b["weights"]  # Adam m and v in fp32
        assert r["peak_memory_bytes"] > b["weights"] + b["optimizer_states"]  # + grads and activations
        assert r["energy_source"] == "modelled" and r["energy_j"] > 0
    # Explicit partition, placement (device = placement[rank]) and the CPU pinning that follows from it.
    assert [r["layers"] for r in ranks] == [[0, 4], [4, 10]]
    assert [r["device"] for r in ranks] == [1, 0]
    assert [r["placement"]["core"] for r in ranks] == [1 % os.cpu_count(), 0]
    assert ranks[0]["memory_breakdown"]["weights"] == 4 * sum(l.params for l in load_model("gpt2-tiny").layers[:4])
    # Tied embedding / LM head: identical after training on both stages.
    assert ranks[0]["tied_weight_sha1"] == ranks[1]["tied_weight_sha1"] != {}
    # It trains: the loss falls on the memorised synthetic batches.
    assert result["loss_last"] < result["loss_first"] - 0.1
    # The plan: applied on stage 0 (stretches), rejected on stage 1 with a message.
    assert ranks[0]["instructions_ok"] and ranks[0]["emulated"]["stretch_s"] > 0
    assert not ranks[1]["instructions_ok"]
    assert "step 1: plan says forward of micro-batch 1, DeepSpeed executed backward of micro-batch 0" in \
        ranks[1]["instruction_mismatch"]
    assert result["plan_applied"] is False and len(result["instruction_mismatches"]) == 1
    assert result["energy_source"].startswith("modelled")
    assert result["iteration_s"] == [max(a, b) for a, b in zip(ranks[0]["iteration_s"], ranks[1]["iteration_s"],
                                                               strict=True)]
    assert _load(out / "progress.json")["iteration"] == _load(out / "progress.json")["of"] == 5
    # TF32 as the plan said (both torch flags, set before the model is built), recorded as it stood
    assert all(r["tf32"] == {"matmul": True, "cudnn": True} for r in ranks) and result["tf32"] == ranks[0]["tf32"]
    assert not list(out.glob("error_rank*.json"))


@pytest.mark.trial
def test_tp2_trial_with_frozen_prefix(tmp_path):
    strategy = {"pp": 1, "dp": 1, "tp": 2, "mbs": 2, "gbs": 4}
    proc, out = run_trial(tmp_path, strategy, frozen_layers=3, timed_iters=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = _load(out / "result.json")
    ranks = [_load(out / f"rank{r}.json") for r in range(2)]
    model = load_model("gpt2-tiny")
    for k, r in enumerate(ranks):
        assert (r["stage"], r["replica"], r["shard"]) == (0, 0, k)
        # Frozen: the position embedding and block 0's shard; the tied word embedding keeps training because the
        # LM head (layer 8) is outside the prefix.
        block0 = sum(p.numel() for p in build_layer(model, 2, TpGroup(2, k, None)).parameters())
        assert r["frozen_params"] == model.seq_len * model.hidden + block0
        assert r["freq_backend"] == "none" and r["emulated"] is None
    assert ranks[0]["loss"] == ranks[1]["loss"]  # both shards compute the same (vocab-parallel) loss
    assert result["loss_last"] < result["loss_first"]
    assert result["plan_applied"] is False and result["instructions_ok"]
