"""GPT-2 family as DeepSpeed pipeline layers, one module per entry of the zoo's layer list.

The layer list is exactly ``load_model(name).layers`` (L + 6 entries)::

    0 embedding (tied "embed") | 1 noop | 2..L+1 transformer | L+2 noop | L+3 norm
    | L+4 logits (tied "embed") | L+5 noop

so a partition ``[0, 4, 10]`` means the same layers to the cost model, the search and the trial worker. The input
embedding and the LM head are one ``TiedLayerSpec`` key: DeepSpeed builds the module on the first and the last stage
and all-reduces the tied weight's gradient between them. Attention is written out (scores, softmax, dropout, context)
rather than fused, so the activations kept for backward are the ones the cost model's Korthikanti et al. formula
counts. The loss (cross-entropy over the vocabulary; vocab-parallel at tp > 1,
:func:`ampe.runtime.tensor_parallel.vocab_parallel_cross_entropy`) runs after the last layer on the last stage.

The modules here are used both by the trial worker (through :func:`layer_specs`) and by the profiler (through
:func:`build_layer`), so profiles and trials measure the same code.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from deepspeed.pipe import LayerSpec, TiedLayerSpec
from torch import nn
from torch.utils.checkpoint import checkpoint

from ampe.costmodel.model import Model
from ampe.costmodel.runnable import gpt_layout_problem
from ampe.runtime.attention import flash_attention, note_eager
from ampe.runtime.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    TpGroup,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

TIED_KEY = "embed"
DEFAULT_DROPOUT = 0.1  # GPT-2's attention, residual and embedding dropout


def check_gpt_layout(model: Model) -> int:
    """Number of transformer blocks L; raises ValueError if ``model`` is not the GPT pipe layout (L + 6 entries)."""
    problem = gpt_layout_problem(model)
    if problem:
        raise ValueError(problem)
    return model.num_layers - 6


class Embedding(nn.Module):
    """Token (vocab-parallel) plus learned position embedding, then dropout. Layer 0, tied with the LM head."""
    def __init__(self, vocab: int, hidden: int, seq_len: int, tp: TpGroup, dropout: float,
                 with_position: bool = True) -> None:
        super().__init__()
        self.word = VocabParallelEmbedding(vocab, hidden, tp)
        # The LM-head copy on the last stage needs only the tied word embedding.
        self.position = nn.Embedding(seq_len, hidden) if with_position else None
        if self.position is not None:
            nn.init.normal_(self.position.weight, std=0.01)
        self.drop = nn.Dropout(dropout)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.word(tokens)
        if self.position is not None:
            x = x + self.position.weight[: tokens.shape[-1]]
        return self.drop(x)


def lm_head(embedding: Any, x: torch.Tensor) -> torch.Tensor:
    """Layer L+4: logits with the tied word-embedding matrix (``TiedLayerSpec.forward_fn``; ``embedding``: a module
    whose ``word`` is a :class:`VocabParallelEmbedding`, GPT's or Llama's), this rank's slice of the vocabulary at
    tp > 1 (the loss is vocab-parallel)."""
    return embedding.word.logits(x)


class Noop(nn.Module):
    """A placeholder entry (Megatron's transposes); identity, no parameters, no saved activations."""
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class Block(nn.Module):
    """Pre-LN GPT-2 transformer block, Megatron tensor-parallel: qkv and fc1 column-parallel, proj and fc2
    row-parallel (2 all-reduces in forward, 2 in backward). Parameters: 12h² + 13h at tp = 1."""
    def __init__(self, hidden: int, heads: int, seq_len: int, tp: TpGroup, dropout: float,
                 attention: str = "eager") -> None:
        super().__init__()
        if attention not in ("eager", "flash"):
            raise ValueError(f"attention must be eager or flash, got {attention!r}")
        self.attention = attention
        self.heads_local = tp.shard(heads, "heads")
        self.head_dim = hidden // heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = ColumnParallelLinear(hidden, 3 * hidden, tp, groups=3)
        self.proj = RowParallelLinear(hidden, hidden, tp)
        self.ln2 = nn.LayerNorm(hidden)
        self.fc1 = ColumnParallelLinear(hidden, 4 * hidden, tp)
        self.fc2 = RowParallelLinear(4 * hidden, hidden, tp)
        self.drop = nn.Dropout(dropout)
        self.causal: torch.Tensor
        mask = torch.ones(seq_len, seq_len, dtype=torch.bool).triu(1) if attention == "eager" else \
            torch.empty(0, 0, dtype=torch.bool)  # SDPA's causal flag needs none
        self.register_buffer("causal", mask, persistent=False)
        self.selective = False  # selective recomputation of core attention (Korthikanti et al.): set per stage

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        a, d = self.heads_local, self.head_dim
        qkv = self.qkv(self.ln1(x)).view(b, s, 3, a, d)
        if self.attention == "flash":
            # Views of the projection's output: SDPA keeps them and writes its output in the (b, s, a, d) layout,
            # so the projection's input below is a view of that output, not a second copy of it
            q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        else:
            # One contiguous (3, b, a, s, d) copy so the batched matmuls below save views of it rather than making
            # (and saving) their own copies of q, k and v; the 1/√d scale goes on the scores (a scalar multiply
            # saves nothing). The saved tensors are then exactly Korthikanti et al.'s count.
            q, k, v = qkv.permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        if self.selective:  # keep q, k, v; re-run scores, softmax and dropout in backward (RNG state restored)
            ctx = checkpoint(self._core_attention, q, k, v, use_reentrant=False)
        else:
            ctx = self._core_attention(q, k, v)
        x = x + self.drop(self.proj(ctx.transpose(1, 2).reshape(b, s, a * d)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh")))

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, a, s, d) context of causal attention: SDPA with the attention dropout (flash), or scores, softmax,
        dropout, ·V (eager); what selective recomputation re-runs. On CPU flash runs without attention dropout:
        torch's CPU flash kernel has none, and with it torch would fall back to its math kernel, which keeps the s²
        scores the plan said flash would not (the residual dropouts stay)."""
        if self.attention == "flash":
            return flash_attention(q, k, v, dropout_p=self.drop.p if self.training and q.is_cuda else 0.0)
        note_eager()
        s, d = q.shape[-2], q.shape[-1]
        scores = (torch.matmul(q, k.transpose(-1, -2)) * d ** -0.5).masked_fill(self.causal[:s, :s], float("-inf"))
        return torch.matmul(self.drop(torch.softmax(scores, dim=-1)), v)


def lm_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy (fp32 softmax) of the logits over the whole vocabulary (tp = 1; at tp > 1 the loss
    is :class:`ampe.runtime.tensor_parallel.VocabParallelLoss`)."""
    return vocab_parallel_cross_entropy(logits, labels, TpGroup.single())


def _layer_factory(model: Model, index: int, tp: TpGroup, dropout: float) -> tuple[type, tuple, dict]:
    """(class, args, kwargs) building layer ``index`` of the GPT pipe layout."""
    kind = model.layers[index].kind
    h = model.hidden
    if kind == "embedding":
        return Embedding, (model.vocab, h, model.seq_len, tp, dropout), {}
    if kind == "logits":
        return Embedding, (model.vocab, h, model.seq_len, tp, dropout), {"with_position": False}
    if kind == "transformer":
        return Block, (h, model.heads, model.seq_len, tp, dropout, model.attention), {}
    if kind == "norm":
        return nn.LayerNorm, (h,), {}
    return Noop, (), {}


class LogitsLayer(nn.Module):
    """Standalone tied LM head (for the profiler): an embedding (GPT's without positions, or Llama's) called through
    :func:`lm_head`."""
    def __init__(self, embedding: Any) -> None:
        super().__init__()
        self.embedding = embedding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return lm_head(self.embedding, x)


def build_layer(model: Model, index: int, tp: TpGroup | None = None, dropout: float = DEFAULT_DROPOUT) -> nn.Module:
    """One layer of ``model`` as a standalone module (what the profiler times)."""
    check_gpt_layout(model)
    cls, args, kwargs = _layer_factory(model, index, tp or TpGroup.single(), dropout)
    module = cls(*args, **kwargs)
    return LogitsLayer(module) if model.layers[index].kind == "logits" else module


def layer_specs(model: Model, tp: TpGroup, dropout: float = DEFAULT_DROPOUT) -> list[Any]:
    """DeepSpeed ``LayerSpec``/``TiedLayerSpec`` list, one per entry of ``model.layers``."""
    check_gpt_layout(model)
    specs: list[Any] = []
    for i, layer in enumerate(model.layers):
        cls, args, kwargs = _layer_factory(model, i, tp, dropout)
        if layer.kind == "embedding":
            specs.append(TiedLayerSpec(TIED_KEY, cls, *args, tied_weight_attr="word.weight", **kwargs))
        elif layer.kind == "logits":
            specs.append(TiedLayerSpec(TIED_KEY, cls, *args, forward_fn=lm_head, tied_weight_attr="word.weight",
                                       **kwargs))
        else:
            specs.append(LayerSpec(cls, *args, **kwargs))
    return specs
