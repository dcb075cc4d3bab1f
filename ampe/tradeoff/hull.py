"""Cost functions of one computation over its quantized duration.

Perseus relaxes each computation's discrete (time, energy) options into a convex function of time. lowtime fits
e(t) = a·e^{bt} + c with ``curve_fit`` (needs a grid of initial guesses, can fail or overflow). ampe uses the
*lower convex hull* of the Pareto-optimal options instead: it always exists, passes through every hull option
exactly, never needs a fit, and is exact for PD with integer durations (Hochbaum 2016). :func:`exponential_cost`
reproduces the lowtime fit only to measure the difference (``benchmarks/frontier.py``).

Durations are integers in units of τ (:func:`quantized_times`): the fastest option's time rounded to the nearest
unit, slower options' extra time rounded up.
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Staircase:
    """Pareto-optimal options of one computation: durations strictly increasing, costs strictly decreasing."""

    q: tuple[int, ...]  # durations (units of τ)
    cost: tuple[float, ...]  # effective energy (J)
    option: tuple[int, ...]  # index into the computation's OpOptions.options

    def pick(self, d: int) -> int:
        """Index (into ``q``) of the slowest option whose duration is ≤ ``d`` (the fastest if none is)."""
        return max(0, bisect_right(self.q, d) - 1)


def quantize(time_s: float, unit_s: float) -> int:
    """Duration in units of τ, rounded up (with a relative tolerance for float noise)."""
    return max(0, math.ceil(time_s / unit_s - 1e-9))


def quantized_times(times_s: Sequence[float], unit_s: float) -> list[int]:
    """Integer durations of one computation's options: its fastest time rounded to the nearest unit, the extra
    time of each slower option rounded up.

    Rounding the fastest time to nearest keeps PD's T_min unbiased (rounding every time up would make the
    fastest schedule look about half a unit per computation on the critical path slower than it is, and PD
    would waste that real slack near T_min); rounding the *extra* time up keeps every slowdown conservative.
    """
    fast = min(times_s)
    base = max(0, round(fast / unit_s))
    return [base + quantize(t - fast, unit_s) for t in times_s]


def staircase(times_s: Sequence[float], costs: Sequence[float], unit_s: float) -> Staircase:
    """The Pareto-optimal options by (quantized time, cost); options slower than the cheapest are dropped."""
    q = quantized_times(times_s, unit_s)
    order = sorted(range(len(q)), key=lambda i: (q[i], costs[i], times_s[i]))
    out_q: list[int] = []
    out_c: list[float] = []
    out_i: list[int] = []
    for i in order:
        if out_c and (costs[i] >= out_c[-1] or q[i] == out_q[-1]):
            continue
        out_q.append(q[i])
        out_c.append(float(costs[i]))
        out_i.append(i)
    return Staircase(tuple(out_q), tuple(out_c), tuple(out_i))


@dataclass(frozen=True)
class ConvexCost:
    """A convex, non-increasing, piecewise-linear cost over integer durations ``q[0] .. q[-1]``."""

    q: tuple[int, ...]  # vertex durations, strictly increasing
    cost: tuple[float, ...]  # cost at the vertices

    @property
    def lo(self) -> int:
        """Shortest duration."""
        return self.q[0]

    @property
    def hi(self) -> int:
        """Longest duration (the minimum-cost point)."""
        return self.q[-1]

    def slope(self, piece: int) -> float:
        """Cost saved per unit of extra duration on piece ``piece`` (between vertices piece and piece+1), ≥ 0."""
        return (self.cost[piece] - self.cost[piece + 1]) / (self.q[piece + 1] - self.q[piece])

    def __call__(self, d: float) -> float:
        """Cost at duration ``d`` (linear between vertices)."""
        if len(self.q) == 1:
            return self.cost[0]
        j = max(0, min(bisect_right(self.q, d) - 1, len(self.q) - 2))
        return self.cost[j] - self.slope(j) * (d - self.q[j])

    def max_gap(self, stairs: Staircase) -> float:
        """Largest excess of the discrete option actually run (``stairs.pick``) over this relaxation (J)."""
        gap = 0.0
        for k in range(len(stairs.q) - 1):  # worst case: just before the next (slower) option becomes feasible
            d = stairs.q[k + 1] - 1
            gap = max(gap, stairs.cost[k] - self(d))
        return gap


def lower_hull(stairs: Staircase) -> ConvexCost:
    """The lower convex hull of a staircase (monotone chain)."""
    pts: list[tuple[int, float]] = []
    for x, y in zip(stairs.q, stairs.cost, strict=False):
        while len(pts) >= 2:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):  # pts[-1] on or above the chord → not a vertex
                pts.pop()
            else:
                break
        pts.append((x, y))
    return ConvexCost(tuple(p[0] for p in pts), tuple(p[1] for p in pts))


def exponential_cost(stairs: Staircase) -> ConvexCost | None:
    """lowtime-style fit cost(q) = a·e^{bq} + c sampled at every integer duration, or None if no convex fit.

    Same grid of initial guesses as ``lowtime.cost_model.ExponentialModel`` (strategy "best"); fits with a < 0 or
    infinite covariance are rejected, as lowtime does. For measurement only.
    """
    from scipy.optimize import curve_fit

    if len(stairs.q) < 3:
        return None
    x = np.asarray(stairs.q, dtype=float)
    y = np.asarray(stairs.cost, dtype=float)

    def fn(t: np.ndarray, a: float, b: float, c: float) -> np.ndarray:
        return a * np.exp(b * t) + c

    best, best_err = None, math.inf
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for a0 in (1e1, 1e2, 1e3):
            for b0 in (-0.01, -0.02, -0.03, -0.04, -0.05, -0.1):
                for c0 in (1e1, 1e2, 1e3):
                    try:
                        p, cov = curve_fit(fn, x, y, p0=(a0, b0, c0), maxfev=50000)
                    except (RuntimeError, ValueError, OverflowError):
                        continue
                    err = float(np.mean((fn(x, *p) - y) ** 2))
                    if np.isinf(cov).any() or not math.isfinite(err) or p[0] < 0:
                        continue
                    if err < best_err:
                        best, best_err = p, err
    if best is None:
        return None
    qs = tuple(range(stairs.q[0], stairs.q[-1] + 1))
    vals = fn(np.asarray(qs, dtype=float), *best)
    if not np.all(np.isfinite(vals)):
        return None
    # Keep only the non-increasing part (a fitted curve may rise again before q_hi).
    vals = np.minimum.accumulate(vals)
    return lower_hull(Staircase(qs, tuple(float(v) for v in vals), tuple(range(len(qs)))))
