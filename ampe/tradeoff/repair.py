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


def _speedup_tables(table: OptionTable) -> tuple[np.ndarray, np.ndarray]:
    """Per option row and current option c: the faster option with the least extra effective energy per second
    saved (first such option on ties) and that rate (+inf where no option is faster). Rows with the same times and
    energies (stages of one GPU type and time) are computed once."""
    t_all = table.time_s[np.unique(table.row_of, return_index=True)[1]]  # (rows, K), +inf padded
    k = t_all.shape[1]
    best = np.zeros((len(t_all), k), dtype=np.int64)
    rate = np.full((len(t_all), k), np.inf)
    groups: dict[bytes, list[int]] = {}
    for row in np.flatnonzero(np.isfinite(t_all).sum(axis=1) > 1).tolist():  # rows with a choice (not transfers)
        groups.setdefault(t_all[row].tobytes() + table.row_effective_j[row].tobytes(), []).append(row)
    if not groups:
        return best, rate
    first = [g[0] for g in groups.values()]
    t = t_all[first]
    eff = table.row_effective_j[first]
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (eff[:, None, :] - eff[:, :, None]) / (t[:, :, None] - t[:, None, :])  # [row, current, faster]
    r = np.where(t[:, None, :] < t[:, :, None], r, np.inf)
    b = np.argmin(r, axis=2)
    low = np.take_along_axis(r, b[..., None], axis=2)[..., 0]
    for i, rows in enumerate(groups.values()):
        best[rows] = b[i]
        rate[rows] = low[i]
    return best, rate


def speed_up_through(dag: ComputationDag, table: OptionTable, choice: np.ndarray, targets_s: Sequence[float],
                     max_moves: int | None = None, max_work: int | None = None) -> list[np.ndarray | None]:
    """For each target (s, in decreasing order) a copy of the choice whose real iteration time is ≤ it, each
    continuing greedily from the previous one (None once even all-max cannot meet a target, after ``max_moves``
    option changes, or once the longest-path updates have recomputed more than ``max_work`` nodes: each move
    re-propagates to the descendants whose finish moves, so on large pipelines the moves and their propagation
    both grow with the computations and the whole chain is quadratic)."""
    choice = np.array(choice, copy=True)
    best, rate = _speedup_tables(table)
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
