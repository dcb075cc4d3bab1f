"""Greedy real-time repair of a clock choice: speed up the real critical path until a target time is met.

PD plans in whole units of τ, so its fastest plan (every critical computation at its fastest option in quantized
time, non-critical ones slowed into quantized slack) can realize a little slower than all clocks at maximum.
:func:`speed_up_to` closes that gap: while the real critical path is longer than the target, it moves the
computation on it with the cheapest speed-up (least extra effective energy per second saved) to that faster
option. Used only to fill the frontier between the real T_min and PD's fastest realized point.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from ampe.energy.dag import ComputationDag
from ampe.energy.evaluate import LongestPath, OptionTable


def _best_speedup(table: OptionTable, v: int, current: int) -> tuple[int, float] | None:
    """(faster option of node v with the least extra effective energy per second saved, that rate), or None."""
    t, eff = table.time_s[v], table.effective_j[v]
    best = None
    for k in range(int(table.num_options[v])):
        if t[k] < t[current]:
            rate = (eff[k] - eff[current]) / (t[current] - t[k])
            if best is None or rate < best[1]:
                best = (k, float(rate))
    return best


def speed_up_to(dag: ComputationDag, table: OptionTable, choice: np.ndarray, target_s: float) -> np.ndarray | None:
    """A copy of ``choice`` whose real iteration time is ≤ ``target_s`` (None if even all-max cannot meet it)."""
    choice = np.array(choice, copy=True)
    longest = LongestPath(dag, [float(table.time_s[v, c]) for v, c in enumerate(choice)])
    speedup = lru_cache(maxsize=None)(lambda v, c: _best_speedup(table, v, c))
    while True:
        path, makespan = longest.path()
        if makespan <= target_s * (1 + 1e-12):
            return choice
        options = [(s[1], v, s[0]) for v in path if (s := speedup(v, int(choice[v]))) is not None]
        if not options:
            return None
        _, v, k = min(options)
        choice[v] = k
        longest.set_time(v, float(table.time_s[v, k]))
