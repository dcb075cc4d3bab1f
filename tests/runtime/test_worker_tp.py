"""Tensor parallelism: a tp = 2 shard pair (two gloo processes) reproduces the tp = 1 layer's output, input gradient
and (sliced) parameter gradients, with exactly 2 all-reduces in forward and 2 in backward per transformer block."""

from __future__ import annotations

import pytest
import torch

from ampe.costmodel.zoo import load_model
from ampe.runtime.gpt_pipe import build_layer
from ampe.runtime.tensor_parallel import ColumnParallelLinear, RowParallelLinear, TpGroup, VocabParallelEmbedding
from tests.support.tp_shards import AllReduceCounter, run_shards

MODEL = "gpt2-tiny"
LAYERS = (0, 2, 8)  # embedding, a transformer block, the tied LM head (with the loss's gradient)


def _inputs(model, idx, tp=None):
    """Input and output gradient of layer ``idx``; the LM head's output (and gradient) is this rank's slice of the
    vocabulary."""
    gen = torch.Generator().manual_seed(100 + idx)
    if model.layers[idx].kind == "embedding":
        x = torch.randint(0, model.vocab, (2, model.seq_len), generator=gen)
    else:
        x = torch.randn(2, model.seq_len, model.hidden, generator=gen).requires_grad_(True)
    width = model.vocab if model.layers[idx].kind == "logits" else model.hidden
    g = torch.randn(2, model.seq_len, width, generator=gen)
    if model.layers[idx].kind == "logits" and tp is not None:
        g = g.chunk(tp.size, dim=-1)[tp.rank]
    return x, g


def run_layer(model, idx, tp):
    """Output, input grad and {param name: grad} of layer ``idx`` on this shard (dropout off: deterministic)."""
    torch.manual_seed(idx)
    module = build_layer(model, idx, tp, dropout=0.0)
    x, g = _inputs(model, idx)
    out = module(x)
    (out * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    weights = {n: p.detach().clone() for n, p in module.named_parameters()}
    return out.detach(), (x.grad.clone() if x.grad is not None else None), grads, weights, module


def _all_layers(tp):
    """Each layer of LAYERS on this shard, and the all-reduces of its forward and backward."""
    model = load_model(MODEL)
    counter = AllReduceCounter()
    results = {}
    for idx in LAYERS:
        torch.manual_seed(idx)
        module = build_layer(model, idx, tp, dropout=0.0)
        x, g = _inputs(model, idx, tp)
        counter.phase = (idx, "forward")
        out = module(x)
        counter.phase = (idx, "backward")
        (out * g).sum().backward()
        grads = {n: p.grad for n, p in module.named_parameters()}
        results[idx] = {"out": out.detach(), "xgrad": x.grad, "grads": grads,
                        "weights": {n: p.detach() for n, p in module.named_parameters()}}
    return {"results": results, "counts": counter.counts}


@pytest.fixture(scope="module")
def shards():
    return run_shards(_all_layers)


def _expected_shard(name, full, shard_layer, rank):
    """Slice a tp = 1 parameter (or its grad) the way the tp = 2 shard at ``rank`` holds it."""
    owner = shard_layer
    *path, leaf = name.split(".")
    for p in path:
        owner = getattr(owner, p)
    if isinstance(owner, ColumnParallelLinear):
        return full[owner.rows]
    if isinstance(owner, RowParallelLinear) and leaf == "weight":
        n = full.shape[1] // 2
        return full[:, rank * n:(rank + 1) * n]
    if isinstance(owner, VocabParallelEmbedding):
        return full[owner.start:owner.stop]
    return full  # replicated (layer norms, row-parallel bias, position embedding)


@pytest.mark.trial
@pytest.mark.parametrize("idx", LAYERS)
def test_tp2_layer_matches_tp1(shards, idx):
    model = load_model(MODEL)
    out1, xgrad1, grads1, weights1, _ = run_layer(model, idx, TpGroup.single())
    for rank, shard in enumerate(shards):
        r = shard["results"][idx]
        want = out1.chunk(2, dim=-1)[rank] if model.layers[idx].kind == "logits" else out1
        torch.testing.assert_close(r["out"], want, rtol=1e-4, atol=1e-5)
        if xgrad1 is not None:
            torch.testing.assert_close(r["xgrad"], xgrad1, rtol=1e-4, atol=1e-5)
        layout = build_layer(model, idx, TpGroup(2, rank, None), dropout=0.0)  # same slicing, no communication
        assert set(r["grads"]) == set(grads1)
        for name in grads1:
            torch.testing.assert_close(r["weights"][name], _expected_shard(name, weights1[name], layout, rank))
            torch.testing.assert_close(r["grads"][name], _expected_shard(name, grads1[name], layout, rank),
                                       rtol=1e-4, atol=1e-5)


@pytest.mark.trial
def test_block_does_two_allreduces_each_way(shards):
    for shard in shards:
        assert shard["counts"][(2, "forward")] == 2
        assert shard["counts"][(2, "backward")] == 2
        assert shard["counts"][(0, "forward")] == 1  # vocab-parallel embedding
        assert (0, "backward") not in shard["counts"]
        assert shard["counts"][(8, "backward")] == 1  # LM head: input gradient
        assert (8, "forward") not in shard["counts"]  # the logits stay split: the loss is vocab-parallel


def test_tp_shards_partition_parameters_like_the_zoo_counts():
    model = load_model(MODEL)
    h = model.hidden
    full = sum(p.numel() for p in build_layer(model, 2).parameters())
    assert full == model.layers[2].params == 12 * h * h + 13 * h
    shard = sum(p.numel() for p in build_layer(model, 2, TpGroup(2, 0, None)).parameters())
    # Sharded: qkv, proj weight, fc1, fc2 weight (12h² + 3h + 4h biases of column layers); replicated: 2 LN + 2
    # row-parallel biases (6h).
    assert shard == (12 * h * h + 7 * h) // 2 + 6 * h
    with pytest.raises(ValueError, match="divisible"):
        build_layer(model, 2, TpGroup(3, 0, None))
