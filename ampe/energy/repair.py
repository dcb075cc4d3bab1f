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

from ampe.energy.dag import ComputationDag
from ampe.energy.evaluate import LongestPath, OptionTable


def _speedup_tables(table: OptionTable) -> tuple[np.ndarray, np.ndarray]:
    """Per option row and current option c: the faster option with the least extra effective energy per second
    saved (first such option on ties) and that rate (+inf where no option is faster)."""
    t = table.time_s[np.unique(table.row_of, return_index=True)[1]]  # (rows, K), +inf padded
    eff = table.row_effective_j
    with np.errstate(divide="ignore", invalid="ignore"):
        rate = (eff[:, None, :] - eff[:, :, None]) / (t[:, :, None] - t[:, None, :])  # [row, current, faster]
    rate = np.where(t[:, None, :] < t[:, :, None], rate, np.inf)
    best = np.argmin(rate, axis=2)
    return best, np.take_along_axis(rate, best[..., None], axis=2)[..., 0]


def speed_up_through(dag: ComputationDag, table: OptionTable, choice: np.ndarray,
                     targets_s: Sequence[float]) -> list[np.ndarray | None]:
    """For each target (s, in decreasing order) a copy of the choice whose real iteration time is ≤ it, each
    continuing greedily from the previous one (None once even all-max cannot meet a target)."""
    choice = np.array(choice, copy=True)
    best, rate = _speedup_tables(table)
    row = table.row_of
    longest = LongestPath(dag, [float(table.time_s[v, c]) for v, c in enumerate(choice)])
    out: list[np.ndarray | None] = []
    stuck = False
    for target in targets_s:
        while not stuck:
            path, makespan = longest.path()
            if makespan <= target * (1 + 1e-12):
                break
            nodes = np.asarray(path, dtype=np.int64)
            r = rate[row[nodes], choice[nodes]]
            low = r.min()
            if not np.isfinite(low):
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
