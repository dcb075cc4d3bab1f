"""Memory model against a hand count for GPT-2 small (mbs 1, Adam, fp16) and OOM reporting."""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG, GiB
from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model


def one_gpu(gpu: str, count: int = 1):
    return cluster_from_dict({"name": "one", "nodes": [{"name": "n", "gpu": gpu, "count": count,
                                                       "intra_gbps": 100, "inter_gbps": 100}]})


def test_gpt2_memory_hand_count_mbs1_adam_fp16():
    L, h, a, s, V = 12, 768, 12, 1024, 50257
    params = V * h + s * h + L * (12 * h * h + 13 * h) + 2 * h  # tied LM head counted once
    assert params == 124_439_808
    # fp16 weight 2 + fp32 master 4 + Adam m 4 + v 4; the fp16 gradients (2) are not there yet at the peak: with
    # gas = 1 the peak is the start of the only backward (measured on CPU trials, docs/fidelity.md)
    states = 14 * params
    # Korthikanti et al. (fp16 tensors, 1-byte dropout masks) + the two LayerNorms' mean and 1/σ per token
    block_act = 34 * s * h + 5 * a * s * s + 2 * 2 * s * 2
    acts = L * block_act + (8 * s + s * h) + (2 * s * h + 2 * s * 2) + 2 * s * h  # + embedding (token ids, dropout
    #                                                          mask), final norm input and statistics, LM head input
    slots = 2  # DeepSpeed keeps max(2, min(pp - stage, gas)) pipe buffer slots
    buffers = slots * s * 8  # token ids held in the input buffers
    # fp16 logits in each *used* output slot (min(slots, gas) = 1) + the loss's fp32 log-softmax, NLL gradient and
    # log-softmax gradient (12 bytes per logit)
    logits = min(slots, 1) * s * V * 2 + s * V * 12
    masks = L * s * s  # each block's causal mask (bool): eager attention's module buffer
    gpu = CATALOG["V100-16GB"]
    allocated = states + masks + acts + buffers + logits + gpu.workspace_bytes
    hand = allocated * (1 + gpu.fragmentation) + gpu.context_bytes  # the footprint
    est = CostModel(one_gpu("V100-16GB"), load_model("gpt2")).estimate(Strategy(1, 1, 1, 1, 1))
    assert est.memory_breakdown[0].allocated == pytest.approx(allocated, rel=1e-6)
    assert est.max_memory_bytes == pytest.approx(hand, rel=1e-6)
    assert est.fits


def test_activations_scale_with_in_flight_microbatches():
    from ampe.costmodel.memory import in_flight, stage_memory

    model = load_model("gpt2")
    gpu = CATALOG["A100-80GB"]
    block = 34 * 1024 * 768 + 5 * 12 * 1024 ** 2 + 8 * 1024  # bytes per sample per block (+ LayerNorm stats)
    for j in range(4):
        m = stage_memory(model, range(2 + 3 * j, 5 + 3 * j), j, 4, 1, 2, 16, gpu)  # three blocks
        assert m.in_flight == 4 - j == in_flight("1f1b", j, 4, 16)
        assert m.activations == pytest.approx(3 * block * 2 * (4 - j))
        g = stage_memory(model, range(2 + 3 * j, 5 + 3 * j), j, 4, 1, 2, 16, gpu, schedule="gpipe")
        assert g.activations == pytest.approx(3 * block * 2 * 16)  # GPipe keeps every micro-batch
    assert in_flight("1f1b", 0, 8, 3) == 3  # capped at gas


def test_oom_names_stage_device_and_components():
    model = load_model("gpt3-6.7b")
    e = CostModel(one_gpu("T4", 2), model).estimate(Strategy(2, 1, 1, 1, 8))
    assert not e.fits
    assert "stage 0 on device 0" in e.oom_reason and "T4" in e.oom_reason and "weights+grads+optimizer" in \
        e.oom_reason
    assert e.max_memory_bytes > 15 * GiB


def test_tensor_parallel_divides_states_and_sharded_activations():
    """Each component is A + B/tp (A: what every rank keeps whole, B: the sharded part), so the drop from tp 1 to 2 is
    exactly twice the drop from 2 to 4; a √tp (or any other) divisor breaks the identity. Same gas (2) throughout."""
    model = load_model("gpt2-medium")
    cm = CostModel(one_gpu("A100-80GB", 4), model)
    mem = {tp: cm.estimate(Strategy(1, 4 // tp, tp, 1, 2 * (4 // tp))).memory_breakdown[0] for tp in (1, 2, 4)}
    for part in ("states", "activations"):
        m1, m2, m4 = (getattr(mem[tp], part) for tp in (1, 2, 4))
        assert m1 - m2 == pytest.approx(2 * (m2 - m4), rel=1e-12), part
        assert m1 - m2 > 0.45 * m1, part  # most of it is sharded
    # What tp leaves whole: the final LayerNorm's 2h parameters × 16 bytes (mixed-precision Adam) and each block's
    # causal mask (s² bools, eager attention's module buffer); every other layer (embeddings, blocks, the tied head)
    # is split
    h, s, L = 1024, 1024, 24
    assert 2 * mem[2].states - mem[1].states == pytest.approx(16 * 2 * h + L * s * s, rel=1e-12)


@pytest.mark.parametrize("schedule,pp,v", [("gpipe", 16, 1), ("interleaved", 8, 2), ("1f1b", 16, 1)])
def test_memory_terms_never_negative_with_more_in_flight_than_buffer_slots(schedule, pp, v):
    """GPipe and interleaved stages keep more micro-batches in flight than DeepSpeed has pipe buffer slots; the
    received-input copies beyond the saved inputs then fall to the receive buffer, never below (the pp = 16 GPipe
    strategies of AMP's het-cluster had negative buffers and a negative stage total)."""
    from pathlib import Path

    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.memory import input_copies

    assert input_copies(2, 32) == 1 and input_copies(4, 4) == 1 and input_copies(4, 1) == 4
    spec = Path(__file__).resolve().parents[2] / "cluster_specs" / "amp-het-cluster.yaml"
    cm = CostModel(load_cluster(spec), load_model("gpt2-amp"))
    L = cm.model.num_layers
    n_pos = pp * v
    for first in (1, 5):
        part = (0, *range(first, first + n_pos - 1), L)
        e = cm.estimate(Strategy(pp=pp, dp=1, tp=1, mbs=1, gbs=32, partition=part, schedule=schedule,
                                 virtual_stages=v))
        for b in e.memory_breakdown:
            assert min(b.states, b.activations, b.buffers, b.transient, b.fragmentation, b.context, b.total) >= 0
        assert min(e.memory_bytes_per_stage) > 0 and min(e.memory_bytes_per_device) >= 0  # 0: device unused


def test_the_losss_fp32_working_set_at_16_bit_covers_the_whole_micro_batch():
    """llama-3.2-1b (vocabulary 128,256, seq 4096, bf16) on one H100: the last stage holds the bf16 logits in every
    used pipe slot and, at the start of the loss backward, three fp32 logits-sized tensors of the whole micro-batch
    (log-softmax output, NLL and log-softmax input gradients: 6 GiB per sample). The forward's fp32 upcast (2 GiB per
    sample) is alive only beside the log-softmax output, below that peak."""
    cluster = cluster_from_dict({"name": "h", "nodes": [{"name": "g", "gpu": "H100-80GB", "count": 1,
                                                         "intra_gbps": 3600, "inter_gbps": 100}]})
    model = load_model("llama-3.2-1b")
    per_sample = 4096 * 128256
    cm = CostModel(cluster, model)
    for mbs, slots in ((1, 2), (2, 2), (4, 2), (16, 1)):
        est = cm.estimate(Strategy(1, 1, 1, mbs, 16))
        transient = est.memory_breakdown[-1].transient
        assert transient == pytest.approx(slots * mbs * per_sample * 2 + 12 * mbs * per_sample), mbs
