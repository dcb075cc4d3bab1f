"""Choosing among costed strategies under a time / energy / energy-delay / money / CO2e objective (``ampe
search``): which strategies' frontiers are traced, screened or skipped, the point each one runs at, the Pareto
marks, and the work bound applied before any of it (:mod:`ampe.energy.budget`). One strategy's energy is
:mod:`ampe.energy.strategy`; money and CO2e of its points, :mod:`ampe.energy.price`."""

from __future__ import annotations

import bisect
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ampe.costmodel.pricing import Weights, require, strategy_weights
from ampe.energy import budget
from ampe.energy.inputs import job_of, replica_inputs
from ampe.energy.objective import Objective, objective_named
from ampe.energy.price import CostBounds, cost_bounds
from ampe.energy.strategy import (
    DEFAULT_MAX_SLOWDOWN,
    DIRECT_LARGE,
    DIRECT_POINTS,
    DIRECT_POINTS_LARGE,
    RESOLUTION,
    SCREEN_RESOLUTION,
    FrontierCache,
    StrategyEnergy,
    StrategyPoint,
    fastest_time_s,
    plan_clocks,
    replica_dag,
)

if TYPE_CHECKING:
    from ampe.costmodel.cluster import Cluster
    from ampe.costmodel.estimate import Estimate

_log = logging.getLogger(__name__)  # diagnostics; the CLI installs the handler that prints them


def pareto_mask(points: Sequence[tuple[float, float]]) -> list[bool]:
    """For (time, energy) pairs: True where no other pair is at least as good in both and better in one."""
    out = []
    for i, (t, e) in enumerate(points):
        dominated = any((t2 <= t and e2 <= e) and (t2 < t or e2 < e) for j, (t2, e2) in enumerate(points) if j != i)
        out.append(not dominated)
    return out


@dataclass(frozen=True, eq=False)
class RankedStrategy:
    """One strategy under the energy planner: ``index`` into the estimates given, its pipelines, the chosen point,
    whether that point meets the slowdown bound, and whether it is on the time–energy Pareto set."""

    index: int
    energy: StrategyEnergy
    point: StrategyPoint
    within_bound: bool
    pareto: bool

    @property
    def direct(self) -> bool:
        """Whether its point was solved directly in its cost window, no frontier traced (priced, perseus)."""
        return self.within_bound and not self.energy.traced


@dataclass(frozen=True)
class EnergyRanking:
    """Strategies ordered by the objective (best first) with the figures that decided it."""

    ranked: tuple[RankedStrategy, ...]
    objective: str
    max_slowdown: float | None
    fastest_s: float  # iteration time of the fastest strategy's T_min point
    bound_s: float | None  # (1 + max_slowdown) · fastest_s
    evaluated: int  # strategies whose frontiers were traced for the result
    screened: int  # strategies ranked by the cheaper screening pass
    traced: int  # distinct replica frontiers behind the result
    seconds: float
    coarsening: float = 1.0  # τ × this over the default, chosen by ampe.energy.budget (1: unchanged)
    note: str | None = None  # the one line saying so
    bounded: int = 0  # strategies within the bound neither screened nor planned: their cost floor ruled them out


def _plan_many(tasks: list[tuple[int, float | None]], estimates: Sequence[Estimate], cluster: Cluster, jobs: int,
               cache: FrontierCache, tally: _Tally | None = None, priced: dict[int, Weights] | None = None,
               direct: dict[int, float] | None = None, **kw: Any) -> list[StrategyEnergy]:
    """plan_clocks for every (index, max_time_s) task; in ``jobs`` joblib workers when jobs > 1. ``tally`` counts
    each finished task's estimated work (progress); ``priced``: each strategy's weights (cost, carbon);
    ``direct``: the strategies whose points are only solved directly (``ClockRequest.traced`` False), each with the end
    of its cost window (iteration time, s: ``ClockRequest.window_s``)."""
    priced, direct = priced or {}, direct or {}
    how = (kw.get("screen", False), kw.get("fastest_only", False))
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for i, lim in tasks:
            inner = None if tally is None else tally.within(i, *how)  # a large strategy reports as it is traced
            out.append(plan_clocks(estimates[i], cluster, max_time_s=lim, cache=cache, weights=_per_joule(priced, i),
                                   progress=inner, traced=i not in direct, window_s=direct.get(i), **kw))
            if tally is not None:
                tally.done(i, *how)
        return out
    from joblib import Parallel, delayed
    from joblib.parallel import get_active_backend

    # each result counted as it comes back, in task order, where the backend can hand them over one by one (loky,
    # threads); others (multiprocessing, some cluster backends) count them all at the end
    one_by_one = bool(getattr(get_active_backend()[0], "supports_return_generator", False))
    planned = []
    for (i, _), se in zip(tasks, Parallel(n_jobs=min(jobs, len(tasks)),
                                          return_as="generator" if one_by_one else "list")(
            delayed(plan_clocks)(estimates[i], cluster, max_time_s=lim, weights=_per_joule(priced, i),
                                 traced=i not in direct, window_s=direct.get(i), **kw)
            for i, lim in tasks), strict=True):
        planned.append(se)
        if tally is not None:
            tally.done(i, *how)
    return planned


@dataclass
class _Tally:
    """Estimated work done so far, reported to a progress callback as (node-steps done, node-steps expected)."""

    jobs: dict[int, budget.Job]
    planner: str
    unit_s: float | None
    coarsening: float
    total: float
    report: Callable[[float, float], None] | None
    so_far: float = 0.0
    direct: frozenset[int] = frozenset()  # strategies solved directly, no trace (:func:`_direct_by_work`)

    def work(self, i: int, screen: bool, fastest_only: bool) -> float:
        """Estimated node-steps of one plan_clocks call for strategy ``i``."""
        job = self.jobs.get(i)
        if job is None:
            return 0.0
        if i in self.direct and not (screen or fastest_only):
            return _window_lps(job)
        if fastest_only:
            fixed, _ = budget.frontier_work(job, self.planner, None, self.unit_s)
            return fixed + (budget.lp_steps(job.nodes) if self.planner == "perseus" else 0.0)
        res = (SCREEN_RESOLUTION if screen else RESOLUTION) / self.coarsening
        fixed, frontier = budget.frontier_work(job, self.planner, res, None if screen else self.unit_s)
        return fixed + frontier + (_planned_lps(job) if self.planner == "perseus" and not screen else 0.0)

    def within(self, i: int, screen: bool, fastest_only: bool) -> Callable[[float, float], None]:
        """A progress callback for strategy ``i``'s own planning (its replicas, :func:`plan_clocks`): reports the
        share of its estimated work done so far, without counting it (:meth:`done` does, once it is planned)."""
        def report(done: float, total: float) -> None:
            if self.report is not None and total > 0:
                now = self.so_far + self.work(i, screen, fastest_only) * min(1.0, done / total)
                self.report(min(now, self.total), self.total)

        return report

    def done(self, i: int, screen: bool = False, fastest_only: bool = False, steps: float | None = None) -> None:
        """Count strategy ``i``'s finished call (or ``steps`` node-steps) and report."""
        self.so_far += self.work(i, screen, fastest_only) if steps is None else steps
        if self.report is not None:
            self.report(min(self.so_far, self.total), self.total)


def rank_strategies(estimates: Sequence[Estimate], cluster: Cluster, *, objective: str = "time",
                    max_slowdown: float | None = None, top_k: int = 10, planner: str = "perseus",
                    unit_s: float | None = None, straggler: float = 1.0, margin: float = 0.0,
                    jobs: int = 1, progress: Callable[[float, float], None] | None = None,
                    bound_prices: bool = True, frontier_bound: float = budget.FRONTIER_BOUND,
                    priced_direct: bool | None = None, max_dag_nodes: int = budget.MAX_DAG_NODES) -> EnergyRanking:
    """Order costed strategies by ``objective`` and choose each one's frontier point.

    * ``time``: the ``top_k`` fastest strategies (by their T_min point), each at its T_min point;
    * ``energy`` / ``edp`` / ``cost`` / ``carbon``: among strategies and points whose iteration time is within
      ``max_slowdown`` (a fraction, default 5%) of the fastest strategy's, least energy / energy × time / money /
      CO2e first (the last two priced by ``cluster.pricing``, :mod:`ampe.energy.price`); then, if fewer than
      ``top_k`` meet the bound, the fastest others at their T_min points (``within_bound`` False).

    Frontiers are traced only for those within the bound (or the ``top_k`` fastest); more than 2·top_k are first
    screened with a coarse τ; priced, those whose cost floor rules them out are skipped (``bound_prices``). Pareto
    marks cover every strategy planned at full resolution. The work is estimated first (:mod:`ampe.energy.budget`):
    beyond its bound τ is coarser (``coarsening``; ``note``, logged at INFO first), far beyond it InputError refuses.

    Args:
        estimates: the strategies' cost-model estimates (iteration times in s).
        cluster: the cluster they run on (its ``pricing`` for the cost and carbon objectives).
        objective: time, energy, edp, cost or carbon.
        max_slowdown: the bound, a fraction of the fastest strategy's time (None: 5 %; the time objective: 0).
        top_k: strategies ranked.
        planner: perseus, envpipe or global.
        unit_s: τ of the frontiers (s; None: each strategy's T_min / 1000).
        straggler: the synchronous pipeline time as a factor of the slowest replica's T_min (≥ 1).
        margin: plan as if every slowed computation ran this fraction longer (0..1).
        jobs: joblib workers.
        progress: ``progress(done, total)`` as strategies are planned (estimated node-steps).
        bound_prices: priced objectives: skip strategies whose cost floor rules them out (same top k; docs/energy.md).
        frontier_bound: node-steps of frontier tracing before τ is coarsened (:func:`ampe.energy.budget.decide`).
        priced_direct: priced, perseus: points solved directly (True), traced (False), by work (None; §10.9).
        max_dag_nodes: one strategy's DAG nodes at most (InputError for one it visits over it, before building it).

    Returns:
        The strategies best first, each at its chosen point (time in s, energy in J per iteration), and the
        figures that decided it (:class:`EnergyRanking`).
    """
    goal = objective_named(objective)
    t0 = time.perf_counter()
    weights = _priced(estimates, cluster, goal)
    x = (DEFAULT_MAX_SLOWDOWN if max_slowdown is None else max_slowdown) if goal.slows else 0.0
    if x < 0:
        raise ValueError(f"max slowdown must be ≥ 0, got {x}")
    cache, order = FrontierCache(), sorted(range(len(estimates)), key=lambda i: estimates[i].iteration_s)
    decision, tally = _budget(estimates, cluster, order, objective, x, top_k, planner, unit_s, straggler, cache,
                              frontier_bound, progress, max_dag_nodes, bound_prices and bool(weights) and priced_direct)
    fast, bounds = _fastest_points(estimates, cluster, order, top_k, x, straggler, tally,
                                   weights if bound_prices and goal.slows else {}, None if goal.slows else cache,
                                   max_dag_nodes)
    fastest = min(fast.values())
    bound = (1 + x) * fastest if goal.slows else None
    by_time = sorted(fast, key=lambda i: (fast[i], i))
    kw: dict[str, Any] = dict(planner=planner, unit_s=unit_s, straggler=straggler, margin=margin,
                              coarsening=decision.coarsening)
    screened = bounded = 0
    if bound is None:
        idx = by_time[:top_k]
        planned = _plan_many([(i, None) for i in idx], estimates, cluster, jobs, cache, tally, fastest_only=True, **kw)
        chosen = [(i, se, se.fastest(), True) for i, se in zip(idx, planned, strict=True)]
    else:
        feasible = [i for i in by_time if fast[i] <= bound * (1 + 1e-9)]
        keep, screened, bounded = (feasible, 0, 0) if len(feasible) <= 2 * top_k else _screened(
            estimates, cluster, feasible, fast, bounds, bound, goal, weights, tally, top_k, kw)
        chosen, skipped = _within_bound(estimates, cluster, keep, bound, goal, weights, jobs, cache, tally, kw, bounds,
                                        top_k, priced_direct)
        bounded += skipped
        rest = [i for i in by_time if i not in feasible][: max(0, top_k - len(chosen))]
        planned = _plan_many([(i, None) for i in rest], estimates, cluster, jobs, cache, tally, weights,
                             fastest_only=True, **kw)
        chosen += [(i, se, se.fastest(), False) for i, se in zip(rest, planned, strict=True)]
    if progress is not None:  # the estimate is an upper bound: the bar ends full
        progress(tally.total, tally.total)
    marks = pareto_mask([(sp.time_s, sp.energy_j) for _, _, sp, _ in chosen])
    ranked = tuple(RankedStrategy(i, se, sp, ok, m) for (i, se, sp, ok), m in zip(chosen, marks, strict=False))
    traced = len({id(r.frontier) for _, se, _, _ in chosen for r in se.replicas})
    return EnergyRanking(ranked, objective, x if goal.slows else None, fastest, bound, len(chosen),
                         screened, traced, time.perf_counter() - t0, decision.coarsening, decision.note, bounded)


_Chosen = tuple[int, StrategyEnergy, StrategyPoint, bool]  # (strategy index, its energy, its point, within bound)


def _fastest_points(estimates: Sequence[Estimate], cluster: Cluster, order: list[int], top_k: int, x: float,
                    straggler: float, tally: _Tally, weights: dict[int, Weights], shared: FrontierCache | None = None,
                    max_nodes: int = budget.MAX_DAG_NODES) -> tuple[dict[int, float], dict[int, CostBounds]]:
    """Strategy index → its T_min point's iteration time (s), in cost-model order (``order``) until no later
    strategy can be within (1 + ``x``) of the fastest or among the ``top_k`` fastest (a strategy's T_min time is
    never below its cost-model time); and where ``weights`` prices a strategy, its bounds
    (:func:`~ampe.energy.price.cost_bounds`, from the DAGs built here). ``shared``: the DAGs kept there (the time
    objective, whose few strategies visited here are nearly all planned: they reuse them), else one cache each.
    A strategy beyond the work estimate's (a later one among the top k by T_min) is held to ``max_nodes`` before its
    DAG is built."""
    fast: dict[int, float] = {}
    bounds: dict[int, CostBounds] = {}
    for i in order:
        times = sorted(fast.values())
        if times:
            kth = times[min(top_k, len(times)) - 1] if len(times) >= top_k else math.inf
            if estimates[i].iteration_s > max(kth, (1 + x) * times[0]) * (1 + 1e-12):
                break
        # a cache of its own: keeping every visited strategy's DAG and option table (nodes × clocks) held 1.5 GB at
        # a 500 % bound; the few planned later rebuild theirs (30 node-steps a node, against 300+ to plan it)
        own = shared if shared is not None else FrontierCache()
        if i not in tally.jobs:
            budget.check_nodes([job_of(i, estimates[i], cluster)], "energy planning", max_nodes)
        fast[i] = fastest_time_s(estimates[i], cluster, straggler, own)
        if i in weights:
            dags = [replica_dag(inp, own) for inp in replica_inputs(estimates[i], cluster)]
            bounds[i] = cost_bounds(dags, weights[i], fast[i])
        if i in tally.jobs:
            tally.done(i, steps=tally.jobs[i].nodes * budget.BUILD_STEPS)
    return fast, bounds


def _screened(estimates: Sequence[Estimate], cluster: Cluster, feasible: list[int], fast: dict[int, float],
              bounds: dict[int, CostBounds], bound: float, goal: Objective, weights: dict[int, Weights], tally: _Tally,
              top_k: int, kw: dict[str, Any]) -> tuple[list[int], int, int]:
    """The 2·``top_k`` strategies of ``feasible`` best by ``goal`` on a coarse frontier (ties: faster first), how
    many were ranked (all of ``feasible``) and how many of them were never screened: visited in order of their cost
    floors (``bounds``: below every score of theirs, where given), the rest are skipped once the next floor is above
    the 2·top_k-th score so far (none of them can rank before those 2·top_k, so the strategies kept are the same as
    with every one screened)."""
    scores: dict[int, float] = {}
    best: list[float] = []  # the 2·top_k least scores so far, ascending
    floors = {i: b.floor for i, b in bounds.items()}
    visit = sorted(feasible, key=lambda i: floors.get(i, -math.inf))  # stable: unchanged where no floors
    for i in visit:
        if len(best) == 2 * top_k and i in floors and floors[i] > best[-1] + 1e-9 * abs(best[-1]):
            break  # the floors ascend from here (those without one came first): every later one is out too
        # a cache of its own: a screened frontier is never reused at full resolution, so keeping every one
        # (hundreds of strategies at a wide --max-slowdown) only held memory
        se = plan_clocks(estimates[i], cluster, max_time_s=bound, screen=True, cache=FrontierCache(),
                         weights=_per_joule(weights, i), **kw)
        tally.done(i, screen=True)
        sp = goal.best(se, bound, weights.get(i))
        scores[i] = math.inf if sp is None else goal.score(se, sp, weights.get(i))
        bisect.insort(best, scores[i])
        del best[2 * top_k:]
    place = {i: n for n, i in enumerate(feasible)}  # ties as a stable sort of ``feasible``, whatever the visit order
    kept = sorted(scores, key=lambda i: (scores[i], fast[i], place[i]))[: 2 * top_k]
    return kept, len(feasible), len(feasible) - len(scores)


def _within_bound(estimates: Sequence[Estimate], cluster: Cluster, keep: list[int], bound: float, goal: Objective,
                  weights: dict[int, Weights], jobs: int, cache: FrontierCache, tally: _Tally,
                  kw: dict[str, Any], bounds: dict[int, CostBounds], top_k: int,
                  priced_direct: bool | None = None) -> tuple[list[_Chosen], int]:
    """Strategies ``keep`` planned at full resolution, each at ``goal``'s best point within ``bound`` (s), best
    first (ties: faster first; those without a point within it left out), and how many were not planned. Where
    ``bounds`` are given, one whose floor is above the ``top_k``-th least ceiling is not planned (it cannot rank
    among the top k) unless its bounds let it dominate a planned point in time and energy (the Pareto marks stay
    those of planning every one). A strategy :func:`_solved_directly` (by ``priced_direct``) gets only its points up
    to the end of its cost window (:attr:`~ampe.energy.price.CostBounds.slowest_s`) or ``bound``, the earlier, solved
    directly, no frontier traced."""
    direct = {i: bounds[i].slowest_s for i in _solved_directly(estimates, cluster, keep, bounds, tally, kw,
                                                                 priced_direct)}
    chosen: list[_Chosen] = []
    skip = _out_of_top(keep, bounds, top_k)
    todo = [i for i in keep if i not in skip]
    while todo:
        planned = _plan_many([(i, min(bound, bounds[i].slowest_s) if i in direct else bound) for i in todo],
                             estimates, cluster, jobs, cache, tally, weights, direct, **kw)
        for i, se in zip(todo, planned, strict=True):
            sp = goal.best(se, bound, weights.get(i))
            if sp is not None:
                chosen.append((i, se, sp, True))
        todo = [i for i in keep if i in skip and _may_dominate(bounds[i], chosen)]
        skip -= set(todo)
    place = {i: n for n, i in enumerate(keep)}  # ties in the order of ``keep``, whatever the planning order
    chosen.sort(key=lambda c: (goal.score(c[1], c[2], weights.get(c[0])), c[2].time_s, place[c[0]]))
    return chosen, len(skip)


def _solved_directly(estimates: Sequence[Estimate], cluster: Cluster, keep: list[int], bounds: dict[int, CostBounds],
                     tally: _Tally, kw: dict[str, Any], priced_direct: bool | None) -> frozenset[int]:
    """The strategies of ``keep`` whose points are solved directly in their cost windows, no frontier traced: priced
    ones (with ``bounds``) under perseus, as the work estimate counted them (``tally.direct``; one it did not visit,
    by the same rule: :func:`_direct_by_work`)."""
    if priced_direct is False or kw.get("planner") != "perseus":
        return frozenset()
    priced = [i for i in keep if i in bounds]
    jobs = {i: tally.jobs.get(i) or job_of(i, estimates[i], cluster) for i in priced}
    unvisited = _direct_by_work({i: j for i, j in jobs.items() if i not in tally.jobs}, priced_direct, kw.get("unit_s"))
    out = frozenset(i for i in priced if i in tally.direct or i in unvisited)
    for i in priced:
        _log.debug("%s: %s (its trace ≈ %.2g node-steps at the default τ)", jobs[i].label,
                   "solved directly" if i in out else "traced",
                   budget.frontier_work(jobs[i], "perseus", RESOLUTION, kw.get("unit_s"))[1])
    return out


def _direct_by_work(jobs: dict[int, budget.Job], mode: bool | None, unit_s: float | None) -> frozenset[int]:
    """The strategies of ``jobs`` whose points are solved directly (``mode`` as :func:`rank_strategies`'
    ``priced_direct``, False where that path does not apply): every one (True), none (False), or those whose trace at
    the default τ is not cheap (None: :func:`ampe.energy.budget.trace_is_cheap`). Decided at the default τ, before
    the work bound may coarsen it, so the estimate that bound is applied to counts each strategy's own path (an LP
    per point, not a trace, for these)."""
    if mode is False:
        return frozenset()
    return frozenset(i for i, job in jobs.items() if mode or not budget.trace_is_cheap(job, unit_s, 1.0, RESOLUTION))


def _out_of_top(keep: list[int], bounds: dict[int, CostBounds], top_k: int) -> set[int]:
    """The strategies of ``keep`` whose floor is above the ``top_k``-th least ceiling: at least ``top_k`` others
    score below every point of theirs (none where ``bounds`` lacks one of ``keep``)."""
    if len(keep) <= top_k or any(i not in bounds for i in keep):
        return set()
    kth = sorted(bounds[i].ceiling for i in keep)[top_k - 1]
    return {i for i in keep if bounds[i].floor > kth + 1e-9 * abs(kth)}


def _may_dominate(b: CostBounds, chosen: list[_Chosen]) -> bool:
    """Whether a strategy with bounds ``b`` could have a point at least as fast and as frugal as one chosen."""
    return any(b.fastest_s <= sp.time_s * (1 + 1e-9) and b.energy_floor_j <= sp.energy_j * (1 + 1e-9)
               for _, _, sp, _ in chosen)


def _priced(estimates: Sequence[Estimate], cluster: Cluster, goal: Objective) -> dict[int, Weights]:
    """Per strategy index, the weights its points are priced with under a priced objective (empty otherwise);
    :class:`~ampe.errors.InputError` when the cluster spec lacks a figure the objective needs."""
    if not goal.priced:
        return {}
    pricing = require(getattr(cluster, "pricing", None), goal.name, getattr(cluster, "source", "") or "cluster spec")
    return {i: strategy_weights(pricing, e.strategy, goal.name) for i, e in enumerate(estimates)}


def _per_joule(priced: dict[int, Weights], i: int) -> tuple[tuple[float, ...], ...] | None:
    """Strategy ``i``'s per-joule weights (replica × stage) under a priced objective, None otherwise."""
    w = priced.get(i)
    return None if w is None else w.per_joule


WARM_LP = 0.25  # a point solved directly from the T_min point's basis costs about a quarter of that cold LP


def _planned_lps(job: budget.Job) -> float:
    """Node-steps of the LPs of one strategy planned at full resolution for the energy objectives: the T' point and
    the points inside the bound (:func:`direct_deadlines`, warm-started: 0.25 s against 1.0 s at 8 × 192)."""
    direct = DIRECT_POINTS if job.computations <= DIRECT_LARGE else DIRECT_POINTS_LARGE
    return budget.lp_steps(job.nodes) * (1.0 + WARM_LP * direct)


def _window_lps(job: budget.Job) -> float:
    """Node-steps of the LPs of one strategy whose points are solved directly in its cost window (priced: the T'
    point, then :func:`~ampe.energy.strategy.window_deadlines`' at most two, warm-started)."""
    return budget.lp_steps(job.nodes) * (1.0 + WARM_LP * 2)


def _budget(estimates: Sequence[Estimate], cluster: Cluster, order: list[int], objective: str, x: float, top_k: int,
            planner: str, unit_s: float | None, straggler: float, cache: FrontierCache, frontier_bound: float,
            progress: Callable[[float, float], None] | None, max_nodes: int = budget.MAX_DAG_NODES,
            priced_direct: bool | None = False) -> tuple[budget.Decision, _Tally]:
    """Estimate the work of :func:`rank_strategies` before it starts and apply the bounds (:mod:`ampe.energy.budget`;
    the line saying τ was coarsened is logged at INFO here).

    Which strategies can be visited is known from the cost model alone: a strategy's T_min point is never faster than
    its ``iteration_s``, so none slower than (1 + x) × the first strategy's T_min point can be within the bound; the
    top k by ``iteration_s`` are visited in any case. Only that first T_min point is computed here (one DAG, held to
    ``max_nodes`` before it is built, as every candidate is). ``priced_direct``: the priced path
    (:func:`_direct_by_work`'s ``mode``; priced, perseus); a strategy solved directly counts its LPs, not a trace."""
    first = {order[0]: job_of(order[0], estimates[order[0]], cluster)} if order else {}
    budget.check_nodes(list(first.values()), "energy planning", max_nodes)
    t_first = fastest_time_s(estimates[order[0]], cluster, straggler, cache) if order else 0.0
    reach = (1 + x) * t_first * (1 + 1e-12)
    cand = [i for n, i in enumerate(order) if n < top_k or estimates[i].iteration_s <= reach]
    jobs = {i: first.get(i) or job_of(i, estimates[i], cluster) for i in cand}
    budget.check_nodes(list(jobs.values()), "energy planning", max_nodes)
    fixed = float(sum(j.nodes for j in jobs.values()) * budget.BUILD_STEPS)
    frontier = 0.0
    tally = _Tally(jobs, planner, unit_s, 1.0, 0.0, progress,
                   direct=_direct_by_work(jobs, priced_direct if planner == "perseus" else False, unit_s))
    if objective == "time":
        fixed += sum(tally.work(i, False, True) for i in cand[:top_k])
        flag, what = "--top-k", f"the top {min(top_k, len(cand))} strategies"
    else:
        share = 1.0  # of the candidates planned at full resolution
        if len(cand) > 2 * top_k:  # every one screened, then 2k of them (which ones is not known yet: their mean)
            for i in cand:
                f, g = budget.frontier_work(jobs[i], planner, SCREEN_RESOLUTION, None)
                fixed, frontier = fixed + f, frontier + g
            share = 2 * top_k / len(cand)
        for i in cand:
            if i in tally.direct:  # its points' LPs, no trace
                fixed += share * _window_lps(jobs[i])
                continue
            f, g = budget.frontier_work(jobs[i], planner, RESOLUTION, unit_s)
            fixed += share * (f + (_planned_lps(jobs[i]) if planner == "perseus" else 0.0))
            frontier += share * g
        flag, what = "--max-slowdown", (f"up to {len(cand)} strategies within {x * 100:g} % of the fastest "
                                        f"({planner} frontiers)")
    decision = budget.decide(budget.Work(fixed, frontier, len(cand)), flag, what, unit_s is not None, frontier_bound)
    if decision.note:
        _log.info(decision.note)
    tally.coarsening, tally.total = decision.coarsening, decision.work.at(decision.coarsening)
    return decision, tally
