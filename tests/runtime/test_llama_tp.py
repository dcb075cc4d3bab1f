"""Llama tensor parallelism and the vocab-parallel loss: a tp = 2 shard pair (two gloo processes) reproduces the
tp = 1 layer's output, input gradient and (sliced) parameter gradients — with K/V heads split (llama-tiny, GQA 4:2)
and replicated (one K/V head for two ranks), eager and flash attention, tied and untied LM heads — and the
vocab-parallel cross-entropy gives the gathered form's loss and gradients for GPT and Llama heads."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ampe.costmodel.llama import LlamaConfig, llama_model
from ampe.costmodel.zoo import load_model
from ampe.runtime import gpt_pipe, llama_pipe
from ampe.runtime.tensor_parallel import SHARD_ATTR, TpGroup, vocab_parallel_cross_entropy
from tests.support.tp_shards import AllReduceCounter, run_shards

# One K/V head for four query heads: at tp = 2 both ranks hold it (replicated); Q/K/V biases and a tied head
SHARED_KV = LlamaConfig(2, 64, 4, 1, 96, 512, 32, tied=True, qkv_bias=True, dtype="fp32")
MBS = 2


def models() -> dict[str, object]:
    return {"tiny-eager": load_model("llama-tiny", "eager"), "tiny-flash": load_model("llama-tiny", "flash"),
            "shared-kv": llama_model("shared-kv", SHARED_KV, "flash"), "gpt": load_model("gpt2-tiny")}


# (model key, layer index): embedding, a block and the LM head of each; the LM heads train through the loss
CASES = [("tiny-eager", 0), ("tiny-eager", 1), ("tiny-eager", 6), ("tiny-flash", 2), ("shared-kv", 0),
         ("shared-kv", 1), ("shared-kv", 4), ("gpt", 8)]


def build(key: str, idx: int, tp: TpGroup):
    model = models()[key]
    torch.manual_seed(idx)
    if model.family == "llama":
        return llama_pipe.build_layer(model, idx, tp)
    return gpt_pipe.build_layer(model, idx, tp, dropout=0.0)


def inputs(key: str, idx: int):
    model = models()[key]
    gen = torch.Generator().manual_seed(100 + idx)
    if model.layers[idx].kind == "embedding":
        x = torch.randint(0, model.vocab, (MBS, model.seq_len), generator=gen)
    else:
        x = torch.randn(MBS, model.seq_len, model.hidden, generator=gen).requires_grad_(True)
    g = torch.randn(MBS, model.seq_len, model.hidden, generator=gen)
    labels = torch.randint(0, model.vocab, (MBS, model.seq_len), generator=gen)
    return x, g, labels


def run(key: str, idx: int, tp: TpGroup) -> dict:
    """Output (this rank's), loss (LM heads), input grad, {param: grad}, {param: weight}."""
    module = build(key, idx, tp)
    x, g, labels = inputs(key, idx)
    out = module(x)
    loss = None
    if models()[key].layers[idx].kind == "logits":
        loss = vocab_parallel_cross_entropy(out, labels, tp)
        loss.backward()
    else:
        (out * g).sum().backward()
    return {"out": out.detach(), "loss": None if loss is None else loss.detach(),
            "xgrad": x.grad if x.dtype.is_floating_point else None,
            "grads": {n: p.grad for n, p in module.named_parameters()},
            "weights": {n: p.detach() for n, p in module.named_parameters()}}


def _all_cases(tp: TpGroup) -> dict:
    """Every case on this shard, and the all-reduces each made."""
    counter = AllReduceCounter()
    results = {}
    for key, idx in CASES:
        counter.phase = (key, idx)
        results[counter.phase] = run(key, idx, tp)
    return {"results": results, "counts": counter.counts}


@pytest.fixture(scope="module")
def shards():
    return run_shards(_all_cases)


def shard_of(full: torch.Tensor, name: str, layout: torch.nn.Module) -> torch.Tensor:
    """The tp = 1 tensor sliced as parameter ``name`` of the tp = 2 ``layout`` holds it."""
    shard = getattr(dict(layout.named_parameters())[name], SHARD_ATTR, None)
    if shard is None:
        return full  # replicated
    return full.index_select(shard.dim, torch.tensor(shard.index))


@pytest.mark.trial
@pytest.mark.parametrize("key, idx", CASES)
def test_tp2_shards_reproduce_the_tp1_layer(shards, key, idx):
    one = run(key, idx, TpGroup.single())
    logits = models()[key].layers[idx].kind == "logits"
    for rank, shard in enumerate(shards):
        r = shard["results"][(key, idx)]
        layout = build(key, idx, TpGroup(2, rank, None))  # same slicing, no communication
        want = one["out"]
        if logits:  # this rank's slice of the vocabulary
            n = want.shape[-1] // 2
            want = want[..., rank * n:(rank + 1) * n]
            torch.testing.assert_close(r["loss"], one["loss"], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(r["out"], want, rtol=1e-4, atol=1e-5)
        if one["xgrad"] is not None:
            torch.testing.assert_close(r["xgrad"], one["xgrad"], rtol=1e-4, atol=1e-5)
        assert set(r["grads"]) == set(one["grads"])
        for name in one["grads"]:
            torch.testing.assert_close(r["weights"][name], shard_of(one["weights"][name], name, layout))
            torch.testing.assert_close(r["grads"][name], shard_of(one["grads"][name], name, layout),
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.trial
def test_a_block_does_two_allreduces_each_way_and_the_loss_three_small_ones(shards):
    model = models()["tiny-eager"]
    tokens = MBS * model.seq_len
    for shard in shards:
        c = shard["counts"]
        # block: o and down in forward, q/k/v and gate/up input gradients in backward
        assert c[("tiny-eager", 1)] == c[("tiny-flash", 2)] == 4
        # a replicated K/V head adds its weight and bias gradient sums (k and v)
        assert c[("shared-kv", 1)] == 4 + 4
        assert c[("tiny-eager", 0)] == 1  # vocab-parallel lookup, forward only
        # LM head + loss: max, target logit and sum of exp (forward), the head's input gradient (backward)
        assert c[("tiny-eager", 6)] == c[("shared-kv", 4)] == c[("gpt", 8)] == 4
        assert shard["results"][("tiny-eager", 6)]["out"].numel() == tokens * model.vocab // 2


def test_vocab_parallel_loss_at_tp1_is_the_plain_cross_entropy():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 11, generator=gen, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    got = vocab_parallel_cross_entropy(logits, labels, TpGroup.single())
    assert torch.equal(got, F.cross_entropy(logits.view(-1, 11), labels.view(-1)))
    assert torch.equal(gpt_pipe.lm_loss(logits, labels), got)


def test_block_shards_partition_the_parameters():
    model = models()["shared-kv"]
    cfg = SHARED_KV
    full = sum(p.numel() for p in build("shared-kv", 1, TpGroup.single()).parameters())
    assert full == model.layers[1].params
    d = cfg.head_size
    kv = d * cfg.hidden + d  # one K/V head's weight and bias, held whole by both ranks
    h, f, q = cfg.hidden, cfg.ffn, cfg.heads * d
    for rank in (0, 1):
        blk = build("shared-kv", 1, TpGroup(2, rank, None))
        assert (blk.heads, blk.kv_heads) == (2, 1)
        # halves: Q (weight and bias), O, gate, up, down; whole: the shared K and V heads and both norms
        assert sum(p.numel() for p in blk.parameters()) == (h * q + q + q * h + 3 * h * f) // 2 + 2 * kv + 2 * h
    with pytest.raises(ValueError, match="K/V heads"):
        llama_pipe.build_layer(llama_model("x", LlamaConfig(2, 64, 6, 3, 96, 512, 32, dtype="fp32")), 1,
                               TpGroup(2, 0, None))
