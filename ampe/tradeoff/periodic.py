"""Many identical micro-batches: the LP of :func:`~ampe.tradeoff.direct.relaxed_plan` over one period of the pipeline.

A 1F1B iteration of N stages and M micro-batches repeats itself between its warm-up and its drain: at every clock
maximum, each computation of micro-batch m + b starts a fixed P seconds after the same computation of micro-batch m
(b, the cyclicity, is 1 to a few micro-batches where the critical cycle spans several: GPT-3 175B on the 1,024-GPU
three-type cluster has b = 4 for its 16 × 64 pipelines and 10 for 32 × 128). The LP of the point at a deadline has
about 2·N·M computations (32 stages × 128 micro-batches: 8,192, seconds of HiGHS each). :func:`periodic_fold` keeps
the first W micro-batches (W = N, or 2N or 3N where the all-max transient lasts longer) and the last N as they are,
and folds the middle ones onto one block of b: micro-batch m of the middle is the class of slot (m − W) mod b,
started ⌊(m − W) / b⌋ periods P later, P a variable of the LP. So the LP has W + b + N micro-batches' computations
whatever M, and every dependency of the DAG is one of its rows (``relaxed_plan`` says how): its schedules are
schedules of the whole DAG — the best periodic one at the deadline. The all-max schedule is one of them when its
middle repeats with period b (checked here), so the folded LP has a solution at every deadline the DAG can meet.
:func:`~ampe.tradeoff.direct.point_by` rounds and polishes on the whole DAG as before, and solves the whole LP when
nothing folds.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampe.tradeoff.dag import ComputationDag

MIN_FOLDED = 8  # fold only when at least this many middle micro-batches become one block …
WARMUP_STAGES = 3  # the warm-up kept whole is N, 2N or 3N micro-batches: the first from which the middle repeats
FOLD_FROM = 4096  # … and the DAG has at least this many computations (below, the whole LP takes well under a second
# and is kept: the best periodic schedule can cost a little more, up to +0.4 % of a plan's energy measured)


@dataclass(frozen=True, eq=False)
class Fold:
    """Per computation of a DAG (in node order, computations only): its class and its offset in periods."""

    cls: np.ndarray  # (computations,) class index 0..classes−1
    offset: np.ndarray  # (computations,) periods after its class's start
    block: int  # micro-batches per period


def periodic_fold(dag: ComputationDag, finish_s: np.ndarray, fold_from: int = FOLD_FROM) -> Fold | None:
    """The fold of a 1F1B DAG (module docstring) whose all-max schedule finishes its nodes at ``finish_s`` (s, one
    per node): the shortest warm-up W (N, 2N or 3N micro-batches, N the stages), then the smallest block b of at
    most N micro-batches, after which that schedule's middle repeats with period b (to 1e-9 of the makespan). None
    for another schedule, a DAG of fewer than ``fold_from`` computations (default :data:`FOLD_FROM`), too few
    micro-batches to fold (fewer than :data:`MIN_FOLDED`, or than two blocks), or no such block."""
    if dag.schedule != "1f1b":
        return None
    m, edge = dag.num_microbatches, dag.num_stages
    ops = np.flatnonzero(dag.computation_mask)
    if len(ops) < fold_from:
        return None
    mb = np.fromiter((dag.nodes[v].microbatch for v in ops.tolist()), dtype=np.int64, count=len(ops))
    spec = dag.spec_of[ops]  # (stage, instruction) of a computation
    kinds, kind = np.unique(spec, return_inverse=True)
    kind = kind.reshape(-1)
    if len(ops) != len(kinds) * m:
        return None
    at = np.empty((len(kinds), m))  # finish of (stage and instruction, micro-batch)
    at[kind, mb] = finish_s[ops]
    tol = 1e-9 * float(np.max(finish_s[ops]))
    for lead in range(edge, WARMUP_STAGES * edge + 1, edge):  # a longer transient: a longer warm-up kept whole
        for b in range(1, edge + 1):
            head = lead + (m - lead - edge) % b  # the middle is a whole number of blocks
            middle = m - head - edge
            if middle < max(MIN_FOLDED, 2 * b):
                break
            step = at[:, head + b: head + middle] - at[:, head: head + middle - b]
            if np.all(np.abs(step[0] - step[0, 0]) <= tol) and np.all(np.abs(step - step[0, 0]) <= tol):
                return _fold(mb, kind, head, middle, b)
    return None


def _fold(mb: np.ndarray, kind: np.ndarray, head: int, middle: int, b: int) -> Fold:
    """Classes and offsets: micro-batches before ``head`` as they are, the ``middle`` ones folded onto a block of
    ``b`` slots, the rest (the drain) after that block, ``middle / b − 1`` periods later."""
    j = mb - head
    tail = j >= middle
    slot = np.where(j < 0, mb, np.where(tail, mb - middle + b, head + j % b))
    offset = np.where(j < 0, 0, np.where(tail, middle // b - 1, j // b))
    _, cls = np.unique(kind * (head + b + (mb.max() + 1)) + slot, return_inverse=True)
    return Fold(cls.reshape(-1).astype(np.int64), offset.astype(np.int64), b)
