"""Megatron-style tensor-parallel layers (column/row-parallel linear, vocab-parallel embedding and LM head) and the
vocab-parallel cross-entropy.

One tensor-parallel group of ``tp`` ranks holds one pipeline stage of one replica. Communication per transformer
block (Megatron, Shoeybi et al. 2019, §3): the column-parallel layers (attention qkv, MLP fc1 / gate and up) all-reduce
their *input gradient* in backward, the row-parallel layers (attention output, MLP fc2 / down) all-reduce their
*output* in forward, so a block does 2 all-reduces in forward and 2 in backward, each of ``mbs·seq·hidden`` elements.
The LM head computes this rank's slice of the vocabulary and the loss stays vocab-parallel
(:func:`vocab_parallel_cross_entropy`): no rank ever holds the logits of the whole vocabulary.

Weights are initialised as the full (tp = 1) matrix from torch's default generator and then sliced, so with the same
seed every shard is an exact slice of the tp = 1 layer (this is what makes the tp = 2 vs tp = 1 numerics check
possible, and it keeps shards of one replica consistent). Each sharded parameter carries its place in the full one
(:class:`Shard`, attribute ``ampe_shard``). With ``TpGroup.single()`` every layer degenerates to its plain torch
equivalent with no communication.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

SHARD_ATTR = "ampe_shard"


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


def new_tp_groups(pp: int, dp: int, tp: int) -> TpGroup:
    """Create one process group per (stage, replica) tensor-parallel group of a pp × dp × tp layout (ranks
    ``stage·dp·tp + replica·tp + shard``; every rank calls this, creating every group in the same order) and return
    this rank's. Needs the default process group."""
    rank = dist.get_rank()
    mine = TpGroup.single()
    for stage in range(pp):
        for replica in range(dp):
            ranks = [stage * dp * tp + replica * tp + k for k in range(tp)]
            group = dist.new_group(ranks=ranks)
            if rank in ranks:
                mine = TpGroup(tp, ranks.index(rank), group)
    return mine


@dataclass(frozen=True)
class Shard:
    """Where a parameter shard sits in the tp = 1 parameter: indices ``index`` along dimension ``dim`` (of ``full``).
    ``counted``: this rank's copy counts once in the gradient norm (False for a replicated K/V head's later
    copies)."""

    dim: int
    index: tuple[int, ...]
    full: int
    counted: bool = True


def _mark(p: nn.Parameter, dim: int, index: torch.Tensor, full: int, counted: bool = True) -> nn.Parameter:
    setattr(p, SHARD_ATTR, Shard(dim, tuple(index.tolist()), full, counted))
    return p


def _all_reduce(x: torch.Tensor, tp: TpGroup, op: Any = None) -> torch.Tensor:
    x = x.contiguous()
    dist.all_reduce(x, op=op or dist.ReduceOp.SUM, group=tp.group)
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


class _SumOverCopies(torch.autograd.Function):
    """Identity on a parameter held by several ranks (a replicated K/V head); in backward each copy's gradient
    becomes the sum over the ranks holding the same rows, so the copies stay equal (one all-reduce of a zero-padded
    full-size buffer over the tp group: K/V projections are small where heads are replicated)."""

    @staticmethod
    def forward(ctx, w, tp, rows, full):
        ctx.tp, ctx.rows, ctx.full = tp, rows, full
        return w

    @staticmethod
    def backward(ctx, g):
        buf = g.new_zeros((ctx.full, *g.shape[1:]))
        buf[ctx.rows] = g
        return _all_reduce(buf, ctx.tp)[ctx.rows], None, None, None


def copy_to_tp(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Enter a tensor-parallel region (gradient all-reduced in backward)."""
    return x if tp.size == 1 else _CopyToTp.apply(x, tp)


def reduce_from_tp(x: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Leave a tensor-parallel region by summing the partial results of all shards."""
    return x if tp.size == 1 else _ReduceFromTp.apply(x, tp)


def _full_linear_weight(out_features: int, in_features: int) -> torch.Tensor:
    """The tp = 1 weight as ``nn.Linear`` would initialise it (kaiming-uniform, a = √5)."""
    w = torch.empty(out_features, in_features)
    nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    return w


def _full_linear_bias(out_features: int, in_features: int) -> torch.Tensor:
    bound = 1 / math.sqrt(in_features)
    return torch.empty(out_features).uniform_(-bound, bound)


def column_rows(out_features: int, tp: TpGroup, groups: int = 1) -> torch.Tensor:
    """Rows of a column-parallel weight this rank holds: its 1/tp of each of ``groups`` equal blocks."""
    per_group = out_features // groups
    local = tp.shard(per_group, "output features per group")
    return torch.cat([torch.arange(g * per_group + tp.rank * local, g * per_group + (tp.rank + 1) * local)
                      for g in range(groups)])


class ColumnParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with W split by output rows; each rank produces its slice of ``y`` (no forward comm).

    ``groups`` > 1 views the output as ``groups`` equal blocks (e.g. q, k, v) and shards each block, so a rank holds
    whole attention heads of q, k and v. ``rows`` names the rows of the tp = 1 weight this rank holds instead
    (grouped-query K/V heads), ``copies`` how many ranks hold the same rows (their gradients are summed over them).
    """

    def __init__(self, in_features: int, out_features: int, tp: TpGroup, groups: int = 1, bias: bool = True,
                 rows: torch.Tensor | None = None, copies: int = 1) -> None:
        super().__init__()
        self.tp, self.copies, self.out_features = tp, copies, out_features
        rows = column_rows(out_features, tp, groups) if rows is None else rows
        counted = tp.rank % copies == 0
        w = _full_linear_weight(out_features, in_features)
        self.weight = _mark(nn.Parameter(w[rows].clone()), 0, rows, out_features, counted)
        self.bias = (_mark(nn.Parameter(_full_linear_bias(out_features, in_features)[rows].clone()), 0, rows,
                           out_features, counted) if bias else None)
        self.rows = rows  # which rows of the tp = 1 weight this shard holds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.local(copy_to_tp(x, self.tp))

    def local(self, x: torch.Tensor) -> torch.Tensor:
        """The product on an input already inside the tensor-parallel region (one :func:`copy_to_tp` shared by
        several projections of the same input: one input-gradient all-reduce for all of them)."""
        w, b = self.weight, self.bias
        if self.copies > 1:
            w = _SumOverCopies.apply(w, self.tp, self.rows, self.out_features)
            b = None if b is None else _SumOverCopies.apply(b, self.tp, self.rows, self.out_features)
        return F.linear(x, w, b)


class RowParallelLinear(nn.Module):
    """``y = x Wᵀ + b`` with W split by input columns; partial products are all-reduced in forward."""

    def __init__(self, in_features: int, out_features: int, tp: TpGroup, bias: bool = True) -> None:
        super().__init__()
        self.tp = tp
        local = tp.shard(in_features, "input features")
        w = _full_linear_weight(out_features, in_features)
        cols = torch.arange(tp.rank * local, (tp.rank + 1) * local)
        self.weight = _mark(nn.Parameter(w[:, cols].clone()), 1, cols, in_features)
        # added once, after the reduction
        self.bias = nn.Parameter(_full_linear_bias(out_features, in_features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = reduce_from_tp(F.linear(x, self.weight), self.tp)
        return y if self.bias is None else y + self.bias


class _VocabLookup(torch.autograd.Function):
    """Rows of this rank's vocabulary slice for the tokens inside it, zeros for the others. Keeps only the local
    indices for backward (int64, −1 for a token outside the slice): the 8 bytes per token of a plain lookup."""

    @staticmethod
    def forward(ctx, tokens, weight, start):
        rows = weight.shape[0]
        local = tokens - start
        outside = (local < 0) | (local >= rows)
        out = F.embedding(local.masked_fill(outside, 0), weight).masked_fill_(outside.unsqueeze(-1), 0.0)
        ctx.save_for_backward(local.masked_fill_(outside, -1))
        ctx.rows = rows
        return out

    @staticmethod
    def backward(ctx, g):
        (local,) = ctx.saved_tensors
        inside = local >= 0
        grad = g.new_zeros((ctx.rows, g.shape[-1]))
        grad.index_put_((local[inside],), g[inside], accumulate=True)
        return None, grad, None


def _normal_rows(vocab: int, hidden: int, tp: TpGroup) -> nn.Parameter:
    """This rank's slice of a ``vocab × hidden`` matrix drawn whole (normal, std 0.02)."""
    local = tp.shard(vocab, "vocab")
    full = torch.empty(vocab, hidden)
    nn.init.normal_(full, std=0.02)
    rows = torch.arange(tp.rank * local, (tp.rank + 1) * local)
    return _mark(nn.Parameter(full[rows].clone()), 0, rows, vocab)


class VocabParallelEmbedding(nn.Module):
    """Token embedding with the vocabulary split over ranks; each rank looks up its rows, results are summed
    (1 all-reduce in forward). ``weight`` is this rank's ``vocab/tp × hidden`` slice."""

    def __init__(self, vocab: int, hidden: int, tp: TpGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = _normal_rows(vocab, hidden, tp)
        self.start = tp.rank * self.weight.shape[0]
        self.stop = self.start + self.weight.shape[0]
        # A frozen input embedding whose tied weight still trains through the LM head looks it up detached, so the
        # lookup runs forward only (ampe.runtime.freeze).
        self.frozen_lookup = False

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        weight = self.weight.detach() if self.frozen_lookup else self.weight
        if self.tp.size == 1:
            return F.embedding(tokens, weight)
        return reduce_from_tp(_VocabLookup.apply(tokens, weight, self.start), self.tp)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Tied LM head: ``x · Eᵀ`` for this rank's slice of the vocabulary (the input gradient is all-reduced in
        backward); the loss takes the slices as they are (:func:`vocab_parallel_cross_entropy`)."""
        return F.linear(copy_to_tp(x, self.tp), self.weight)


class VocabParallelLmHead(nn.Module):
    """Untied LM head without bias: the logits of this rank's slice of the vocabulary (``vocab/tp × hidden`` weight,
    drawn whole with std 0.02 and sliced)."""

    def __init__(self, vocab: int, hidden: int, tp: TpGroup) -> None:
        super().__init__()
        self.tp = tp
        self.weight = _normal_rows(vocab, hidden, tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(copy_to_tp(x, self.tp), self.weight)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Per-token cross-entropy of vocab-parallel logits (Megatron's): local max → all-reduce max, local sum of
    exp → all-reduce sum, the target's logit from the rank owning it → all-reduce sum; backward softmax minus the
    one-hot, on this rank's slice. Holds one fp32 copy of the local logits (it becomes the softmax, which is saved
    and turned into the gradient in place); the gradient goes back in the logits' dtype."""

    @staticmethod
    def forward(ctx, local, labels, tp, start):
        work = local.to(torch.float32, copy=True)
        peak = _all_reduce(torch.amax(work, dim=-1), tp, dist.ReduceOp.MAX)
        work.sub_(peak.unsqueeze(-1))
        rows = work.shape[-1]
        index = labels - start
        inside = (index >= 0) & (index < rows)
        index.masked_fill_(~inside, 0)
        target = work.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill_(~inside, 0.0)
        target = _all_reduce(target, tp)
        total = _all_reduce(work.exp_().sum(dim=-1), tp)
        work.div_(total.unsqueeze(-1))  # the softmax over the whole vocabulary, this rank's slice of it
        ctx.save_for_backward(work, index.masked_fill_(~inside, -1))
        ctx.dtype = local.dtype
        return total.log_() - target

    @staticmethod
    def backward(ctx, g):
        grad, index = ctx.saved_tensors
        inside = index >= 0
        rows = torch.nonzero(inside).squeeze(-1)
        grad[rows, index[rows]] -= 1.0
        grad.mul_(g.unsqueeze(-1))
        return grad.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(local_logits: torch.Tensor, labels: torch.Tensor, tp: TpGroup) -> torch.Tensor:
    """Mean token cross-entropy (fp32 softmax) of logits split by vocabulary over the tensor-parallel group.

    Args:
        local_logits: (..., vocab/tp) this rank's slice of the logits (the LM head's output), any float dtype.
        labels: (...) int64 target token ids over the whole vocabulary.
        tp: this rank's group; at tp = 1 the plain ``F.cross_entropy`` of the logits upcast to fp32.

    Returns:
        The mean loss, equal on every rank of the group (a 0-dim fp32 tensor)."""
    rows = local_logits.shape[-1]
    if tp.size == 1:
        return F.cross_entropy(local_logits.float().view(-1, rows), labels.view(-1))
    losses = _VocabParallelCrossEntropy.apply(local_logits.reshape(-1, rows), labels.reshape(-1), tp,
                                              tp.rank * rows)
    return losses.mean()


class VocabParallelLoss:
    """``loss_fn(outputs, labels)`` for DeepSpeed's ``PipelineModule``: :func:`vocab_parallel_cross_entropy` on
    this rank's group."""

    def __init__(self, tp: TpGroup) -> None:
        self.tp = tp

    def __call__(self, local_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return vocab_parallel_cross_entropy(local_logits, labels, self.tp)


def mark_grad_norm_owners(module: nn.Module, tp: TpGroup) -> int:
    """Set DeepSpeed's ``model_parallel`` flag so that the gradient norm (gradient clipping) counts every parameter
    of the model exactly once across the pipeline and tensor-parallel ranks: a shard on every rank holding it (a
    replicated K/V head on its first rank only), a replicated parameter (norms, row-parallel biases) on tp rank 0,
    a tied copy DeepSpeed marks ``ds_pipe_replicated`` nowhere (its first stage counts it). Without it, DeepSpeed's
    fp32 clipping counts only the first stage's and first shard's parameters. Returns how many are flagged."""
    flagged = 0
    for p in module.parameters():
        shard = getattr(p, SHARD_ATTR, None)
        if getattr(p, "ds_pipe_replicated", False):
            counted = False
        else:
            counted = shard.counted if shard is not None else tp.rank == 0
        p.model_parallel = counted  # type: ignore[attr-defined]  # DeepSpeed reads it (is_model_parallel_parameter)
        flagged += counted
    return flagged
