"""Megatron-style tensor-parallel layers (column/row-parallel linear, vocab-parallel embedding and LM head).

One tensor-parallel group of ``tp`` ranks holds one pipeline stage of one replica. Communication per transformer
block (Megatron, Shoeybi et al. 2019, §3): the column-parallel layers (attention qkv, MLP fc1) all-reduce their
*input gradient* in backward, the row-parallel layers (attention proj, MLP fc2) all-reduce their *output* in forward,
so a block does 2 all-reduces in forward and 2 in backward, each of ``mbs·seq·hidden`` elements.

Weights are initialised as the full (tp = 1) matrix from torch's default generator and then sliced, so with the same
seed every shard is an exact slice of the tp = 1 layer (this is what makes the tp = 2 vs tp = 1 numerics check
possible, and it keeps shards of one replica consistent). With ``TpGroup.single()`` every layer degenerates to its
plain torch equivalent with no communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class TpGroup:
    """This rank's tensor-parallel group: ``size`` ranks, this one at ``rank``; ``group`` is a torch ProcessGroup."""

    size: int = 1
    rank: int = 0
    group: Any = None

    @staticmethod
    def single() -> TpGroup:
        """No tensor parallelism (tp = 1)."""
        return TpGroup(1, 0, None)

    def shard(self, n: int, what: str) -> int:
        """Size of this rank's slice of a dimension of ``n`` (which must divide evenly)."""
        if n % self.size:
            raise ValueError(f"{what}={n} is not divisible by tp={self.size}")
        return n // self.size


def _all_reduce(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, group=tp.group)
    return x


class _CopyToTp(torch.autograd.Function):
    """Identity in forward, all-reduce of the gradient in backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        return x

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g.clone(), ctx.tp), None


class _ReduceFromTp(torch.autograd.Function):
    """All-reduce in forward, identity in backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x, tp):
        return _all_reduce(x.clone(), tp)

    @staticmethod
    def backward(ctx, g):
        return g, None


class _GatherLastDim(torch.autograd.Function):
    """All-gather along the last dimension in forward, keep this rank's slice of the gradient in backward."""

    @staticmethod
    def forward(ctx, x, tp):
        ctx.tp = tp
        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(tp.size)]
        dist.all_gather(parts, x, group=tp.group)
        return torch.cat(parts, dim=-1)

    @staticmethod
    def backward(ctx, g):
        n = g.shape[-1] // ctx.tp.size
        return g[..., ctx.tp.rank * n:(ctx.tp.rank + 1) * n].contiguous(), None


def copy_to_tp(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Enter a tensor-parallel region (gradient all-reduced in backward)."""
    return x if tp.size == 1 else _CopyToTp.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Leave a tensor-parallel region by summing the partial results of all shards."""
    return x if tp.size == 1 else _ReduceFromTp.apply(x, tp)


def gather_last_dim(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Concatenate every shard's slice of the last dimension."""
    return x if tp.size == 1 else _GatherLastDim.apply(x, tp)


def _full_linear_weight(out_features: int, in_features: int) -> torch.Tensor:
    """The tp = 1 weight as ``nn.Linear`` would initialise it (kaiming-uniform, a = √5)."""
    w = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    return w


def _full_linear_bias(out_features: int, in_features: int) -> torch.Tensor:
    bound = 1 / math.sqrt(in_features)
    return torch.empty(out_features).uniform_(-bound, bound)


class ColumnParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with W split by output rows; each rank produces its slice of ``y`` (no forward comm).

    ``groups`` > 1 views the output as ``groups`` equal blocks (e.g. q, k, v) and shards each block, so a rank holds
    whole attention heads of q, k and v."""

    def __init__(self, in_features: int, out_features: int, tp: TpGroup, groups: int = 1) -> None:
        super().__init__()
        self.tp = tp
        per_group = out_features // groups
        local = tp.shard(per_group, "output features per group")
        w, b = _full_linear_weight(out_features, in_features), _full_linear_bias(out_features, in_features)
        rows = torch.cat([torch.arange(g * per_group + tp.rank * local, g * per_group + (tp.rank + 1) * local)
                          for g in range(groups)])
        self.weight = nn.Parameter(w[rows].clone())
        self.bias = nn.Parameter(b[rows].clone())
        self.rows = rows  # which rows of the tp = 1 weight this shard holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.tp), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with W split by input columns; partial products are all-reduced in forward."""

    def __init__(self, in_features: int, out_features: int, tp: TpGroup) -> None:
        super().__init__()
        self.tp = tp
        local = tp.shard(in_features, "input features")
        w, b = _full_linear_weight(out_features, in_features), _full_linear_bias(out_features, in_features)
        self.weight = nn.Parameter(w[:, tp.rank * local:(tp.rank + 1) * local].clone())
        self.bias = nn.Parameter(b.clone())  # added once, after the reduction

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return reduce_from_tp(F.linear(x, self.weight), self.tp) + self.bias


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the vocabulary split over ranks; each rank looks up its rows, results are summed
    (1 all-reduce in forward). ``weight`` is this rank's ``vocab/tp × hidden`` slice."""

    def __init__(self, vocab: int, hidden: int, tp: TpGroup) -> None:
        super().__init__()
        self.tp = tp
        local = tp.shard(vocab, "vocab")
        self.start, self.stop = tp.rank * local, (tp.rank + 1) * local
        full = torch.empty(vocab, hidden)
        nn.init.normal_(full, std=0.02)
        self.weight = nn.Parameter(full[self.start:self.stop].clone())
        # A frozen input embedding whose tied weight still trains through the LM head looks it up detached, so the
        # lookup runs forward only (ampe.runtime.freeze).
        self.frozen_lookup = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        weight = self.weight.detach() if self.frozen_lookup else self.weight
        if self.tp.size == 1:
            return F.embedding(tokens, weight)
        outside = (tokens < self.start) | (tokens >= self.stop)
        local = (tokens - self.start).masked_fill(outside, 0)
        out = F.embedding(local, weight).masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(out, self.tp)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Tied LM head: ``x · Eᵀ`` over the full vocabulary (each rank computes its vocab slice, then all-gather;
        the input gradient is all-reduced in backward)."""
        local = F.linear(copy_to_tp(x, self.tp), self.weight)
        return gather_last_dim(local, self.tp)
