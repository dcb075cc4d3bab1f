"""The objectives a strategy's operating point is chosen by: one :class:`Objective` per name (``time``, ``energy``,
``edp``, ``cost``, ``carbon``) with whether it needs the cluster's prices, its score at a point, and its best point
over a strategy's frontiers; the scan for that best point is written once (:func:`best_t_prime`).

**Where the best point lies.** A strategy's point at synchronous pipeline time T' has every replica r at its
cheapest frontier point not slower than T' (:mod:`ampe.energy.strategy`, :mod:`ampe.energy.price`). Between two
consecutive frontier point times the replicas' choices stay the same while the iteration time, and every objective
here, only grows with T'; so the best T' is the fastest synchronous time or one of the points' times, and the scan
scores exactly those (ties: the faster point).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ampe.costmodel.pricing import PRICED, Weights
from ampe.energy.price import blocking_weighted, point_cost, weighted_effective

if TYPE_CHECKING:
    from ampe.energy.strategy import StrategyEnergy, StrategyPoint

_REL = 1e-12


@dataclass(frozen=True)
class FrontierScan:
    """One frontier in the scan: ``count`` replicas share it; at synchronous time T' each runs the point
    ``searchsorted(times, min(cap_s, T'))`` and adds ``value`` of it (J, or money / grams for priced objectives)."""

    count: int
    times: np.ndarray  # (points,) point times, ascending (s)
    value: np.ndarray  # (points,) what a replica at that point adds to the score
    cap_s: float | None = None  # no point slower than this is run (s; None: the last one)


def best_t_prime(lo_s: float, hi_s: float, scans: Sequence[FrontierScan],
                 start: Callable[[np.ndarray], np.ndarray], finish: Callable[[np.ndarray, np.ndarray], np.ndarray],
                 tie_floor: float) -> float:
    """The synchronous pipeline time (s) of least score among ``lo_s`` and the frontiers' point times in
    (``lo_s``, ``hi_s``] (module docstring).

    Args:
        lo_s: the fastest synchronous time (s).
        hi_s: no candidate slower than this (s; at least ``lo_s``).
        scans: the frontiers and what their points add.
        start: the score's part before the frontiers' values, per candidate time.
        finish: the score from the candidate times and their start plus the frontiers' values.
        tie_floor: scores within 1e-9 × max(``tie_floor``, |best|) of the best tie; the fastest wins.

    Returns:
        The chosen synchronous time T' (s).
    """
    cands = np.unique(np.concatenate([[lo_s]] + [s.times[(s.times > lo_s) & (s.times <= hi_s)] for s in scans]))
    total = start(cands)
    for s in scans:
        target = (cands if s.cap_s is None else np.minimum(s.cap_s, cands)) * (1 + _REL)
        idx = np.maximum(np.searchsorted(s.times, target, side="right") - 1, 0)
        total = total + s.count * s.value[idx]
    score = finish(cands, total)
    best = float(score.min())
    k = int(np.flatnonzero(score <= best + 1e-9 * max(tie_floor, abs(best)))[0])
    return float(cands[k])


@dataclass(frozen=True)
class Objective:
    """What a plan minimises: ``name``, whether it needs prices (``priced``: money or grams CO2e per iteration,
    from the cluster spec's pricing) and whether points slower than the fastest can be chosen (``slows``: all but
    ``time``)."""

    name: str
    priced: bool
    slows: bool

    def score(self, se: StrategyEnergy, sp: StrategyPoint, weights: Weights | None = None) -> float:
        """What the objective minimises at point ``sp`` of ``se``: seconds, joules, joule-seconds, or money / grams
        CO2e (``weights``: the strategy's, needed by priced objectives)."""
        if self.priced:
            return point_cost(se, sp, _needed(weights, self.name)).total
        return {"time": sp.time_s, "energy": sp.energy_j, "edp": sp.edp}[self.name]

    def best(self, se: StrategyEnergy, max_time_s: float | None = None,
             weights: Weights | None = None) -> StrategyPoint | None:
        """The point of ``se`` best for the objective among those whose iteration time is ≤ ``max_time_s`` (s;
        None: no bound), exact over the frontiers' points; None when even the T_min point is slower.

        Args:
            se: the strategy's planned pipelines.
            max_time_s: the slowest iteration time allowed (s), or None.
            weights: the strategy's prices (priced objectives only).

        Returns:
            The chosen point, or None."""
        lo = se.t_prime_min_s
        if max_time_s is not None and lo + se.post_s > max_time_s * (1 + 1e-9):
            return None
        if not self.slows:
            return se.at(lo)
        if self.priced:
            return _cheapest(se, _needed(weights, self.name), lo, max_time_s)
        scans = [FrontierScan(count, times, effs, f.t_star_s) for f, count, times, effs in se.distinct_frontiers]
        hi = max(f.t_star_s for f, *_ in se.distinct_frontiers)
        if max_time_s is not None:
            hi = min(hi, max_time_s * (1 + 1e-9) - se.post_s)
        post, watts, edp = se.post_s, se.blocking_w, self.name == "edp"

        def finish(c: np.ndarray, eff: np.ndarray) -> np.ndarray:
            energy = eff + watts * (c + post)
            return energy * (c + post) if edp else energy

        return se.at(best_t_prime(lo, max(lo, hi), scans, np.zeros_like, finish, 1.0))


def _cheapest(se: StrategyEnergy, w: Weights, lo: float, max_time_s: float | None) -> StrategyPoint:
    """The point of least money (or CO2e) under weights ``w`` (:mod:`ampe.energy.price`): each replica at the
    frontier point of least weighted effective energy not slower than T' (a prefix minimum along its points)."""
    post = se.post_s
    groups: dict[tuple, list] = {}  # identical replicas at identically priced sites share one scan
    block = 0.0
    for r, rep in enumerate(se.replicas):
        wr = w.per_joule[r]
        block += blocking_weighted(rep, wr)
        key = (id(rep.frontier), wr)
        if key in groups:
            groups[key][1] += 1
            continue
        weighted = weighted_effective(rep, wr)
        best = np.minimum.accumulate(weighted)
        arg = np.zeros(len(weighted), dtype=np.int64)  # the first point reaching each prefix minimum
        for k in range(1, len(weighted)):
            arg[k] = k if weighted[k] < best[k - 1] else arg[k - 1]
        times = np.array([p.time_s for p in rep.frontier.points])
        groups[key] = [rep, 1, times, best, arg]
    hi = max(float(g[2][-1]) for g in groups.values())
    if max_time_s is not None:
        hi = min(hi, max_time_s * (1 + 1e-9) - post)
    scans = [FrontierScan(count, times, best) for _, count, times, best, _ in groups.values()]
    rent = w.per_second + block
    # ties relative to the best (floor 0): money per iteration is tiny
    t = best_t_prime(lo, max(lo, hi), scans, lambda c: rent * (c + post), lambda _c, score: score, 0.0)
    chosen = {}
    for key, (rep, _, times, _, arg) in groups.items():
        i = max(int(np.searchsorted(times, t * (1 + _REL), side="right")) - 1, 0)
        chosen[key] = rep.frontier.points[int(arg[i])]
    points = tuple(chosen[(id(rep.frontier), w.per_joule[r])] for r, rep in enumerate(se.replicas))
    return se.point_of(t, points)


def _needed(weights: Weights | None, name: str) -> Weights:
    if weights is None:
        raise ValueError(f"the {name} objective needs the strategy's prices")
    return weights


OBJECTIVES: dict[str, Objective] = {name: Objective(name, name in PRICED, name != "time")
                                    for name in ("time", "energy", "edp", *PRICED)}


def objective_named(name: str) -> Objective:
    """The objective called ``name``; ValueError naming the choices for any other."""
    if name not in OBJECTIVES:
        raise ValueError(f"unknown objective {name!r}; one of {', '.join(OBJECTIVES)}")
    return OBJECTIVES[name]
