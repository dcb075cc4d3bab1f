"""Energy of costed parallel strategies: per-replica frontiers, extrinsic bloat, whole-cluster accounting, and the
choice of strategy and frontier point under a time / energy / energy-delay objective (``ampe search``).

For one strategy (a cost-model ``Estimate``):

1. every data-parallel replica r gets its computation DAG (:func:`ampe.energy.inputs.inputs_from_estimate`: forward
   and backward seconds per stage at f_max, P2P seconds, the GPU type setting each stage's pace, tp GPUs per stage);
   identical replicas share one DAG and one frontier;
2. each distinct replica's frontier is traced (Perseus, or a baseline: EnvPipe, one global clock);
3. a synchronous pipeline time T' ≥ straggler · max_r T_min,r is chosen; replica r runs its cheapest point not
   slower than min(T*_r, T') (extrinsic bloat, :func:`ampe.energy.bloat.plan_at`);
4. energy of one iteration, all devices:

       E = Σ_r [Σ_i e_i + Σ_s P_block,s · (T' − busy_s)]  +  P_block,all · post
       time = T' + post,    post = max(0, est.iteration_s − max_r T_min,r)

   ``post`` is the cost model's iteration time beyond the DAG's pipeline time: the gradient all-reduce, tied-weight
   sync and optimizer step (``Estimate.tail_s``), plus any gap between the cost model's pipeline formula and the
   exact DAG. Every device spends it at *blocking* power (decision: the all-reduce is communication, and the Adam
   step is memory-bound and short; the DVFS model has no memory-bound power figure, so blocking power is the honest
   lower estimate). At all-max clocks and no straggler, ``time`` equals the cost model's iteration time, so the
   energy planner only adds the slowdown it chooses.

Choosing among strategies under an objective is :mod:`ampe.energy.ranking`.

Time of a strategy (for ``--max-slowdown``) is its T_min point: every clock at maximum, T' = straggler · max_r
T_min,r, intrinsic and extrinsic bloat removed without slowing down. See docs/energy.md §10.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ampe.energy.baselines import envpipe, global_clock
from ampe.energy.bloat import PipelineFrontier
from ampe.energy.clock_request import PLANNERS, ClockRequest, FrontierKey
from ampe.energy.inputs import PipelineInputs, dag_from_inputs, energy_source, inputs_key, replica_inputs
from ampe.energy.plan import plan_of
from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.direct import WarmStarts, point_by
from ampe.tradeoff.evaluate import Evaluation, OptionTable, evaluate_batch, evaluate_choice
from ampe.tradeoff.frontier import FrontierPoint, Progress, halves, pareto_filter, trace_frontier

if TYPE_CHECKING:
    from ampe.costmodel.cluster import Cluster
    from ampe.costmodel.estimate import Estimate
    from ampe.formats.frequency_plan import FrequencyPlan, StageSteps
    from ampe.formats.plan import PlannerName

DEFAULT_MAX_SLOWDOWN = 0.05  # energy / edp objectives: at most 5% slower than the fastest strategy
RESOLUTION = 1000  # default τ = T_min / RESOLUTION for the plans written
SCREEN_RESOLUTION = 200  # τ = T_min / SCREEN_RESOLUTION when screening many strategies
ENVPIPE_EPSILONS = (0.0, 0.01, 0.02, 0.05, 0.1)  # EnvPipe's allowed slowdowns that make its "frontier"
_REL = 1e-12


@dataclass(frozen=True, eq=False)
class ReplicaPipeline:
    """One data-parallel replica: its inputs, DAG and realized frontier (identical replicas share these objects)."""

    inputs: PipelineInputs
    dag: ComputationDag
    frontier: PipelineFrontier
    all_max_choice: np.ndarray  # every computation at its fastest option


@dataclass(frozen=True, eq=False)
class StrategyPoint:
    """One operating point of a whole strategy: every replica's frontier point for synchronous pipeline time
    ``t_prime_s``; ``time_s`` is the iteration time (s), ``energy_j`` the energy of one iteration of every device
    (J), ``energy_max_clock_j`` the same strategy with every clock at maximum."""

    t_prime_s: float
    time_s: float
    energy_j: float
    energy_max_clock_j: float
    points: tuple[FrontierPoint, ...]  # per replica

    @property
    def savings_pct(self) -> float:
        """Energy saved against every clock at maximum, in percent."""
        return 100.0 * (1.0 - self.energy_j / self.energy_max_clock_j) if self.energy_max_clock_j > 0 else 0.0

    @property
    def average_power_w(self) -> float:
        """Mean power of all devices over the iteration (W)."""
        return self.energy_j / self.time_s if self.time_s > 0 else 0.0

    @property
    def edp(self) -> float:
        """Energy-delay product (J·s)."""
        return self.energy_j * self.time_s


@dataclass(frozen=True, eq=False)
class StrategyEnergy:
    """The energy planner's view of one strategy: replica pipelines and the post-pipeline phase (see the module
    docstring). Points are made on demand: :meth:`fastest`, :meth:`at`, :meth:`point_of`; the best one for an
    objective: :meth:`ampe.energy.objective.Objective.best`."""

    replicas: tuple[ReplicaPipeline, ...]
    post_s: float  # post-pipeline seconds, every device at blocking power
    straggler: float
    planner: str
    unit_s: float  # τ of the frontiers
    source: str  # how the energy figures were obtained (always a model here)
    margin: float = 0.0  # planning guard band (fraction)
    traced: bool = True  # False: its points were only solved directly, no frontier traced (ClockRequest.traced)

    @cached_property
    def distinct_frontiers(self) -> list[tuple[PipelineFrontier, int, np.ndarray, np.ndarray]]:
        """(frontier, number of replicas sharing it, point times, point effective energies)."""
        seen: dict[int, list] = {}
        for r in self.replicas:
            f = r.frontier
            if id(f) in seen:
                seen[id(f)][1] += 1
            else:
                seen[id(f)] = [f, 1, np.array([p.time_s for p in f.points]),
                               np.array([p.effective_j for p in f.points])]
        return [(v[0], v[1], v[2], v[3]) for v in seen.values()]

    @property
    def t_min_s(self) -> float:
        """Synchronous pipeline time with every clock at maximum: the slowest replica's T_min (s)."""
        return max(r.frontier.t_min_s for r in self.replicas)

    @property
    def t_prime_min_s(self) -> float:
        """The fastest synchronous pipeline time: straggler · T_min (s)."""
        return self.straggler * self.t_min_s

    @property
    def blocking_w(self) -> float:
        """Power of every device of the strategy while waiting (W)."""
        return sum(r.frontier.blocking_w for r in self.replicas)

    @property
    def fastest_time_s(self) -> float:
        """Iteration time of the T_min point (s)."""
        return self.t_prime_min_s + self.post_s

    @property
    def all_max_energy_j(self) -> float:
        """Energy of one iteration with every clock at maximum (replicas wait for the straggler time) (J)."""
        eff = sum(r.frontier.all_max.effective_j for r in self.replicas)
        return eff + self.blocking_w * (self.t_prime_min_s + self.post_s)

    def at(self, t_prime_s: float) -> StrategyPoint:
        """The point for synchronous pipeline time ``t_prime_s`` (at least the straggler time)."""
        t = max(float(t_prime_s), self.t_prime_min_s)
        points = tuple(r.frontier.point_at(min(r.frontier.t_star_s, t)) for r in self.replicas)
        energy = sum(p.effective_j for p in points) + self.blocking_w * (t + self.post_s)
        return StrategyPoint(t, t + self.post_s, energy, self.all_max_energy_j, points)

    def point_of(self, t_prime_s: float, points: Sequence[FrontierPoint]) -> StrategyPoint:
        """The point where replica r runs ``points[r]`` (each not slower than ``t_prime_s``) and waits until T'."""
        energy = sum(p.effective_j for p in points) + self.blocking_w * (t_prime_s + self.post_s)
        return StrategyPoint(t_prime_s, t_prime_s + self.post_s, energy, self.all_max_energy_j, tuple(points))

    def fastest(self) -> StrategyPoint:
        """The T_min point: no slowdown, least energy (Perseus's default)."""
        return self.at(self.t_prime_min_s)


# ---------------------------------------------------------------------------------------------------------------
# Building a strategy's pipelines


@dataclass
class FrontierCache:
    """Frontiers already traced, shared across strategies with identical replica pipelines."""

    # key → (limit, frontier, the LP bases a warm-started solve left after it: see plan_clocks)
    entries: dict[FrontierKey, tuple[float, PipelineFrontier, dict]] = field(default_factory=dict)
    dags: dict[tuple, ReplicaDag] = field(default_factory=dict)
    traced: int = 0


@dataclass(frozen=True, eq=False)
class ReplicaDag:
    """A replica's DAG, option table, all-max choice and its evaluation."""

    inputs: PipelineInputs
    dag: ComputationDag
    table: OptionTable
    all_max_choice: np.ndarray
    all_max: Evaluation


def replica_dag(inputs: PipelineInputs, cache: FrontierCache | None = None) -> ReplicaDag:
    """The DAG of one replica with its all-max evaluation (built once per distinct replica in ``cache``)."""
    cache = cache if cache is not None else FrontierCache()
    key = inputs_key(inputs)
    hit = cache.dags.get(key)
    if hit is None:
        dag = dag_from_inputs(inputs)
        table = OptionTable.of(dag)
        choice = _fastest(table)
        hit = cache.dags[key] = ReplicaDag(inputs, dag, table, choice, evaluate_choice(dag, choice, table))
    return hit


def _fastest(table: OptionTable) -> np.ndarray:
    """Every node's fastest option, ties to the cheaper (as :func:`~ampe.tradeoff.evaluate.fastest_choice`)."""
    first = np.unique(table.row_of, return_index=True)[1]  # one node per row: the rows' options are its
    t, energy = table.time_s[first], table.row_energy_j[table.row_of[first]]
    e = np.where(t <= t.min(axis=1, keepdims=True), energy, np.inf)
    per_row = np.zeros(len(table.row_effective_j), dtype=np.int64)
    per_row[table.row_of[first]] = np.argmin(e, axis=1)
    return per_row[table.row_of]


def pipeline_t_min(estimate: Estimate, cluster: Cluster, cache: FrontierCache | None = None) -> float:
    """max_r T_min,r: the slowest replica's pipeline time at every clock maximum (s), from the exact DAG."""
    cache = cache or FrontierCache()
    return max(replica_dag(i, cache).all_max.time_s for i in replica_inputs(estimate, cluster))


def fastest_time_s(estimate: Estimate, cluster: Cluster, straggler: float = 1.0,
                   cache: FrontierCache | None = None) -> float:
    """Iteration time of a strategy's T_min point (s): straggler · max_r T_min,r + post (module docstring)."""
    t_min = pipeline_t_min(estimate, cluster, cache)
    return straggler * t_min + max(0.0, estimate.iteration_s - t_min)


def _as_point(ev: Evaluation, choice: Any) -> FrontierPoint:
    return FrontierPoint(ev.time_s, ev.energy_j, ev.effective_j, None, np.asarray(choice, dtype=np.int64))


def _frontier(built: ReplicaDag, req: ClockRequest, unit_s: float, limit_s: float, deadline_s: float,
              warm: WarmStarts | None = None, direct_s: Sequence[float] = (),
              progress: tuple[Progress, Progress] | None = None) -> PipelineFrontier:
    """The replica's realized frontier (τ ``unit_s``, up to ``limit_s``; T' ``deadline_s``). With a ``req.margin``
    the clocks are planned on the guard-band DAG (slowed computations (1 + margin) longer): a point's time stays its
    guard-band time (what a replica must fit into T'), its energies are re-evaluated on the true model.
    ``direct_s``: pipeline times (s) beyond T' at which a point is also solved directly (perseus, not screening:
    :func:`direct_deadlines`). ``progress``: the trace's and the realization's callbacks
    (:func:`~ampe.tradeoff.frontier.halves`)."""
    planner, screen, margin, fastest_only = req.planner, req.screen, req.margin, req.fastest_only
    dag, all_max = built.dag, built.all_max
    plan_dag = dag_from_inputs(built.inputs, margin) if margin else dag
    fastest = _as_point(all_max, built.all_max_choice)
    if planner == "perseus":
        traced, realized = progress or (None, None)
        points = [] if fastest_only or not req.traced else trace_frontier(
            plan_dag, unit_s, progress=traced, py_max_entries=req.py_max_entries).points(
            max_planned_s=limit_s, fill=not screen, progress=realized)
        if fastest_only or not screen:  # the point at T' (and at direct_s) solved directly (exact relaxation, no τ)
            same = plan_dag is dag  # the replica's own DAG: its table and all-max time are known
            for d in (deadline_s, *(() if fastest_only else direct_s)):
                choice, ev = point_by(plan_dag, d, built.table if same else None, warm,
                                      all_max.time_s if same else None, fold_from=req.fold_from)
                points.append(_as_point(ev, choice))
    elif planner == "envpipe":
        points = [_as_point(b.evaluation, b.choice) for b in (envpipe(plan_dag, e) for e in ENVPIPE_EPSILONS)]
    elif planner == "global":
        points = [_as_point(b.evaluation, b.choice) for b in global_clock(plan_dag)]
    else:
        raise ValueError(f"unknown energy planner {planner!r}; one of {', '.join(PLANNERS)}")
    if margin and points:
        _, _, eff = evaluate_batch(dag, built.table, np.stack([p.choice for p in points]))
        watts = built.table.total_blocking_w
        points = [FrontierPoint(p.time_s, float(eff[i]) + watts * p.time_s, float(eff[i]), p.planned_s, p.choice)
                  for i, p in enumerate(points)]
    points.append(fastest)
    points.sort(key=lambda p: (p.time_s, p.effective_j))
    return PipelineFrontier(tuple(pareto_filter(points)), built.table.total_blocking_w, all_max)


DIRECT_POINTS = 4  # energy / edp objectives: points solved directly between T' and the slowdown bound …
DIRECT_POINTS_LARGE = 2  # … and for a pipeline of more than DIRECT_LARGE computations (an LP there takes seconds)
DIRECT_LARGE = 16_384


def direct_deadlines(t_prime_s: float, t_hi_s: float, computations: int = 0) -> tuple[float, ...]:
    """Pipeline times (s) at which the energy and edp objectives also solve a replica's point directly: evenly
    spaced from just above ``t_prime_s`` (T', the T_min point's) up to ``t_hi_s`` (the slowdown bound less the
    post-pipeline phase) included, :data:`DIRECT_POINTS` of them (:data:`DIRECT_POINTS_LARGE`, the bound and its
    midpoint, for a pipeline of more than :data:`DIRECT_LARGE` ``computations``); none when the bound leaves no room
    or is not finite.

    Why (docs/energy.md §10.3): the traced frontier is quantized to τ = T_min / 1000, and with many micro-batches a
    computation lasts only a few τ (GPT-3 2.7B, pp 8, 256 micro-batches: 1.2–2.6 τ), so within a bound of a few
    percent PD cannot slow any computation by less than a τ and finds almost nothing. A directly solved point
    (:func:`~ampe.tradeoff.direct.point_by`, real seconds, no τ) is exact there.
    """
    if not (math.isfinite(t_hi_s) and t_hi_s > t_prime_s * (1 + 1e-9)):
        return ()
    count = DIRECT_POINTS if computations <= DIRECT_LARGE else DIRECT_POINTS_LARGE
    return tuple(t_prime_s + (t_hi_s - t_prime_s) * j / count for j in range(1, count + 1))


def window_deadlines(t_prime_s: float, t_hi_s: float, window_end_s: float = math.inf) -> tuple[float, ...]:
    """The pipeline times (s) at which a replica's point is solved directly when its frontier is not traced
    (``ClockRequest.traced`` False: the priced objectives' direct path): the midpoint of T' (``t_prime_s``) and
    ``t_hi_s``, the end of the strategy's cost window or of the slowdown bound, the earlier (less the post-pipeline
    phase), and ``t_hi_s`` itself where the bound ends first (before ``window_end_s``, the window's end less that
    phase); none when the range is empty. At the window's end a point cannot beat the all-max one
    (:attr:`~ampe.energy.price.CostBounds.slowest_s`), but at the bound's end one can: without rent (carbon) the best
    point is often there (docs/energy.md §10.9). Few points: each costs as much as the T' one (its LP and repair)."""
    if not (math.isfinite(t_hi_s) and t_hi_s > t_prime_s * (1 + 1e-9)):
        return ()
    cut = (t_hi_s,) if t_hi_s < window_end_s * (1 - 1e-9) else ()
    return (t_prime_s + 0.5 * (t_hi_s - t_prime_s), *cut)


def plan_clocks(estimate: Estimate, cluster: Cluster, request: ClockRequest | None = None, *,
                cache: FrontierCache | None = None, progress: Progress | None = None,
                **fields: Any) -> StrategyEnergy:
    """Trace every distinct replica's frontier of one strategy.

    A replica whose stages are priced differently (``request.weights``) has its frontier traced on those weighted
    joules (time against money), its points then evaluated in real joules (sorted by time; Pareto in money, not
    necessarily in joules). ``fastest_only`` solves every replica's cheapest plan finishing by straggler · T_min
    directly (:func:`~ampe.tradeoff.direct.point_by`).

    Args:
        estimate: the strategy's cost-model estimate (:class:`~ampe.costmodel.estimate.Estimate`).
        cluster: the cluster it runs on (:class:`~ampe.costmodel.cluster.Cluster`).
        request: what to plan (:class:`ClockRequest`; None: the defaults).
        cache: frontiers traced before, shared across strategies with identical replica pipelines.
        progress: ``progress(done, total)`` of the replicas planned (fractions within one), as the frontiers are
            traced (``ampe frontier --plan``).
        **fields: shorthand for a request's fields (``screen=True``), applied over ``request``.

    Returns:
        The strategy's replicas with their frontiers (times in s, energies in J per iteration), its post-pipeline
        phase (s), τ (s) and the source of its energies.
    """
    req = replace(request or ClockRequest(), **fields) if fields else (request or ClockRequest())
    cache = cache or FrontierCache()
    inputs = replica_inputs(estimate, cluster)
    dags = [replica_dag(i, cache) for i in inputs]
    t_min = max(b.all_max.time_s for b in dags)
    post = max(0.0, estimate.iteration_s - t_min)
    tau = req.unit(t_min, SCREEN_RESOLUTION if req.screen else RESOLUTION)
    t_prime = req.straggler * t_min
    t_hi = req.highest_s(t_min, post)
    limit = t_hi * 1.01 + 4 * tau  # planned makespans a little above T' can still realize below it
    window_end = math.inf if req.window_s is None else req.window_s - post  # the cost window's, in pipeline time
    replicas = []
    # The LP of the point at T' (point_by) starts from the optimal bases of this strategy's earlier replicas, and an
    # LP with several optima may end at another vertex from another start: a replica's plan is a function of the
    # replicas solved before it in this strategy. Bases are therefore never shared across strategies, a cached
    # replica is reused only after the same earlier replicas, and it restores the bases it left; so a strategy gets
    # the same plan alone (`ampe frontier --plan`), in any order, and in a parallel worker as in the serial search.
    warm = WarmStarts()
    before: tuple = ()  # the distinct replicas of this strategy planned so far
    own: dict[tuple, tuple[float, PipelineFrontier, dict]] = {}  # this strategy's distinct replicas (dp copies)
    for r, (inp, real) in enumerate(zip(inputs, dags, strict=False)):
        traced = _weighted(inp, req.weights[r]) if req.weights is not None else inp
        built = real if traced is inp else replica_dag(traced, cache)
        ident = inputs_key(traced)
        hit = own.get(ident)
        if hit is None:
            direct = (() if not req.direct else direct_deadlines(t_prime, t_hi, int(built.dag.computation_mask.sum()))
                      if req.traced else window_deadlines(t_prime, t_hi, window_end))
            key = FrontierKey(ident, req.planner, tau, req.screen, req.margin, req.fastest_only, t_prime,
                              before if req.solves_lp else (), direct, req.fold_from, req.traced)
            hit = cache.entries.get(key)
            if hit is None or hit[0] < limit:
                frontier = _frontier(built, req, tau, limit, t_prime, warm, direct,
                                     None if progress is None else halves(progress, r, len(inputs)))
                if built is not real:
                    frontier = _in_joules(frontier, real)
                hit = cache.entries[key] = (limit, frontier, dict(warm.bases))
                cache.traced += 1
            else:
                warm.bases = dict(hit[2])
            own[ident] = hit
            before += (ident,)
        replicas.append(ReplicaPipeline(inp, real.dag, hit[1], real.all_max_choice))
        if progress is not None:
            progress(r + 1, len(inputs))
    return StrategyEnergy(tuple(replicas), post, req.straggler, req.planner, tau, energy_source(inputs), req.margin,
                          req.traced)


def _weighted(inputs: PipelineInputs, w: Sequence[float]) -> PipelineInputs:
    """``inputs`` with its stages' energies weighted by ``w`` (scaled to a largest weight of 1) where the stages are
    priced differently; ``inputs`` itself where they are alike (the plain frontier is then the priced one)."""
    top = max(w) if len(w) else 0.0
    if top <= 0 or all(x == w[0] for x in w):
        return inputs
    return replace(inputs, energy_weight=tuple(float(x) / top for x in w))


def _in_joules(frontier: PipelineFrontier, real: ReplicaDag) -> PipelineFrontier:
    """A frontier traced on weighted joules with its points re-evaluated in real joules (same clocks; times as traced,
    the guard band's where there is one), kept in time order: each is the cheapest in money at its time, not
    necessarily in joules."""
    points = frontier.points
    _, _, eff = evaluate_batch(real.dag, real.table, np.stack([p.choice for p in points]))
    watts = real.table.total_blocking_w
    out = [FrontierPoint(p.time_s, float(eff[k]) + watts * p.time_s, float(eff[k]), p.planned_s, p.choice)
           for k, p in enumerate(points)]
    return PipelineFrontier(tuple(out), real.table.total_blocking_w, real.all_max)


# ---------------------------------------------------------------------------------------------------------------
# Frequency plans


def _clock(mhz: float) -> int:
    """An integer SM clock not below ``mhz`` (plans carry integer MHz; rounding up never slows a computation)."""
    return max(1, math.ceil(mhz - 1e-6))


def _stage_lists(dag: ComputationDag, point: FrontierPoint) -> StageSteps:
    plan = plan_of(dag, point.choice, point.evaluation())
    # instructions are plan_of's "forward"/"backward" (the plan's model checks every step as it is built)
    return cast("StageSteps", [[[i, mb, _clock(f)] for i, mb, f in stage] for stage in plan.stages])


def is_all_max(se: StrategyEnergy, sp: StrategyPoint) -> bool:
    """True when every computation of every replica runs at its fastest option (nothing to apply)."""
    return all(np.array_equal(p.choice, r.all_max_choice) for r, p in zip(se.replicas, sp.points, strict=False))


def frequency_plan_of(se: StrategyEnergy, sp: StrategyPoint) -> FrequencyPlan:
    """The plan file's ``frequency_plan`` for point ``sp`` of strategy ``se``.

    ``stages``: replica 0's per-stage ``[instruction, microbatch, MHz]`` lists in execution order; when replicas
    run different plans (heterogeneous replicas) ``replicas`` lists every replica's stages and pipeline time (s) and
    each trial rank uses its replica's; when some replicas share a plan, ``replicas`` lists each distinct plan once
    and ``replica_plan`` gives each replica's entry. ``time_s``/``energy_j``: the iteration time (s) and energy (J,
    all devices) of the point; ``pipeline_time_s``: T' (s).
    """
    from ampe.formats.frequency_plan import FrequencyPlan, ReplicaPlan  # pydantic: only plan writers pay for it

    made: dict[tuple[int, int], int] = {}  # identical replicas share their DAG and point: made once
    distinct: list[tuple[StageSteps, float]] = []
    which = []
    for r, p in zip(se.replicas, sp.points, strict=False):
        key = (id(r.dag), id(p))
        if key not in made:
            made[key] = len(distinct)
            distinct.append((_stage_lists(r.dag, p), p.time_s))
        which.append(made[key])
    lists = [distinct[i][0] for i in which]
    own: dict[str, Any] = {}  # set only where replicas differ (unset fields stay out of the written JSON)
    if any(lst != lists[0] for lst in lists[1:]):
        if len(distinct) < len(which):  # replicas share plans: each distinct one once, and which one each runs
            own["replicas"] = [ReplicaPlan(stages=lst, pipeline_time_s=t) for lst, t in distinct]
            own["replica_plan"] = which
        else:
            own["replicas"] = [ReplicaPlan(stages=lst, pipeline_time_s=p.time_s)
                               for lst, p in zip(lists, sp.points, strict=True)]
    return FrequencyPlan(stages=lists[0], time_s=sp.time_s, energy_j=sp.energy_j,
                         energy_max_clock_j=sp.energy_max_clock_j, pipeline_time_s=sp.t_prime_s,
                         planner=cast("PlannerName", se.planner), unit_time_s=se.unit_s, straggler=se.straggler,
                         margin=se.margin, energy_source=se.source, **own)
