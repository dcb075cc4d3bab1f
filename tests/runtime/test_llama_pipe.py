"""The trial worker's Llama-family layers keep exactly the activations the cost model counts, and their RMSNorm's
hand-written backward is right."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from ampe.costmodel.llama import LLAMA_ZOO, llama_model
from ampe.costmodel.zoo import load_model
from ampe.runtime.llama_pipe import Block, _RmsNormFn, layer_specs


def saved_bytes(fn, x: torch.Tensor, exclude: set[int]) -> int:
    """Bytes of the distinct storages autograd saves while ``fn(x)`` runs (parameters and buffers excluded)."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        if st.data_ptr() not in exclude:
            seen[st.data_ptr()] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(x)
    return sum(seen.values())


@pytest.mark.parametrize("name", ["llama-tiny"])
def test_block_saves_what_the_model_counts(name):
    model, cfg = load_model(name), LLAMA_ZOO[name]
    torch.manual_seed(0)
    blk = Block(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_size, cfg.ffn, cfg.seq_len)
    own = {p.data_ptr() for p in blk.parameters()} | {b.data_ptr() for b in blk.buffers()}
    mbs = 2
    x = torch.randn(mbs, cfg.seq_len, cfg.hidden, requires_grad=True)
    layer = model.layers[1]
    assert sum(p.numel() for p in blk.parameters()) == layer.params
    # eager attention, fp32, no dropout: Q/K/V, the repeated K/V, softmax, attention output, SwiGLU, norms
    assert saved_bytes(blk, x, own) == pytest.approx(layer.act_bytes(1, 4) * mbs, rel=1e-9)
    # full recomputation keeps only the block's input
    ckpt = functools.partial(checkpoint, blk, use_reentrant=False)
    assert saved_bytes(ckpt, x, own) == pytest.approx(layer.act_bytes(1, 4, "full") * mbs, rel=1e-9)


def test_rmsnorm_backward_matches_autograd():
    x = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _RmsNormFn.apply(a, b, 1e-5), (x, w))


def test_layer_specs_follow_the_layer_list_and_refuse_other_models():
    specs = layer_specs(load_model("llama-tiny"))
    assert len(specs) == load_model("llama-tiny").num_layers
    tied = llama_model("llama-tiny", LLAMA_ZOO["llama-tiny"])  # same config, built here: a zoo name
    assert len(layer_specs(tied)) == tied.num_layers
    with pytest.raises(ValueError, match="Llama-family"):
        layer_specs(load_model("gpt2-tiny"))
