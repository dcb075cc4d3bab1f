"""The iteration time–energy Pareto frontier of one pipeline (Perseus §4) over per-computation SM clocks.

:func:`trace_frontier` relaxes every computation's options into a convex cost (:mod:`ampe.tradeoff.hull`), traces
the relaxed frontier from T* (every computation at its minimum-effective-energy option) down to T_min with the
Phillips–Dessouky min-cut steps (:mod:`ampe.tradeoff.pd`), and maps every planned point back to clocks: each
computation runs at the slowest option whose (quantized) time is not longer than planned. With ``polish`` (the
default) every point is also realized a second way (cheapest option that meets the plan's latest finish, using
slack left by predecessors that finished early), both are polished (computations slowed within their free float,
which never lengthens the iteration), and the gap between the real T_min and PD's fastest point is filled by
greedy repair. Realized points are evaluated exactly on the discrete options (real critical-path time, Eq. 3/4
energy) and Pareto-filtered. See docs/energy.md §4.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Literal

import numpy as np

from ampe.tradeoff import pd
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import (
    Evaluation,
    OptionTable,
    evaluate_batch,
    fastest_choice,
    fit_deadlines,
    latest,
    polish_batch,
)
from ampe.tradeoff.hull import ConvexCost, Staircase, exponential_cost, lower_hull, staircase
from ampe.tradeoff.mincut import PY_MAX_ENTRIES
from ampe.tradeoff.repair import speed_up_through

CostKind = Literal["hull", "exponential"]
Progress = Callable[[float, float], None]  # (work done, work in all), called as a long phase goes
_BATCH = 256  # points realized per vectorised batch
_FILL_POINTS = 32  # most points added between the real T_min and PD's fastest point
_FILL_WORK = 2_000_000  # most longest-path node updates of the fill's greedy chain (≈ 2 s of CPU; 8 × 96 needs 0.43 M)
_BATCH_ENTRIES = 1 << 22  # most points × DAG nodes per realized batch (32 MB per float array; 256 rows to 16 k nodes)
_KEPT_ENTRIES = 1 << 24  # most realized points × DAG nodes held before dominated points are dropped (128 MB)
_FIT_BATCH = 8  # fill targets fitted per vectorised batch (bounds the k × nodes arrays)
REALIZED = 1000  # default most planned points realized (evenly spread in time; more only refine the curve)


@dataclass(frozen=True, eq=False)  # holds an array: compare points by identity
class FrontierPoint:
    """One realized frontier point.

    ``time_s``: iteration time of the clock choice (critical path of real option times); ``energy_j``: energy of
    that iteration with blocking until ``time_s`` (Eq. 3); ``effective_j``: Eq. 4 energy, what the frontier
    minimises (energy when waiting until T' ≥ time_s = effective_j + T' · Σ P_block); ``planned_s``: the PD
    makespan the point came from (≥ ``time_s``; None for the polished all-max point).
    """

    time_s: float
    energy_j: float
    effective_j: float
    planned_s: float | None
    choice: np.ndarray  # option index per DAG node (int64)

    def evaluation(self) -> Evaluation:
        """Time and energies as an :class:`Evaluation`."""
        return Evaluation(self.time_s, self.energy_j, self.effective_j)


class Frontier:
    """A traced frontier: the relaxed (planned) points and their realization on the discrete options."""

    def __init__(self, dag: ComputationDag, unit_s: float, cost: CostKind = "hull",
                 progress: Progress | None = None, py_max_entries: int = PY_MAX_ENTRIES) -> None:
        if not unit_s > 0:
            raise ValueError("unit time must be positive")
        self.dag = dag
        self.unit_s = unit_s
        self.table = OptionTable.of(dag)
        owner: dict[int, int] = {}  # spec → a node using it (specs never mix stages or kinds)
        for v, n in enumerate(dag.nodes):
            owner.setdefault(n.spec, v)
        self.stairs: list[Staircase] = []
        self.costs: list[ConvexCost | None] = []
        self.fit_failures = 0
        for i, spec in enumerate(dag.specs):
            node = owner.get(i)
            if node is not None and dag.is_computation(node):
                costs = list(spec.effective_costs(dag.blocking_w[dag.nodes[node].stage]))
            else:  # transfers cost nothing beyond blocking
                costs = [0.0] * len(spec.options)
            stairs = staircase([o.time_s for o in spec.options], costs, unit_s)
            self.stairs.append(stairs)
            hull = None
            if len(stairs.q) > 1:
                hull = exponential_cost(stairs) if cost == "exponential" else lower_hull(stairs)
                if hull is None:
                    self.fit_failures += 1
                    hull = lower_hull(stairs)
            self.costs.append(hull)
        self.ops = [v for v in range(len(dag.nodes)) if dag.is_computation(v)]  # PD operations
        self.problem = self._problem()
        self.trace = pd.trace(self.problem, progress, py_max_entries)
        self.constant_cost = sum(self.stairs[dag.nodes[v].spec].cost[0] for v in self.ops
                                 if self.costs[dag.nodes[v].spec] is None)
        self._build_pick_table()

    def _problem(self) -> pd.Problem:
        """PD operations = computations; each transfer is folded into its edge as a constant lag."""
        dag = self.dag
        op_id = {v: i for i, v in enumerate(self.ops)}
        preds, lags = [], []
        for v in self.ops:
            ps, ls = [], []
            for p in dag.preds[v]:
                lag = 0
                while not dag.is_computation(p):  # a transfer: one predecessor, constant duration
                    lag += self.stairs[dag.nodes[p].spec].q[0]
                    (p,) = dag.preds[p]
                ps.append(op_id[p])
                ls.append(lag)
            preds.append(tuple(ps))
            lags.append(tuple(ls))
        specs = [dag.nodes[v].spec for v in self.ops]
        return pd.Problem(tuple(preds), tuple(lags), tuple(self.costs[s] for s in specs),
                          tuple(self.stairs[s].q[0] for s in specs))

    def _build_pick_table(self) -> None:
        """Flat lookup duration → option id per spec, so a batch of plans maps to clocks with one gather."""
        flat: list[int] = []
        base = []
        for s in self.stairs:
            base.append(len(flat))
            flat.extend(s.option[s.pick(d)] for d in range(s.q[0], s.q[-1] + 1))
        spec = np.asarray([self.dag.nodes[v].spec for v in self.ops])
        self._flat = np.asarray(flat, dtype=np.int64)
        self._base = np.asarray(base, dtype=np.int64)[spec]
        self._lo = np.asarray([s.q[0] for s in self.stairs], dtype=np.int64)[spec]
        self._span = np.asarray([s.q[-1] - s.q[0] for s in self.stairs], dtype=np.int64)[spec]

    @property
    def t_star_s(self) -> float:
        """Planned iteration time of the minimum-energy schedule T* (s)."""
        return self.trace.t_star * self.unit_s

    @property
    def t_min_s(self) -> float:
        """Planned iteration time with every computation at its fastest option, T_min (s)."""
        return self.trace.t_min * self.unit_s

    @property
    def planned_points(self) -> int:
        """How many planned points :meth:`planned` yields (one per unit step from T* to T_min)."""
        return sum(seg.length for seg in self.trace.segments) + 1

    def planned(self) -> Iterator[tuple[int, float, np.ndarray]]:
        """(makespan in units of τ, relaxed effective energy (J), durations of ``ops``) from T* down to T_min."""
        cur = self.trace.start_durations.copy()
        for seg in self.trace.segments:
            step = seg.direction.astype(np.int64)
            for k in range(seg.length):
                d = cur.copy()
                d[seg.moved] += k * step
                yield seg.start - k, seg.cost + k * seg.cost_per_unit + self.constant_cost, d
            cur[seg.moved] += seg.length * step
        yield self.trace.t_min, self.trace.final_cost + self.constant_cost, self.trace.final_durations

    def relaxed_energy(self, units: int) -> float:
        """Relaxed (lower-bound) effective energy at planned makespan ``units`` (T_min ≤ units ≤ T*)."""
        for seg in self.trace.segments:
            if seg.start - seg.length < units <= seg.start:
                return seg.cost + (seg.start - units) * seg.cost_per_unit + self.constant_cost
        if units == self.trace.t_min:
            return self.trace.final_cost + self.constant_cost
        raise ValueError(f"{units} is outside the frontier [{self.trace.t_min}, {self.trace.t_star}]")

    def choice_for(self, durations: np.ndarray) -> np.ndarray:
        """Option index per DAG node (rows: a batch) for planned computation durations (units of τ, one per
        ``ops`` entry): the slowest Pareto option whose quantized time is not longer than planned."""
        d = np.atleast_2d(np.asarray(durations, dtype=np.int64))
        out = np.zeros((len(d), len(self.dag.nodes)), dtype=np.int64)  # transfers: their only option
        out[:, self.ops] = self._flat[self._base + np.clip(d - self._lo, 0, self._span)]
        return out if np.ndim(durations) == 2 else out[0]

    def points(self, polish: bool = True, pareto: bool = True, max_planned_s: float | None = None,
               fill: bool = True, realized: int | None = REALIZED, progress: Progress | None = None
               ) -> list[FrontierPoint]:
        """Realized points sorted by time (fastest first).

        ``polish``: also realize each point against its planned deadlines, slow computations within their free
        float (never lengthens the iteration) and fill the gap down to the exact all-max T_min (module
        docstring); without it, every point is the raw mapping of the planned durations to clocks. ``pareto``:
        drop points whose effective energy is not below every faster point's. ``max_planned_s``: realize only the
        planned points whose PD makespan is at most this (s; T_min's is always realized) — the search realizes
        just the part of the frontier a slowdown bound allows. ``fill=False`` skips the greedy fill down to the
        all-max time (the costly part on large DAGs; the search's screening pass uses it). ``realized``: when
        there are more planned points (unit steps) than this, only every ⌈steps / realized⌉-th one from T* is
        realized, plus T_min (None: every one); realizing is most of the cost, and neighbouring points differ by
        one unit τ of time. ``progress(done, total)``: planned points realized, after every batch.
        """
        out: list[FrontierPoint] = []
        batch_d: list[np.ndarray] = []
        batch_t: list[int] = []

        def flush() -> None:
            if not batch_d:
                return
            if pareto and len(out) * len(self.dag.nodes) > _KEPT_ENTRIES:  # each point holds a choice per node:
                out.sort(key=lambda p: (p.time_s, p.effective_j))  # drop the dominated ones so far (they stay
                out[:] = pareto_filter(out)  # dominated); the last batch, with T_min's point, is never pruned here
            d = np.stack(batch_d)
            picked = self.choice_for(d)
            variants = [picked]
            if polish:
                fitted = fit_deadlines(self.dag, self.table, picked, self._planned_finish(d, batch_t))
                variants = [polish_batch(self.dag, self.table, c) for c in (picked, fitted)]
            for choice in variants:
                t, e, eff = evaluate_batch(self.dag, self.table, choice)
                for i in range(len(batch_d)):
                    out.append(FrontierPoint(float(t[i]), float(e[i]), float(eff[i]), batch_t[i] * self.unit_s,
                                             choice[i].copy()))
            done[0] += len(batch_t)
            batch_d.clear()
            batch_t.clear()
            if progress is not None:
                progress(min(done[0], total), total)

        limit = None if max_planned_s is None else max_planned_s / self.unit_s * (1 + 1e-9)
        t_star, t_min = self.trace.t_star, self.trace.t_min
        if limit is not None and limit < t_star:
            t_star = max(t_min, int(limit))
        rows = max(1, min(_BATCH, _BATCH_ENTRIES // max(1, len(self.dag.nodes))))  # k × nodes arrays stay bounded
        stride = 1 if realized is None else max(1, -(-(t_star - t_min + 1) // max(1, realized)))
        done, total = [0], (t_star - t_min) // stride + 2  # every stride-th point from T*, and T_min's
        for units, _, d in self.planned():
            if limit is not None and units > limit and units != t_min:
                continue
            if (t_star - units) % stride and units != t_min:
                continue
            batch_d.append(d)
            batch_t.append(units)
            if len(batch_d) == rows:
                flush()
        flush()
        if polish and fill:
            out.extend(self._fill_fast_end(out))
        if progress is not None:
            progress(total, total)
        out.sort(key=lambda p: (p.time_s, p.effective_j))
        return pareto_filter(out) if pareto else out

    def _planned_finish(self, durations: np.ndarray, units: list[int]) -> np.ndarray:
        """Latest finish (s) of every DAG node in each planned schedule (``k`` rows of computation durations)."""
        times = np.tile(np.asarray([self.stairs[n.spec].q[0] for n in self.dag.nodes], dtype=float), (len(units), 1))
        times[:, self.ops] = durations
        _, lf = latest(self.dag, times * self.unit_s, np.asarray(units, dtype=float) * self.unit_s)
        return lf * (1 + 1e-12)

    def _fill_fast_end(self, realized: list[FrontierPoint]) -> list[FrontierPoint]:
        """Points between the real T_min (all clocks max) and PD's fastest realized point.

        PD rounds option times up to whole units, so its fastest plan can be slower in real time than all-max.
        Starting from that plan, :func:`speed_up_through` meets targets spread over the gap (at most
        ``_FILL_POINTS``, at least τ apart); each result is polished. The last target is the real T_min. The greedy
        chain is quadratic in the computations (docs/energy.md §8), so it stops after ``_FILL_WORK`` longest-path
        node updates; then every target also gets the all-max plan fitted to its deadlines (:meth:`_fit_all_max`,
        linear) and the targets the chain did not reach fall back to all-max.
        """
        fastest = np.asarray(min((p for p in realized if p.planned_s == self.t_min_s), key=lambda p: p.time_s,
                                 default=realized[-1]).choice)
        t_fast = float(evaluate_batch(self.dag, self.table, fastest_choice(self.dag)[None, :])[0][0])
        t0 = float(evaluate_batch(self.dag, self.table, fastest[None, :])[0][0])
        steps = min(_FILL_POINTS, max(1, int(np.ceil((t0 - t_fast) / self.unit_s))))
        targets = [t_fast + (t0 - t_fast) * k / steps for k in range(steps - 1, -1, -1)]
        all_max = fastest_choice(self.dag)
        chain = speed_up_through(self.dag, self.table, fastest, targets, max_work=_FILL_WORK)
        out: list[FrontierPoint] = []
        batches = [np.stack([all_max if c is None else c for c in chain])]
        if any(c is None for c in chain):
            batches += [self._fit_all_max(all_max, targets[i: i + _FIT_BATCH])
                        for i in range(0, len(targets), _FIT_BATCH)]
        for batch in batches:
            polished = polish_batch(self.dag, self.table, batch)
            t, e, eff = evaluate_batch(self.dag, self.table, polished)
            out += [FrontierPoint(float(t[i]), float(e[i]), float(eff[i]), None, polished[i].copy())
                    for i in range(len(polished))]
        return out

    def _fit_all_max(self, all_max: np.ndarray, targets: list[float]) -> np.ndarray:
        """Per target (s, ≥ the all-max time), every computation's cheapest option that still finishes by its latest
        finish in the all-max schedule stretched to the target, started as early as the choices before it allow
        (:func:`fit_deadlines`): a plan finishing by the target, in a few vectorised passes over the DAG's levels."""
        rows = np.tile(all_max, (len(targets), 1))
        times = self.table.time_s[np.arange(len(all_max)), rows]
        _, lf = latest(self.dag, times, np.asarray(targets, dtype=float))
        return fit_deadlines(self.dag, self.table, rows, lf * (1 + 1e-12))


def pareto_filter(points: list[FrontierPoint]) -> list[FrontierPoint]:
    """Points (sorted by time) whose effective energy is strictly below that of every faster point."""
    kept: list[FrontierPoint] = []
    for p in points:
        if not kept or p.effective_j < kept[-1].effective_j - 1e-9 * max(1.0, abs(kept[-1].effective_j)):
            kept.append(p)
    return kept


def trace_frontier(dag: ComputationDag, unit_s: float = 1e-3, cost: CostKind = "hull",
                   progress: Progress | None = None, py_max_entries: int = PY_MAX_ENTRIES) -> Frontier:
    """Trace the frontier of ``dag`` with unit time ``unit_s`` (s); ``cost`` "hull" (default) or "exponential";
    ``progress(done, total)``: units of τ traced; ``py_max_entries``: the largest min-cut network (residual
    entries) solved by the pure-Python max flow (:func:`ampe.tradeoff.pd.trace`)."""
    return Frontier(dag, unit_s, cost, progress, py_max_entries)


def halves(progress: Progress, k: int, n: int) -> tuple[Progress, Progress]:
    """Callbacks for the trace and the realization of frontier ``k`` of ``n`` reporting to one ``progress`` as
    (frontiers done, n): the trace fills the first half of frontier k's share, the realization the second."""
    def trace(done: float, total: float) -> None:
        progress(k + 0.5 * (done / total if total > 0 else 1.0), n)

    def realize(done: float, total: float) -> None:
        progress(k + 0.5 + 0.5 * (done / total if total > 0 else 1.0), n)

    return trace, realize

