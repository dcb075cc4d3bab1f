"""Llama family as DeepSpeed pipeline layers, one module per entry of the zoo's layer list (``ampe.costmodel.llama``)::

    0 embedding | 1..L transformer | L+1 final RMSNorm | L+2 logits (LM head) | L+3 noop

RMSNorm, rotary embeddings, grouped-query attention, SwiGLU MLP, no dropout, untied embeddings (tied when the
config ties them). Built from the model's config (``Model.config``: a zoo entry or a Hugging Face ``config.json``), so
every Llama-family model the planner reads can run. Written so that the tensors autograd keeps are the ones the cost
model counts: the RMSNorm is a custom autograd function keeping its input and 1/rms (a fused kernel's footprint).
Attention is the model's: ``flash`` is torch's SDPA (:func:`ampe.runtime.attention.flash_attention`; K/V heads
shared by their group), ``eager`` writes it out (scores, mask, softmax, ·V; the broadcast matmul copies K and V per
query head, as Hugging Face's ``repeat_kv`` does). A sliding window narrower than the sequence (Mistral) is a band
mask.

Tensor parallelism (Megatron's, :mod:`ampe.runtime.tensor_parallel`): q/k/v and gate/up column-parallel behind one
input-gradient all-reduce each (attention, MLP), o and down row-parallel (one output all-reduce each), so a block does
2 all-reduces each way as GPT's does; whole heads per rank, rotary and the attention kernel on the local heads. K/V
heads are split when tp divides them, else (fewer K/V heads than ranks) each rank holds the one its query heads use
(:func:`ampe.costmodel.runnable.kv_heads_per_rank`), its gradient summed over the ranks holding it. The embedding and
the LM head (tied or not) are vocab-parallel; the last stage's output is this rank's slice of the logits.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampe.costmodel.model import Model
from ampe.costmodel.runnable import kv_copies, kv_heads_per_rank, kv_layout_problem, llama_layout_problem
from ampe.runtime.attention import flash_attention, note_eager
from ampe.runtime.gpt_pipe import LogitsLayer, Noop, lm_head  # a tied head: the word embedding's logits
from ampe.runtime.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TpGroup,
    VocabParallelEmbedding,
    VocabParallelLmHead,
    copy_to_tp,
)

TIED_KEY = "embed"
ROPE_THETA = 10000.0


class _RmsNormFn(torch.autograd.Function):
    """y = x / rms(x) · w, keeping only x and 1/rms for backward."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        rstd = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return x * rstd * weight

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normed = x * rstd
        grad_w = (grad * normed).reshape(-1, x.shape[-1]).sum(0)
        g = grad * weight
        grad_x = rstd * (g - normed * (g * normed).mean(-1, keepdim=True))
        return grad_x, grad_w, None


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (no bias)."""

    def __init__(self, hidden: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _RmsNormFn.apply(x, self.weight, self.eps)


class Embedding(nn.Module):
    """Token embedding, vocab-parallel (no positions: rotary does that inside attention)."""

    def __init__(self, vocab: int, hidden: int, tp: TpGroup | None = None) -> None:
        super().__init__()
        self.word = VocabParallelEmbedding(vocab, hidden, tp or TpGroup.single())

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.word(tokens)


class LmHead(VocabParallelLmHead):
    """Untied LM head: the logits of this rank's slice of the vocabulary (all of it at tp = 1)."""

    def __init__(self, vocab: int, hidden: int, tp: TpGroup | None = None) -> None:
        super().__init__(vocab, hidden, tp or TpGroup.single())


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class Block(nn.Module):
    """Pre-norm Llama block: RMSNorm → GQA attention with rotary → residual → RMSNorm → SwiGLU → residual."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, ffn: int, seq_len: int,
                 qkv_bias: bool = False, attention: str = "eager", window: int = 0, tp: TpGroup | None = None) -> None:
        super().__init__()
        if attention not in ("eager", "flash"):
            raise ValueError(f"attention must be eager or flash, got {attention!r}")
        tp = tp or TpGroup.single()
        problem = kv_layout_problem(kv_heads, tp.size)
        if problem:
            raise ValueError(problem)
        self.tp, self.head_dim, self.attention = tp, head_dim, attention
        self.heads = tp.shard(heads, "heads")
        self.kv_heads = kv_heads_per_rank(kv_heads, tp.size)
        copies = kv_copies(kv_heads, tp.size)
        first = tp.rank // copies * self.kv_heads  # the first K/V head this rank holds
        kv_rows = torch.arange(first * head_dim, (first + self.kv_heads) * head_dim)
        self.norm1, self.norm2 = RMSNorm(hidden), RMSNorm(hidden)
        self.q = ColumnParallelLinear(hidden, heads * head_dim, tp, bias=qkv_bias)
        self.k = ColumnParallelLinear(hidden, kv_heads * head_dim, tp, bias=qkv_bias, rows=kv_rows, copies=copies)
        self.v = ColumnParallelLinear(hidden, kv_heads * head_dim, tp, bias=qkv_bias, rows=kv_rows, copies=copies)
        self.o = RowParallelLinear(heads * head_dim, hidden, tp, bias=False)
        self.gate = ColumnParallelLinear(hidden, ffn, tp, bias=False)
        self.up = ColumnParallelLinear(hidden, ffn, tp, bias=False)
        self.down = RowParallelLinear(ffn, hidden, tp, bias=False)
        inv = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
        angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv)
        self.cos: torch.Tensor
        self.sin: torch.Tensor
        self.causal: torch.Tensor
        self.register_buffer("cos", torch.cat((angles, angles), -1).cos(), persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), -1).sin(), persistent=False)
        self.banded = 0 < window < seq_len
        if attention == "eager" or self.banded:  # s² bools per block (16 MiB at seq 4096): only where needed
            masked = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1)  # True: not attended
            if self.banded:
                masked |= torch.ones(seq_len, seq_len, dtype=torch.bool).tril(-window)
        else:
            masked = torch.empty(0, 0, dtype=torch.bool)
        self.register_buffer("causal", masked, persistent=False)
        self.selective = False  # selective recomputation of core attention (Korthikanti et al.): set per stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a, g, d = self.heads, self.kv_heads, self.head_dim
        h = copy_to_tp(self.norm1(x), self.tp)  # one input-gradient all-reduce for q, k and v
        cos, sin = self.cos[:s].to(x.dtype), self.sin[:s].to(x.dtype)
        q = self.q.local(h).view(b, s, a, d).transpose(1, 2)
        k = self.k.local(h).view(b, s, g, d).transpose(1, 2)
        v = self.v.local(h).view(b, s, g, d).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin  # rotary: multiplying by constants keeps nothing but the result
        k = k * cos + _rotate_half(k) * sin
        if self.selective:  # keep q, k, v; re-run core attention in backward
            ctx = checkpoint(self._core_attention, q, k, v, use_reentrant=False)
        else:
            ctx = self._core_attention(q, k, v)
        ctx = ctx.transpose(1, 2).reshape(b, s, a * d)
        x = x + self.o(ctx)
        h = copy_to_tp(self.norm2(x), self.tp)  # one for gate and up
        return x + self.down(F.silu(self.gate.local(h)) * self.up.local(h))

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, a, s, d) context of causal grouped-query attention of q (b, a, s, d) over k, v (b, g, s, d): SDPA
        (flash) or scores, softmax, ·V (eager); what selective recomputation re-runs."""
        b, a, s, d = q.shape
        g = k.shape[1]
        if self.attention == "flash":
            return flash_attention(q, k, v, attn_mask=~self.causal[:s, :s] if self.banded else None)
        note_eager()
        # each K/V head serves a/g query heads: the broadcast matmul copies K and V per query head
        qg = q.reshape(b, g, a // g, s, d)
        scores = torch.matmul(qg, k.unsqueeze(2).transpose(-1, -2)) * d ** -0.5
        probs = torch.softmax(scores.masked_fill(self.causal[:s, :s], float("-inf")), dim=-1)
        return torch.matmul(probs, v.unsqueeze(2)).reshape(b, a, s, d)


def check_llama_layout(model: Model) -> int:
    """Number of blocks; ValueError unless ``model`` is a Llama-family layer list built from a config (zoo or
    Hugging Face) that the worker can build."""
    problem = llama_layout_problem(model)
    if problem:
        raise ValueError(problem)
    return model.num_layers - 4


def layer_specs(model: Model, tp: TpGroup | None = None) -> list[Any]:
    """DeepSpeed ``LayerSpec`` list (``TiedLayerSpec`` for a tied embedding/head), one per entry of
    ``model.layers``, with the model's attention kernel, sharded over ``tp`` (None: tp = 1)."""
    check_llama_layout(model)
    cfg = model.config
    h, v = cfg.hidden, cfg.vocab
    tp = tp or TpGroup.single()
    specs: list[Any] = []
    for layer in model.layers:
        if layer.kind == "embedding":
            specs.append(TiedLayerSpec(TIED_KEY, Embedding, v, h, tp, tied_weight_attr="word.weight") if cfg.tied
                         else LayerSpec(Embedding, v, h, tp))
        elif layer.kind == "transformer":
            specs.append(LayerSpec(Block, h, cfg.heads, cfg.kv_heads, cfg.head_size, cfg.ffn, cfg.seq_len,
                                   cfg.qkv_bias, model.attention, cfg.sliding_window, tp))
        elif layer.kind == "norm":
            specs.append(LayerSpec(RMSNorm, h))
        elif layer.kind == "logits":
            specs.append(TiedLayerSpec(TIED_KEY, Embedding, v, h, tp, forward_fn=lm_head,
                                       tied_weight_attr="word.weight") if cfg.tied else LayerSpec(LmHead, v, h, tp))
        else:
            specs.append(LayerSpec(Noop))
    return specs


def build_layer(model: Model, index: int, tp: TpGroup | None = None) -> nn.Module:
    """Layer ``index`` of ``model`` as a standalone module on ``tp`` (what the profiler times): the module its
    :func:`layer_specs` entry builds; a tied LM head gets its own copy of the embedding matrix."""
    check_llama_layout(model)
    cfg = model.config
    kind = model.layers[index].kind
    if kind == "embedding":
        return Embedding(cfg.vocab, cfg.hidden, tp)
    if kind == "transformer":
        return Block(cfg.hidden, cfg.heads, cfg.kv_heads, cfg.head_size, cfg.ffn, cfg.seq_len, cfg.qkv_bias,
                     model.attention, cfg.sliding_window, tp)
    if kind == "norm":
        return RMSNorm(cfg.hidden)
    if kind == "logits":
        return LogitsLayer(Embedding(cfg.vocab, cfg.hidden, tp)) if cfg.tied else LmHead(cfg.vocab, cfg.hidden, tp)
    return Noop()
