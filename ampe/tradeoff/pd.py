"""Phillips–Dessouky time–cost tradeoff on a DAG with convex piecewise-linear costs (Perseus Algorithms 1–3).

Start with every operation at its longest (cheapest) duration, T*; repeatedly find the cheapest way to shorten
*every* critical path by one unit, until T_min (every operation at its shortest duration) is reached:

1. Critical DAG: operations and dependency edges with zero slack, recomputed after every step
   (:mod:`ampe.tradeoff.cpm`, exact, mostly incremental).
2. Capacity DAG: operation v gets flow bounds (l, u) = (e⁻, e⁺), the cost saved by slowing it down / paid to
   speed it up by one unit (Perseus Eq. 8); dependencies and constant operations get (0, ∞); an operation at its
   shortest duration gets u = ∞, at its longest l = 0.
3. Min cut with lower bounds (:mod:`ampe.tradeoff.mincut`) minimises Σ_{S→T} u − Σ_{T→S} l: speed up the S→T
   operations, slow down the T→S ones (Perseus Eq. 7). Costs are scaled to integers so scipy's C max flow applies.

With integer durations, a unit step never makes a non-critical path longer than the new makespan: a path P with
slack σ ≥ 1 leaves and re-enters the critical DAG through at most σ detours, so it crosses the cut T→S at most
σ − 1 more times than S→T (Hochbaum 2016 proves the resulting unit-step PD exact for convex costs).

Multi-unit steps: the same cut stays optimal while every moved operation stays on one linear piece of its cost
and no non-critical path becomes critical, so it is applied δ times at once, δ = min(distance of the moved
operations to their next hull vertex, the largest δ with L(P) + δ·(R(P) + 1) ≤ T for all paths P, found by
Dinkelbach iterations on the longest path). The points in between are exactly those of unit steps.

Dependencies may carry a constant lag (a pipeline transfer folded into its edge).
"""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ampe.tradeoff.cpm import Graph, Schedule
from ampe.tradeoff.hull import ConvexCost
from ampe.tradeoff.mincut import INF_CAP, PY_MAX_ENTRIES, WarmMinCut

_CAP_BUDGET = float(1 << 27)  # Σ over operations of the largest scaled slope: every flow stays below it


@dataclass(frozen=True)
class Segment:
    """A run of ``length`` unit steps taking the same cut, starting at makespan ``start`` (units of τ).

    Point k = 0..length−1 has makespan ``start − k``, the durations at the segment's first point plus
    ``k·direction`` on ``moved`` (others unchanged) and relaxed cost ``cost + k·cost_per_unit``. Durations are not
    stored per segment (that would grow with operations × segments): replay them from ``Trace.start_durations``.
    """

    start: int
    cost: float
    moved: np.ndarray  # operation ids
    direction: np.ndarray  # −1: sped up, +1: slowed down (int8: widen before scaling by a step count)
    length: int
    cost_per_unit: float


@dataclass(frozen=True)
class Trace:
    """The whole frontier: T* = ``t_star`` down to ``t_min`` (units of τ); the last point is ``final_*``."""

    segments: tuple[Segment, ...]
    start_durations: np.ndarray  # every operation's duration at T* (the first segment's first point)
    t_star: int
    t_min: int
    final_durations: np.ndarray
    final_cost: float
    max_flows: int  # min cuts solved
    full_passes: int  # full CPM recomputations (the rest were incremental)
    cold_starts: int  # min cuts that rebuilt a feasible flow from scratch


@dataclass(frozen=True)
class Problem:
    """Operations in topological order; ``preds[v][i]`` precedes v with lag ``lags[v][i]`` (units of τ).

    ``costs[v]`` is operation v's convex cost, or None for a constant operation lasting ``fixed[v]`` units.
    """

    preds: tuple[tuple[int, ...], ...]
    lags: tuple[tuple[int, ...], ...]
    costs: tuple[ConvexCost | None, ...]
    fixed: tuple[int, ...]


class _Hulls:
    """Per-operation hull vertices, float slopes and integer (scaled) slopes."""

    def __init__(self, costs: Sequence[ConvexCost | None]) -> None:
        total = sum(c.slope(0) for c in costs if c is not None and len(c.q) > 1)
        self.scale = _CAP_BUDGET / total if total > 0 else 1.0
        self.q: list[tuple[int, ...] | None] = []
        self.slopes: list[tuple[float, ...]] = []
        self.islopes: list[tuple[int, ...]] = []
        for c in costs:
            if c is None or len(c.q) == 1:
                self.q.append(None)
                self.slopes.append(())
                self.islopes.append(())
                continue
            s = tuple(c.slope(j) for j in range(len(c.q) - 1))
            self.q.append(c.q)
            self.slopes.append(s)
            self.islopes.append(tuple(round(x * self.scale) for x in s))  # rounding is monotone: stays convex

    def bounds(self, v: int, d: int) -> tuple[int, int]:
        """Integer (lower, upper) flow bounds of operation v at duration d (Perseus Eq. 8)."""
        q = self.q[v]
        if q is None:
            return 0, INF_CAP
        s = self.islopes[v]
        if d >= q[-1]:
            return 0, s[-1]
        j = bisect_right(q, d) - 1
        if d <= q[0]:
            return s[0], INF_CAP
        return s[j], (s[j - 1] if q[j] == d else s[j])

    def step_limit(self, v: int, d: int, direction: int) -> tuple[int, float]:
        """(units until the next hull vertex in ``direction``, cost change per unit) for operation v at d."""
        q = self.q[v]
        assert q is not None
        j = bisect_right(q, d) - 1  # vertex at or below d
        if direction < 0:
            piece = j - 1 if q[j] == d else j
            return d - q[piece], self.slopes[v][piece]
        return q[j + 1] - d, -self.slopes[v][j]


def trace(problem: Problem, progress: Callable[[float, float], None] | None = None,
          py_max_entries: int = PY_MAX_ENTRIES) -> Trace:
    """Trace the frontier from T* down to T_min; ``progress(done, total)``: units of τ traced of T* − T_min, after
    every step (a long trace shows where it is); min cuts of at most ``py_max_entries`` residual entries use the
    pure-Python max flow (:mod:`ampe.tradeoff.mincut`; the frontier is the same either way)."""
    hulls = _Hulls(problem.costs)
    graph = Graph.of(problem.preds, problem.lags)
    n = graph.n
    hi = np.asarray([c.hi if c is not None else problem.fixed[v] for v, c in enumerate(problem.costs)], np.int64)
    lo = np.asarray([c.lo if c is not None else problem.fixed[v] for v, c in enumerate(problem.costs)], np.int64)
    constant = np.asarray([q is None for q in hulls.q], dtype=bool)
    sched = Schedule(graph, lo)
    t_min = sched.makespan
    sched.recompute(hi.copy())
    t_star = sched.makespan
    start_durations = sched.d.copy()
    cut = WarmMinCut(n, graph.src, graph.dst, py_max_entries)
    lb = np.zeros(n, dtype=np.int64)
    ub = np.zeros(n, dtype=np.int64)
    for v in range(n):
        lb[v], ub[v] = hulls.bounds(v, int(hi[v]))
    cost = sum(c.cost[-1] for c in problem.costs if c is not None)
    segments: list[Segment] = []
    while sched.makespan > t_min:
        d = sched.d
        crit = sched.critical
        speed, slow, late = cut.solve(crit, sched.critical_edges(), np.flatnonzero(crit & (sched.es == 0)),
                                      np.flatnonzero(crit & (sched.es + d == sched.makespan)), lb, ub)
        if len(speed) == 0 or (ub[speed] >= INF_CAP).any():
            raise RuntimeError("min cut does not shorten the critical DAG")
        slow = slow[~constant[slow] & (d[slow] < hi[slow])]  # slowing an op at its longest duration: no-op
        moved = np.concatenate([speed, slow])
        direction = np.concatenate([-np.ones(len(speed), np.int64), np.ones(len(slow), np.int64)])
        delta = sched.makespan - t_min
        per_unit = 0.0
        for v, r in zip(moved.tolist(), direction.tolist(), strict=False):
            room, slope = hulls.step_limit(v, int(d[v]), r)
            delta = min(delta, room)
            per_unit += slope
        start = sched.makespan
        delta = _apply(sched, moved, direction, late, delta)
        # directions stored as int8 (Σ|moved| over segments is the trace's memory; int32 ids would slow the replay)
        segments.append(Segment(start, cost, moved, direction.astype(np.int8), delta, per_unit))
        for v in moved.tolist():
            lb[v], ub[v] = hulls.bounds(v, int(sched.d[v]))
        cost += per_unit * delta
        if progress is not None:
            progress(t_star - sched.makespan, t_star - t_min)
    return Trace(tuple(segments), start_durations, t_star, t_min, sched.d.copy(), cost, len(segments),
                 sched.full_passes, cut.cold_starts)


def _apply(sched: Schedule, moved: np.ndarray, direction: np.ndarray, late: np.ndarray, delta: int) -> int:
    """Apply the largest δ ≤ ``delta`` that shortens the makespan by exactly δ; returns δ.

    δ = 1 always works (module docstring). If a larger δ lets a non-critical path P overtake, shrink it to where
    P catches up: L(P) + δ·(R(P) + 1) = makespan (Dinkelbach), and retry.
    """
    makespan = sched.makespan
    while True:
        trial = sched.d.copy()
        trial[moved] += direction * delta
        if sched.advance(trial, late, delta):
            return delta
        if delta == 1:
            raise RuntimeError("PD unit step did not shorten the makespan by one unit")
        _, path = sched.longest_path(trial)
        rate = dict(zip(moved.tolist(), direction.tolist(), strict=False))
        length0 = sum(int(sched.d[v]) for v in path) + sum(sched.lag(u, v) for u, v in itertools.pairwise(path))
        rise = sum(rate.get(v, 0) for v in path)
        delta = max(1, min(delta - 1, (makespan - length0) // (rise + 1)))
