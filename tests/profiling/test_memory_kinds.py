"""Issue 32, item 3: the cost model's per-layer activation bytes are what ampe's runtime keeps, for every layer kind
(embedding, GPT-2 block, Llama block, final norm, LM head) and the loss's working set, at fp32 and bf16, tp 1 and 2
(two gloo processes), eager and flash attention — measured on CPU by ``ampe.profiling.memory_kinds`` (the figures
``benchmarks/memory_probe.py`` prints). Within 1 %: every kept tensor is counted, so a missing or doubled term (a
mask, a norm's statistics, K/V heads, an element size applied twice) fails here."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.zoo import load_model
from ampe.profiling.memory_kinds import LOSS, probe_kinds_tp_each

KINDS = {"embedding", "transformer", "norm", "logits", LOSS}


@pytest.mark.trial
@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("name", ["gpt2-tiny", "llama-tiny"])
def test_every_layer_kind_keeps_what_the_model_counts(name, dtype, tp):
    for rows in probe_kinds_tp_each(name, ("eager", "flash"), dtype, tp, mbs=2).values():
        assert {r.kind for r in rows} == KINDS
        for r in rows:
            assert r.measured_bytes > 0
            # the loss's working set leaves out a few per-token temporaries of its backward (< 1 %)
            assert r.modelled_bytes == pytest.approx(r.measured_bytes, rel=0.01 if r.kind == LOSS else 0.001), r
        loss = next(r for r in rows if r.kind == LOSS)
        logits = 2 * 128 * 2048 // tp  # this rank's logits (mbs 2, seq 128, vocab 2048)
        if tp == 1:  # the plain fp32 cross-entropy: 12 bytes per logit
            assert loss.measured_bytes == pytest.approx(12 * logits, rel=1e-4)
        elif dtype == "bf16":  # vocab-parallel: its fp32 copy and the gradient's cast back, 6 bytes per logit
            assert loss.measured_bytes == pytest.approx(6 * logits, rel=0.01)
        else:  # at fp32 the LM head's backward sets the peak: the logits' gradient, its weight's and its input's
            b, h = 4, 128
            assert loss.measured_bytes == pytest.approx(b * (logits + 2048 // tp * h + 2 * 128 * h), rel=0.01)


@pytest.mark.trial
def test_replicated_kv_heads_are_counted_as_held(tmp_path):
    """One K/V head for four query heads at tp 2: each rank holds (and flash keeps) the whole K/V head its query
    heads use, not half of one; eager attention keeps the per-query-head copies instead."""
    config = {"model_type": "llama", "_name_or_path": "tiny-shared-kv", "hidden_size": 64, "num_attention_heads": 4,
              "num_key_value_heads": 1, "intermediate_size": 96, "vocab_size": 512, "num_hidden_layers": 2,
              "max_position_embeddings": 64, "torch_dtype": "float32"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for rows in probe_kinds_tp_each(str(path), ("flash", "eager"), "fp32", 2, mbs=2).values():
        block = next(r for r in rows if r.kind == "transformer")
        assert block.modelled_bytes == pytest.approx(block.measured_bytes, rel=0.001), block
    # what a flash block's rank keeps for K and V: 2 × s × one whole head of 16 × 4 bytes per sample, at any tp
    model = load_model(str(path), "flash")
    flash = model.layers[1]
    for tp in (1, 2, 4):
        kv = flash.act_bytes(tp) - flash.act_bytes_fixed - flash.act_bytes_sharded / tp
        assert kv == pytest.approx(2 * model.seq_len * 16 * 4)
