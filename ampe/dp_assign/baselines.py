"""Baseline partitions that frameworks use without a cost model.

* :func:`uniform_layers`: DeepSpeed ``partition_method="uniform"`` / Megatron: ⌊L/pp⌋ layers each, the remainder to
  the earliest stages.
* :func:`uniform_by_count`: AMP's ``pipe_gpt2`` rule (its Megatron baseline and its gas == 1 fallback): the *counted*
  layers (transformer blocks) are split evenly, remainder to the earliest stages, and every boundary sits right
  before the first counted layer of the next stage, so leading entries go to the first stage and trailing entries to
  the stage of the last block before them. GPT-2 (30 entries) pp=2 → [0,14,30], pp=4 → [0,8,14,20,30].
* :func:`balanced_partition`: DeepSpeed's ``partition_balanced`` (used by ``parameters`` and ``type:<regex>``): a DP
  that minimises the *range* (max − min) of the stage weights, ties to the latest cut. Reimplemented exactly
  (vectorised) so ampe does not need DeepSpeed to plan.
* :func:`uniform_parameters`: DeepSpeed ``partition_method="parameters"`` = balanced over parameter counts.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ampe.costmodel.strategy import uniform_partition


def uniform_layers(num_layers: int, pp: int) -> tuple[int, ...]:
    """DeepSpeed/Megatron uniform split: boundaries giving ⌊L/pp⌋ layers per stage, remainder first."""
    _check(num_layers, pp)
    return uniform_partition(num_layers, pp)


def uniform_by_count(counted: Sequence[bool], pp: int) -> tuple[int, ...]:
    """AMP's ``pipe_gpt2`` rule: split the counted layers evenly (remainder first), boundaries before counted layers.

    ``counted[i]`` is true for layers that count (e.g. transformer blocks). Raises ValueError when there are fewer
    counted layers than stages.
    """
    idx = [i for i, c in enumerate(counted) if c]
    if pp > len(idx):
        raise ValueError(f"{pp} stages but only {len(idx)} counted layers")
    sizes = np.diff(uniform_partition(len(idx), pp))
    cum = np.cumsum(sizes)[:-1]
    return (0, *tuple(idx[int(k)] for k in cum), len(counted))


def balanced_partition(weights: Sequence[float], pp: int) -> tuple[int, ...]:
    """DeepSpeed ``partition_balanced``: minimise max − min of the stage weight sums (ties → latest cut).

    Same result as ``deepspeed.runtime.utils.partition_balanced`` for ``len(weights) ≥ pp``.
    """
    n = len(weights)
    _check(n, pp)
    if n == pp:
        return tuple(range(n + 1))
    prefix = np.zeros(n + 1)
    prefix[1:] = np.cumsum(np.asarray(weights, dtype=float))
    dp_max = np.full((n + 1, pp + 1), np.inf)
    dp_min = np.full((n + 1, pp + 1), np.inf)
    position = np.zeros((n + 1, pp + 1), dtype=np.int64)
    dp_max[0, 0] = 0.0
    for i in range(1, n + 1):
        seg = prefix[i] - prefix[:i]
        for j in range(1, min(i, pp) + 1):
            hi = np.maximum(dp_max[:i, j - 1], seg)
            lo = np.minimum(dp_min[:i, j - 1], seg)
            cost = hi - lo
            k = i - 1 - int(np.argmin(cost[::-1]))  # DeepSpeed updates on `>=`, so the last minimum wins
            dp_max[i, j], dp_min[i, j], position[i, j] = hi[k], lo[k], k
    parts = [n]
    for j in range(pp, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(reversed(parts))


def uniform_parameters(params: Sequence[float], pp: int) -> tuple[int, ...]:
    """DeepSpeed ``partition_method="parameters"``: balance parameter counts per stage."""
    return balanced_partition(params, pp)


def _check(num_layers: int, pp: int) -> None:
    if pp < 1 or num_layers < pp:
        raise ValueError(f"cannot split {num_layers} layers into {pp} non-empty stages")
