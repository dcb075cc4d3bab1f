"""AMP's own layer-assignment DP (``pipe_ast`` in MccRee177/AMP ``src/pipe.py``), kept to reproduce its partitions.

AMP handles the max term of Eq. 5 with a *tolerance* m ranging over every contiguous sum of layer times (plus 0):
``dp[i][j][m]`` is the best cost of layers 0..i in j+1 stages when stage times up to m are free (Eq. 6-8). The
identity (Eq. 12 = Eq. 13)

    max(0, t1 - max(t2, m)) + max(0, t2 - m) == max(0, max(t1, t2) - m)

makes the max term decompose when the prefix is queried at tolerance ``max(t2, m)``.

``quirk=True`` reproduces the reference code exactly, including its inconsistency (amp.md §3.4): the value stored
for the best cut omits that cut's P2P term while the comparison includes it. AMP then re-costs the returned
partition with ``pipe_cost`` (Eq. 5); so do we. ``quirk=False`` is the consistent DP, exact for Eq. 5 (it must match
brute force) but O(pp·L⁴) like the paper says; use :func:`ampe.dp_assign.solve` instead in real work.

Only stage-independent layer times are supported, as in AMP. Arithmetic follows the reference order (sequential
left-to-right segment sums, exact float keys for the tolerance) so ties break the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np


def tolerance_identity(t1: float, t2: float, m: float) -> tuple[float, float]:
    """Both sides of AMP's Eq. 12 = Eq. 13 (returned as (lhs, rhs)); they are equal for all real t1, t2, m."""
    lhs = max(0, t1 - max(t2, m)) + max(0, t2 - m)
    rhs = max(0, max(t1, t2) - m)
    return lhs, rhs


def segment_sums(layer_s: Sequence[float] | np.ndarray) -> np.ndarray:
    """(L+1, L+1) table ``[a, b]`` = Σ layer_s[a:b] summed left to right (Python ``sum`` order), 0 on/below diag."""
    t = np.asarray(layer_s, dtype=float)
    n = len(t)
    seg = np.zeros((n + 1, n + 1))
    for a in range(n):
        seg[a, a + 1:] = np.cumsum(t[a:])
    return seg


def amp_pipe_cost(layer_s: Sequence[float] | np.ndarray, cost_c: np.ndarray, gas: int,
                  partition: Sequence[int]) -> float:
    """AMP's ``pipe_cost`` (Eq. 5): (gas-1)·max stage + Σ cost_c[last layer of stage j, j] + Σ layer_s, seconds.

    ``cost_c`` is AMP's (L-1, pp-1) table: ``cost_c[k, j]`` = P2P seconds at boundary j when stage j ends at layer k.
    """
    t = np.asarray(layer_s, dtype=float)
    p = list(partition)
    stages = [float(t[a:b].sum()) for a, b in itertools.pairwise(p)]
    comm = sum(float(cost_c[p[j + 1] - 1, j]) for j in range(len(p) - 2))
    return (gas - 1) * max(stages) + comm + float(t.sum())


def amp_pipe_ast(layer_s: Sequence[float], cost_c: np.ndarray, pp: int, gas: int,
                 quirk: bool = True) -> tuple[tuple[int, ...], float]:
    """AMP's tolerance DP. Returns (DeepSpeed boundaries, Eq. 5 cost of that partition in seconds).

    ``layer_s``: (L,) seconds per layer (every stage equally fast). ``cost_c``: (L-1, pp-1) as in
    :func:`amp_pipe_cost`. ``gas``: micro-batches per iteration. Raises ValueError when pp > L.
    """
    t = np.asarray(layer_s, dtype=float)
    n = len(t)
    if pp < 1 or pp > n:
        raise ValueError(f"cannot split {n} layers into {pp} stages")
    cc = np.asarray(cost_c, dtype=float).reshape(n - 1, pp - 1) if pp > 1 else np.zeros((max(n - 1, 0), 0))
    if pp == 1:
        part = (0, n)
        return part, amp_pipe_cost(t, cc, gas, part)
    seg = segment_sums(t)
    upper = seg[np.triu_indices(n + 1, 1)]
    possible = np.unique(np.concatenate([[0.0], upper]))  # AMP's sorted(set(...)) of tolerances
    nm = len(possible)
    m_idx = np.arange(nm)
    seg_idx = np.searchsorted(possible, seg)  # exact: every segment sum is in `possible`
    gas1 = gas - 1

    # cost[j][i, m]: best value for layers 0..i in j+1 stages at tolerance possible[m]; arg = last cut (layer index).
    cost = np.full((pp, n, nm), np.inf)
    arg = np.full((pp, n, nm), -1, dtype=np.int64)
    cost[0] = gas1 * np.maximum(0.0, seg[0, 1:, None] - possible[None, :])
    for j in range(1, pp):
        best = np.full((n, nm), np.inf)
        best_arg = np.full((n, nm), -1, dtype=np.int64)
        for cut in range(j - 1, n - 1):  # ascending, like the reference; rows i > cut are updated together
            rows = slice(max(cut + 1, j), n)
            cur = seg[cut + 1, cut + 2:n + 1][max(cut + 1, j) - cut - 1:]  # Σ layer_s[cut+1 .. i]
            ic = seg_idx[cut + 1, cut + 2:n + 1][max(cut + 1, j) - cut - 1:]
            prev = cost[j - 1, cut][np.maximum(ic[:, None], m_idx[None, :])]
            cand = prev + gas1 * np.maximum(0.0, cur[:, None] - possible[None, :])
            cand = cand + cc[cut, j - 1]
            upd = cand < best[rows]
            stored = cand - cc[cut, j - 1] if quirk else cand
            best[rows] = np.where(upd, stored, best[rows])
            best_arg[rows] = np.where(upd, cut, best_arg[rows])
        cost[j], arg[j] = best, best_arg

    sizes = []
    i, m = n - 1, 0
    for j in range(pp - 1, 0, -1):
        cut = int(arg[j, i, m])
        sizes.append(i - cut)
        m = max(int(seg_idx[cut + 1, i + 1]), m)
        i = cut
    sizes.append(i + 1)
    bounds = (0, *tuple(int(x) for x in np.cumsum(sizes[::-1])))
    return bounds, amp_pipe_cost(t, cc, gas, bounds)
