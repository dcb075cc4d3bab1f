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

Time of a strategy (for ``--max-slowdown``) is its T_min point: every clock at maximum, T' = straggler · max_r
T_min,r, intrinsic and extrinsic bloat removed without slowing down. See docs/energy.md §10.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ampe.energy import budget, dvfs
from ampe.energy.baselines import envpipe, global_clock
from ampe.energy.bloat import PipelineFrontier
from ampe.energy.dag import ComputationDag
from ampe.energy.direct import WarmStarts, point_by
from ampe.energy.evaluate import Evaluation, OptionTable, evaluate_batch, evaluate_choice
from ampe.energy.frontier import FrontierPoint, pareto_filter, trace_frontier
from ampe.energy.inputs import PipelineInputs, dag_from_inputs, inputs_from_estimate
from ampe.energy.plan import plan_of

PLANNERS = ("perseus", "envpipe", "global")
OBJECTIVES = ("time", "energy", "edp")
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
    docstring). Points are made on demand: :meth:`fastest`, :meth:`at`, :meth:`choose`."""

    replicas: tuple[ReplicaPipeline, ...]
    post_s: float  # post-pipeline seconds, every device at blocking power
    straggler: float
    planner: str
    unit_s: float  # τ of the frontiers
    source: str  # how the energy figures were obtained (always a model here)
    margin: float = 0.0  # planning guard band (fraction)

    @cached_property
    def _distinct(self) -> list[tuple[PipelineFrontier, int, np.ndarray, np.ndarray]]:
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

    def _energies(self, t_primes: np.ndarray) -> np.ndarray:
        """Energy (J) of one iteration for each synchronous pipeline time in ``t_primes`` (vectorised plan_at)."""
        eff = np.zeros(len(t_primes))
        for f, count, times, effs in self._distinct:
            target = np.minimum(f.t_star_s, t_primes) * (1 + _REL)
            idx = np.maximum(np.searchsorted(times, target, side="right") - 1, 0)
            eff += count * effs[idx]
        return eff + self.blocking_w * (t_primes + self.post_s)

    def at(self, t_prime_s: float) -> StrategyPoint:
        """The point for synchronous pipeline time ``t_prime_s`` (at least the straggler time)."""
        t = max(float(t_prime_s), self.t_prime_min_s)
        points = tuple(r.frontier.point_at(min(r.frontier.t_star_s, t)) for r in self.replicas)
        energy = sum(p.effective_j for p in points) + self.blocking_w * (t + self.post_s)
        return StrategyPoint(t, t + self.post_s, energy, self.all_max_energy_j, points)

    def fastest(self) -> StrategyPoint:
        """The T_min point: no slowdown, least energy (Perseus's default)."""
        return self.at(self.t_prime_min_s)

    def choose(self, objective: str, max_time_s: float | None = None) -> StrategyPoint | None:
        """The point that is best for ``objective`` among those whose iteration time is ≤ ``max_time_s`` (s; None:
        no bound), or None when even the T_min point is slower. ``time``: the T_min point; ``energy``: least energy;
        ``edp``: least energy × time (ties: the faster point)."""
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {objective!r}; one of {', '.join(OBJECTIVES)}")
        lo = self.t_prime_min_s
        if max_time_s is not None and lo + self.post_s > max_time_s * (1 + 1e-9):
            return None
        if objective == "time":
            return self.at(lo)
        hi = max(f.t_star_s for f, *_ in self._distinct)
        if max_time_s is not None:
            hi = min(hi, max_time_s * (1 + 1e-9) - self.post_s)
        hi = max(lo, hi)
        cands = np.unique(np.concatenate([[lo]] + [t[(t > lo) & (t <= hi)] for _, _, t, _ in self._distinct]))
        energy = self._energies(cands)
        score = energy if objective == "energy" else energy * (cands + self.post_s)
        best = float(score.min())
        k = int(np.flatnonzero(score <= best + 1e-9 * max(1.0, abs(best)))[0])  # ties: the fastest
        return self.at(float(cands[k]))


# ---------------------------------------------------------------------------------------------------------------
# Building a strategy's pipelines


def replica_inputs(estimate: Any, cluster: Any) -> tuple[PipelineInputs, ...]:
    """Every data-parallel replica's planner inputs from a cost-model ``Estimate`` (GPU types from
    ``Estimate.stage_gpu``, else each stage's first device in the cluster)."""
    s = estimate.strategy
    types = {g.name: g for g in cluster.gpu_types()}
    n_pos = s.pp * s.virtual_stages
    out = []
    for r in range(s.dp):
        if estimate.stage_gpu:
            gpus = [types[name] for name in estimate.stage_gpu[r]]
        else:
            gpus = [cluster.devices[s.device(p % s.pp, r, 0)].gpu for p in range(n_pos)]
        out.append(inputs_from_estimate(estimate, r, gpus, s.gas, tp=s.tp, schedule=s.schedule,
                                        virtual_stages=s.virtual_stages))
    return tuple(out)


def energy_source(inputs: Sequence[PipelineInputs]) -> str:
    """How the figures were obtained: measured per-clock profile rows, the DVFS model with its power rescaled to the
    profile's default-clock energy, or the analytic DVFS model (CPUs flagged: no energy counter here)."""
    kinds = {i.source(v) for i in inputs for v in range(len(i.gpus))}
    if kinds == {"measured"}:
        return "measured (per-clock profile: ampe profile --clocks)"
    derived = _derived_notes(inputs)
    parts = []
    if "measured" in kinds:
        parts.append("measured per-clock profile where it covers a stage")
    if "scaled" in kinds:
        parts.append("DVFS model rescaled to the profile's default-clock energy")
    if parts:
        return ("mixed: " + "; ".join(parts) + ("; DVFS model elsewhere" if "model" in kinds else "")
                + "".join(f"; {n}" for n in derived))
    notes = [*derived]
    if any(g.name == "cpu" for i in inputs for g in i.gpus):
        notes.append("cpu: no energy counter, parameters assumed")
    return "modelled (analytic DVFS model" + "".join(f"; {n}" for n in notes) + ")"


def _derived_notes(inputs: Sequence[PipelineInputs]) -> list[str]:
    """"TYPE: derived from BASE …" for every GPU type of ``inputs`` whose DVFS model is a catalog type's scaled to
    its TDP (:func:`ampe.energy.dvfs.derived_params`), in order of first appearance."""
    seen: dict[str, str] = {}
    for i in inputs:
        for g in i.gpus:
            if g.name not in seen:
                src = dvfs.params_for(g).source
                seen[g.name] = f"{g.name}: {src}" if src.startswith("derived from") else ""
    return [n for n in seen.values() if n]


@dataclass
class FrontierCache:
    """Frontiers already traced, shared across strategies with identical replica pipelines."""

    # key → (limit, frontier, the LP bases a warm-started solve left after it: see plan_clocks)
    entries: dict[tuple, tuple[float, PipelineFrontier, dict]] = field(default_factory=dict)
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


def _inputs_key(i: PipelineInputs) -> tuple:
    return (i.fwd_s, i.bwd_s, tuple(g.name for g in i.gpus), i.num_microbatches, i.p2p_forward_s,
            i.p2p_backward_s, i.gpus_per_stage, i.schedule, i.virtual_stages, i.measured, i.power_scale,
            i.activity)


def replica_dag(inputs: PipelineInputs, cache: FrontierCache | None = None) -> ReplicaDag:
    """The DAG of one replica with its all-max evaluation (built once per distinct replica in ``cache``)."""
    cache = cache if cache is not None else FrontierCache()
    key = _inputs_key(inputs)
    hit = cache.dags.get(key)
    if hit is None:
        dag = dag_from_inputs(inputs)
        table = OptionTable.of(dag)
        choice = _fastest(table)
        hit = cache.dags[key] = ReplicaDag(inputs, dag, table, choice, evaluate_choice(dag, choice, table))
    return hit


def _fastest(table: OptionTable) -> np.ndarray:
    """Every node's fastest option, ties to the cheaper (as :func:`~ampe.energy.evaluate.fastest_choice`)."""
    first = np.unique(table.row_of, return_index=True)[1]  # one node per row: the rows' options are its
    t, energy = table.time_s[first], table.row_energy_j[table.row_of[first]]
    e = np.where(t <= t.min(axis=1, keepdims=True), energy, np.inf)
    per_row = np.zeros(len(table.row_effective_j), dtype=np.int64)
    per_row[table.row_of[first]] = np.argmin(e, axis=1)
    return per_row[table.row_of]


def pipeline_t_min(estimate: Any, cluster: Any, cache: FrontierCache | None = None) -> float:
    """max_r T_min,r: the slowest replica's pipeline time at every clock maximum (s), from the exact DAG."""
    cache = cache or FrontierCache()
    return max(replica_dag(i, cache).all_max.time_s for i in replica_inputs(estimate, cluster))


def fastest_time_s(estimate: Any, cluster: Any, straggler: float = 1.0, cache: FrontierCache | None = None) -> float:
    """Iteration time of a strategy's T_min point (s): straggler · max_r T_min,r + post (module docstring)."""
    t_min = pipeline_t_min(estimate, cluster, cache)
    return straggler * t_min + max(0.0, estimate.iteration_s - t_min)


def _as_point(ev: Evaluation, choice: Any) -> FrontierPoint:
    return FrontierPoint(ev.time_s, ev.energy_j, ev.effective_j, None, np.asarray(choice, dtype=np.int64))


def _frontier(built: ReplicaDag, planner: str, unit_s: float, limit_s: float, screen: bool,
              margin: float, deadline_s: float, fastest_only: bool = False,
              warm: WarmStarts | None = None, direct_s: Sequence[float] = ()) -> PipelineFrontier:
    """The replica's realized frontier. With a ``margin`` the clocks are planned on the guard-band DAG (slowed
    computations (1 + margin) longer): a point's time stays its guard-band time (what a replica must fit into T'),
    its energies are re-evaluated on the true model. ``direct_s``: pipeline times (s) beyond T' at which a point is
    also solved directly (perseus, not screening: :func:`direct_deadlines`)."""
    dag, all_max = built.dag, built.all_max
    plan_dag = dag_from_inputs(built.inputs, margin) if margin else dag
    fastest = _as_point(all_max, built.all_max_choice)
    if planner == "perseus":
        points = [] if fastest_only else trace_frontier(plan_dag, unit_s).points(max_planned_s=limit_s,
                                                                                  fill=not screen)
        if fastest_only or not screen:  # the point at T' (and at direct_s) solved directly (exact relaxation, no τ)
            same = plan_dag is dag  # the replica's own DAG: its table and all-max time are known
            for d in (deadline_s, *(() if fastest_only else direct_s)):
                choice, ev = point_by(plan_dag, d, built.table if same else None, warm,
                                      all_max.time_s if same else None)
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
    (:func:`~ampe.energy.direct.point_by`, real seconds, no τ) is exact there.
    """
    if not (math.isfinite(t_hi_s) and t_hi_s > t_prime_s * (1 + 1e-9)):
        return ()
    count = DIRECT_POINTS if computations <= DIRECT_LARGE else DIRECT_POINTS_LARGE
    return tuple(t_prime_s + (t_hi_s - t_prime_s) * j / count for j in range(1, count + 1))


def plan_clocks(estimate: Any, cluster: Any, *, planner: str = "perseus", unit_s: float | None = None,
                  straggler: float = 1.0, max_time_s: float | None = None, screen: bool = False,
                  margin: float = 0.0, cache: FrontierCache | None = None,
                  fastest_only: bool = False, coarsening: float = 1.0) -> StrategyEnergy:
    """Trace every distinct replica's frontier of one strategy.

    ``unit_s``: τ in seconds (default T_min / 1000, T_min the slowest replica's all-max pipeline time; when
    screening, at least T_min / 200). ``max_time_s``: only the part of the frontiers an iteration of at most this
    many seconds can use is realized (None: up to the straggler time, enough for the T_min point). ``screen``:
    a cheaper pass (coarse τ, no fill between PD's fastest point and the all-max time) to rank many strategies.
    ``margin``: plan as if every slowed computation took (1 + margin) × its modelled time (a guard band against
    model error and run-to-run noise; figures are still those of the model itself). ``fastest_only``: only the
    T' point (every replica's cheapest plan finishing by straggler · T_min, solved directly by
    :func:`~ampe.energy.direct.point_by`) and all-max, no frontier: what the time objective needs. ``coarsening``:
    the default τ (both resolutions) times this factor, what :mod:`ampe.energy.budget` chooses for a search whose
    frontiers would take too long (an explicit ``unit_s`` is kept as given).
    """
    if planner not in PLANNERS:
        raise ValueError(f"unknown energy planner {planner!r}; one of {', '.join(PLANNERS)}")
    if not straggler >= 1.0:
        raise ValueError(f"straggler factor must be ≥ 1, got {straggler}")
    cache = cache or FrontierCache()
    inputs = replica_inputs(estimate, cluster)
    dags = [replica_dag(i, cache) for i in inputs]
    t_min = max(b.all_max.time_s for b in dags)
    post = max(0.0, estimate.iteration_s - t_min)
    if not (1.0 <= coarsening <= budget.MAX_COARSENING and 0.0 <= margin <= 1.0):
        raise ValueError(f"coarsening must be 1..{budget.MAX_COARSENING:g} and margin 0..1, got {coarsening}, {margin}")
    coarse = t_min / (SCREEN_RESOLUTION if screen else RESOLUTION) * coarsening
    tau = coarse if unit_s is None else (max(unit_s, coarse) if screen else unit_s)
    t_hi = straggler * t_min if max_time_s is None else max(straggler * t_min, max_time_s - post)
    limit = t_hi * 1.01 + 4 * tau  # planned makespans a little above T' can still realize below it
    direct_lp = planner == "perseus" and not screen and not fastest_only  # points solved inside the bound
    replicas = []
    # The LP of the point at T' (point_by) starts from the optimal bases of this strategy's earlier replicas, and an
    # LP with several optima may end at another vertex from another start: a replica's plan is a function of the
    # replicas solved before it in this strategy. Bases are therefore never shared across strategies, a cached
    # replica is reused only after the same earlier replicas, and it restores the bases it left; so a strategy gets
    # the same plan alone (`ampe frontier --plan`), in any order, and in a parallel worker as in the serial search.
    warm = WarmStarts()
    before: tuple = ()  # the distinct replicas of this strategy planned so far
    solves_lp = planner == "perseus" and (fastest_only or not screen)
    own: dict[tuple, tuple[float, PipelineFrontier, dict]] = {}  # this strategy's distinct replicas (dp copies)
    for inp, built in zip(inputs, dags, strict=False):
        ident = _inputs_key(inp)
        hit = own.get(ident)
        if hit is None:
            direct = (direct_deadlines(straggler * t_min, t_hi, int(built.dag.computation_mask.sum())) if direct_lp
                      else ())
            key = (ident, planner, tau, screen, margin, fastest_only, straggler * t_min, before if solves_lp else (),
                   direct)
            hit = cache.entries.get(key)
            if hit is None or hit[0] < limit:
                frontier = _frontier(built, planner, tau, limit, screen, margin, straggler * t_min, fastest_only,
                                     warm, direct)
                hit = cache.entries[key] = (limit, frontier, dict(warm.bases))
                cache.traced += 1
            else:
                warm.bases = dict(hit[2])
            own[ident] = hit
            before += (ident,)
        replicas.append(ReplicaPipeline(inp, built.dag, hit[1], built.all_max_choice))
    return StrategyEnergy(tuple(replicas), post, straggler, planner, tau, energy_source(inputs), margin)


# ---------------------------------------------------------------------------------------------------------------
# Frequency plans


def _clock(mhz: float) -> int:
    """An integer SM clock not below ``mhz`` (plans carry integer MHz; rounding up never slows a computation)."""
    return max(1, math.ceil(mhz - 1e-6))


def _stage_lists(dag: ComputationDag, point: FrontierPoint) -> list[list[list]]:
    plan = plan_of(dag, point.choice, point.evaluation())
    return [[[i, mb, _clock(f)] for i, mb, f in stage] for stage in plan.stages]


def is_all_max(se: StrategyEnergy, sp: StrategyPoint) -> bool:
    """True when every computation of every replica runs at its fastest option (nothing to apply)."""
    return all(np.array_equal(p.choice, r.all_max_choice) for r, p in zip(se.replicas, sp.points, strict=False))


def frequency_plan_json(se: StrategyEnergy, sp: StrategyPoint) -> dict[str, Any]:
    """The plan file's ``frequency_plan`` object for point ``sp`` of strategy ``se``.

    ``stages``: replica 0's per-stage ``[instruction, microbatch, MHz]`` lists in execution order; when replicas
    run different plans (heterogeneous replicas) ``replicas`` lists every replica's ``{"stages", "pipeline_time_s"}``
    and each trial rank uses its replica's; when some replicas share a plan, ``replicas`` lists each distinct plan
    once and ``replica_plan`` gives each replica's entry. ``time_s``/``energy_j``: the iteration time and energy of
    the point (all devices); ``pipeline_time_s``: T'.
    """
    made: dict[tuple[int, int], int] = {}  # identical replicas share their DAG and point: made once
    distinct: list[tuple[list[list[list]], float]] = []
    which = []
    for r, p in zip(se.replicas, sp.points, strict=False):
        key = (id(r.dag), id(p))
        if key not in made:
            made[key] = len(distinct)
            distinct.append((_stage_lists(r.dag, p), p.time_s))
        which.append(made[key])
    lists = [distinct[i][0] for i in which]
    out: dict[str, Any] = {
        "stages": lists[0],
        "time_s": sp.time_s,
        "energy_j": sp.energy_j,
        "energy_max_clock_j": sp.energy_max_clock_j,
        "pipeline_time_s": sp.t_prime_s,
        "planner": se.planner,
        "unit_time_s": se.unit_s,
        "straggler": se.straggler,
        "margin": se.margin,
        "energy_source": se.source,
    }
    if any(lst != lists[0] for lst in lists[1:]):
        if len(distinct) < len(which):  # replicas share plans: each distinct one once, and which one each runs
            out["replicas"] = [{"stages": lst, "pipeline_time_s": t} for lst, t in distinct]
            out["replica_plan"] = which
        else:
            out["replicas"] = [{"stages": lst, "pipeline_time_s": p.time_s}
                               for lst, p in zip(lists, sp.points, strict=True)]
    return out


# ---------------------------------------------------------------------------------------------------------------
# Choosing among strategies


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


def _plan_many(tasks: list[tuple[int, float | None]], estimates: Sequence[Any], cluster: Any, jobs: int,
               cache: FrontierCache, tally: _Tally | None = None, **kw: Any) -> list[StrategyEnergy]:
    """plan_clocks for every (index, max_time_s) task; in ``jobs`` joblib workers when jobs > 1. ``tally`` counts
    each finished task's estimated work (progress)."""
    if jobs <= 1 or len(tasks) <= 1:
        out = []
        for i, lim in tasks:
            out.append(plan_clocks(estimates[i], cluster, max_time_s=lim, cache=cache, **kw))
            if tally is not None:
                tally.done(i, kw.get("screen", False), kw.get("fastest_only", False))
        return out
    from joblib import Parallel, delayed

    planned = list(Parallel(n_jobs=min(jobs, len(tasks)))(
        delayed(plan_clocks)(estimates[i], cluster, max_time_s=lim, **kw) for i, lim in tasks))
    if tally is not None:
        for i, _ in tasks:
            tally.done(i, kw.get("screen", False), kw.get("fastest_only", False))
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

    def work(self, i: int, screen: bool, fastest_only: bool) -> float:
        """Estimated node-steps of one plan_clocks call for strategy ``i``."""
        job = self.jobs.get(i)
        if job is None:
            return 0.0
        if fastest_only:
            fixed, _ = budget.frontier_work(job, self.planner, None, self.unit_s)
            return fixed + (budget.lp_steps(job.nodes) if self.planner == "perseus" else 0.0)
        res = (SCREEN_RESOLUTION if screen else RESOLUTION) / self.coarsening
        fixed, frontier = budget.frontier_work(job, self.planner, res, None if screen else self.unit_s)
        return fixed + frontier + (_planned_lps(job) if self.planner == "perseus" and not screen else 0.0)

    def done(self, i: int, screen: bool = False, fastest_only: bool = False, steps: float | None = None) -> None:
        """Count strategy ``i``'s finished call (or ``steps`` node-steps) and report."""
        self.so_far += self.work(i, screen, fastest_only) if steps is None else steps
        if self.report is not None:
            self.report(min(self.so_far, self.total), self.total)


def rank_strategies(estimates: Sequence[Any], cluster: Any, *, objective: str = "time",
                    max_slowdown: float | None = None, top_k: int = 10, planner: str = "perseus",
                    unit_s: float | None = None, straggler: float = 1.0, margin: float = 0.0,
                    jobs: int = 1, progress: Callable[[float, float], None] | None = None,
                    say: Callable[[str], None] | None = None) -> EnergyRanking:
    """Order costed strategies by ``objective`` and choose each one's frontier point.

    * ``time``: the ``top_k`` fastest strategies (by their T_min point), each at its T_min point;
    * ``energy`` / ``edp``: among strategies and points whose iteration time is within ``max_slowdown`` (a fraction,
      default 5%) of the fastest strategy's, least energy / energy × time first; then, if fewer than ``top_k``
      meet the bound, the fastest others at their T_min points (``within_bound`` False).

    Frontiers are traced only for strategies that can matter: those within the bound (or the ``top_k`` fastest).
    When more than 2·top_k strategies are within the bound they are first screened with a coarse τ and the best
    2·top_k by the screened objective are planned at full resolution. Pareto marks (time against energy of the
    chosen points) cover every strategy planned at full resolution.

    Before any of it, the work is estimated (:mod:`ampe.energy.budget`): beyond its bound every frontier's τ is made
    coarser (``EnergyRanking.coarsening`` and ``note`` say so), and far beyond it :class:`~ampe.errors.InputError`
    refuses the request. ``progress(done, total)`` is called as strategies are planned (estimated node-steps);
    ``say(note)`` gets that line before the planning starts.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; one of {', '.join(OBJECTIVES)}")
    t0 = time.perf_counter()
    x = (DEFAULT_MAX_SLOWDOWN if max_slowdown is None else max_slowdown) if objective != "time" else 0.0
    if x < 0:
        raise ValueError(f"max slowdown must be ≥ 0, got {x}")
    cache = FrontierCache()
    order = sorted(range(len(estimates)), key=lambda i: estimates[i].iteration_s)
    decision, tally = _budget(estimates, cluster, order, objective, x, top_k, planner, unit_s, straggler, cache,
                              progress)
    if decision.note and say is not None:
        say(decision.note)
    # 1. T_min points, in cost-model order, until no later strategy can be within the bound or the top k by time
    #    (a strategy's T_min time is never below its cost-model time).
    fast: dict[int, float] = {}
    for i in order:
        times = sorted(fast.values())
        if times:
            kth = times[min(top_k, len(times)) - 1] if len(times) >= top_k else math.inf
            if estimates[i].iteration_s > max(kth, (1 + x) * times[0]) * (1 + 1e-12):
                break
        # a cache of its own: keeping every visited strategy's DAG and option table (nodes × clocks) held 1.5 GB at
        # a 500 % bound; the few planned later rebuild theirs (30 node-steps a node, against 300+ to plan it)
        fast[i] = fastest_time_s(estimates[i], cluster, straggler, FrontierCache())
        if i in tally.jobs:
            tally.done(i, steps=tally.jobs[i].nodes * budget.BUILD_STEPS)
    fastest = min(fast.values())
    bound = (1 + x) * fastest if objective != "time" else None
    by_time = sorted(fast, key=lambda i: (fast[i], i))

    kw: dict[str, Any] = dict(planner=planner, unit_s=unit_s, straggler=straggler, margin=margin,
                              coarsening=decision.coarsening)
    chosen: list[tuple[int, StrategyEnergy, StrategyPoint, bool]] = []
    screened = 0
    if objective == "time":
        idx = by_time[:top_k]
        planned = _plan_many([(i, None) for i in idx], estimates, cluster, jobs, cache, tally, fastest_only=True,
                             **kw)
        for i, se in zip(idx, planned, strict=True):
            chosen.append((i, se, se.fastest(), True))
    else:
        assert bound is not None
        feasible = [i for i in by_time if fast[i] <= bound * (1 + 1e-9)]
        keep = feasible
        if len(feasible) > 2 * top_k:
            screened = len(feasible)
            scores = {}
            for i in feasible:
                # a cache of its own: a screened frontier is never reused at full resolution, so keeping every one
                # (hundreds of strategies at a wide --max-slowdown) only held memory
                se = plan_clocks(estimates[i], cluster, max_time_s=bound, screen=True, cache=FrontierCache(), **kw)
                tally.done(i, screen=True)
                sp = se.choose(objective, bound)
                scores[i] = math.inf if sp is None else (sp.energy_j if objective == "energy" else sp.edp)
            keep = sorted(feasible, key=lambda i: (scores[i], fast[i]))[: 2 * top_k]
        planned = _plan_many([(i, bound) for i in keep], estimates, cluster, jobs, cache, tally, **kw)
        for i, se in zip(keep, planned, strict=True):
            sp = se.choose(objective, bound)
            if sp is not None:
                chosen.append((i, se, sp, True))
        key = (lambda c: (c[2].energy_j, c[2].time_s)) if objective == "energy" else (lambda c: (c[2].edp,
                                                                                                  c[2].time_s))
        chosen.sort(key=key)
        rest = [i for i in by_time if i not in feasible][: max(0, top_k - len(chosen))]
        planned = _plan_many([(i, None) for i in rest], estimates, cluster, jobs, cache, tally, fastest_only=True,
                             **kw)
        for i, se in zip(rest, planned, strict=True):
            chosen.append((i, se, se.fastest(), False))
    if progress is not None:  # the estimate is an upper bound: the bar ends full
        progress(tally.total, tally.total)
    marks = pareto_mask([(sp.time_s, sp.energy_j) for _, _, sp, _ in chosen])
    ranked = tuple(RankedStrategy(i, se, sp, ok, m) for (i, se, sp, ok), m in zip(chosen, marks, strict=False))
    traced = len({id(r.frontier) for _, se, _, _ in chosen for r in se.replicas})
    return EnergyRanking(ranked, objective, x if objective != "time" else None, fastest, bound, len(chosen),
                         screened, traced, time.perf_counter() - t0, decision.coarsening, decision.note)


WARM_LP = 0.25  # a point solved directly from the T_min point's basis costs about a quarter of that cold LP


def _planned_lps(job: budget.Job) -> float:
    """Node-steps of the LPs of one strategy planned at full resolution for the energy objectives: the T' point and
    the points inside the bound (:func:`direct_deadlines`, warm-started: 0.25 s against 1.0 s at 8 × 192)."""
    direct = DIRECT_POINTS if job.computations <= DIRECT_LARGE else DIRECT_POINTS_LARGE
    return budget.lp_steps(job.nodes) * (1.0 + WARM_LP * direct)


def _budget(estimates: Sequence[Any], cluster: Any, order: list[int], objective: str, x: float, top_k: int,
            planner: str, unit_s: float | None, straggler: float, cache: FrontierCache,
            progress: Callable[[float, float], None] | None) -> tuple[budget.Decision, _Tally]:
    """Estimate the work of :func:`rank_strategies` before it starts and apply the bounds (:mod:`ampe.energy.budget`).

    Which strategies can be visited is known from the cost model alone: a strategy's T_min point is never faster than
    its ``iteration_s``, so none slower than (1 + x) × the first strategy's T_min point can be within the bound; the
    top k by ``iteration_s`` are visited in any case. Only that first T_min point is computed here (one DAG)."""
    t_first = fastest_time_s(estimates[order[0]], cluster, straggler, cache) if order else 0.0
    reach = (1 + x) * t_first * (1 + 1e-12)
    cand = [i for n, i in enumerate(order) if n < top_k or estimates[i].iteration_s <= reach]
    jobs = {i: budget.job_of(i, estimates[i], cluster) for i in cand}
    budget.check_nodes(list(jobs.values()), "energy planning")
    fixed = float(sum(j.nodes for j in jobs.values()) * budget.BUILD_STEPS)
    frontier = 0.0
    tally = _Tally(jobs, planner, unit_s, 1.0, 0.0, progress)
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
            f, g = budget.frontier_work(jobs[i], planner, RESOLUTION, unit_s)
            fixed += share * (f + (_planned_lps(jobs[i]) if planner == "perseus" else 0.0))
            frontier += share * g
        flag, what = "--max-slowdown", (f"up to {len(cand)} strategies within {x * 100:g} % of the fastest "
                                        f"({planner} frontiers)")
    decision = budget.decide(budget.Work(fixed, frontier, len(cand)), flag, what, unit_s is not None)
    tally.coarsening, tally.total = decision.coarsening, decision.work.at(decision.coarsening)
    return decision, tally
