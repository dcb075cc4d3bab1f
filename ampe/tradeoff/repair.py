"""Greedy real-time repair of a clock choice: speed up the real critical path until a target time is met.

PD plans in whole units of τ, so its fastest plan (every critical computation at its fastest option in quantized
time, non-critical ones slowed into quantized slack) can realize a little slower than all clocks at maximum.
:func:`speed_up_to` closes that gap: while the real critical path is longer than the target, it moves the
computation on it with the cheapest speed-up (least extra effective energy per second saved) to that faster
option. Used only to fill the frontier between the real T_min and PD's fastest realized point.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import LongestPath, OptionTable


def speed_up_through(dag: ComputationDag, table: OptionTable, choice: np.ndarray, targets_s: Sequence[float],
                     max_moves: int | None = None, max_work: int | None = None) -> list[np.ndarray | None]:
    """For each target (s, in decreasing order) a copy of the choice whose real iteration time is ≤ it, each
    continuing greedily from the previous one (None once even all-max cannot meet a target, after ``max_moves``
    option changes, or once the longest-path updates have recomputed more than ``max_work`` nodes: each move
    re-propagates to the descendants whose finish moves, so on large pipelines the moves and their propagation
    both grow with the computations and the whole chain is quadratic)."""
    choice = np.array(choice, copy=True)
    best, rate = table.speedups
    row = table.row_of
    longest = LongestPath(dag, table.time_s[np.arange(len(choice)), choice].tolist())
    out: list[np.ndarray | None] = []
    stuck = False
    moves = 0
    for target in targets_s:
        while not stuck:
            path, makespan = longest.path()
            if makespan <= target * (1 + 1e-12):
                break
            nodes = np.asarray(path, dtype=np.int64)
            r = rate[row[nodes], choice[nodes]]
            low = r.min()
            moves += 1
            if (not np.isfinite(low) or (max_moves is not None and moves > max_moves)
                    or (max_work is not None and longest.updates > max_work)):
                stuck = True
                break
            v = int(nodes[r == low].min())  # ties: the lowest node id
            k = int(best[row[v], choice[v]])
            choice[v] = k
            longest.set_time(v, float(table.time_s[v, k]))
        out.append(None if stuck else choice.copy())
    return out


def speed_up_to(dag: ComputationDag, table: OptionTable, choice: np.ndarray, target_s: float) -> np.ndarray | None:
    """A copy of ``choice`` whose real iteration time is ≤ ``target_s`` (None if even all-max cannot meet it)."""
    return speed_up_through(dag, table, choice, [target_s])[0]
