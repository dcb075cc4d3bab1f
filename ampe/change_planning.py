"""Planning after a cluster change (``ampe replan --without/--add/--slow``): the old strategy re-planned for the
cluster as it now is (:mod:`ampe.search.cluster_replan` finds the candidates), chosen by an objective, energy-planned
and written as a typed plan (:mod:`ampe.planning` builds its entries)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

from ampe.costmodel.cluster import Cluster, cluster_from_dict
from ampe.costmodel.cluster_change import ClusterChange, changed_spec, device_map
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.pricing import require, strategy_weights
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy, strategy_identity
from ampe.energy.objective import objective_named
from ampe.energy.ranking import EnergyRanking, rank_strategies
from ampe.errors import InputError
from ampe.formats.plan import EnergyStats, ObjectiveName, PlanFile, PlanInputs, PlannerName, SearchStats
from ampe.planning import plan_for_estimates, ranked_entries
from ampe.search.cluster_replan import ClusterReplan, pick, replan_cluster
from ampe.search.engine import SearchOptions
from ampe.search.plan import build_plan


@dataclass(frozen=True)
class ChangeReplan:
    """A re-plan after the cluster changed (``ampe replan --without/--add/--slow``): the old strategy costed on the
    old cluster, the re-plan on the new one, the new cluster and its spec (a mapping, as YAML would hold it), the
    new plan (the chosen strategy first), energy per iteration of every device (J; None without energy planning)
    and the seconds (wall, and this process's CPU) the energy planning took; the objective the choice minimised,
    with each candidate's figure (``scores``, aligned with ``result.options``: J, J·s, money or g CO2e per
    iteration at its best point; None beyond the slowdown bound; empty for time) and the bound (s)."""

    old: Estimate
    result: ClusterReplan
    cluster: Cluster
    spec: dict[str, Any]
    plan: PlanFile
    old_energy_j: float | None
    new_energy_j: float | None
    energy_s: float
    energy_cpu_s: float
    objective: str = "time"
    scores: tuple[float | None, ...] = ()
    bound_s: float | None = None


@dataclass(frozen=True)
class ChangeReplanRequest:
    """A re-plan after a cluster change: the old strategy (device ids of ``old_cluster``, loaded from ``raw_spec``),
    the model (frozen prefix applied) and profile it was planned with, the change, what the plan records
    (``inputs``, with the new spec's path as ``cluster_spec``; ``stats``: its ``search`` section), the old
    strategy's energy per iteration when known (J; None: planned here), and the knobs."""

    old_cluster: Cluster
    raw_spec: dict[str, Any]
    model: Model
    profile: Profile | None
    old: Strategy
    change: ClusterChange
    inputs: PlanInputs
    stats: SearchStats
    old_energy_j: float | None = None
    energy_planner: str = "perseus"  # perseus | envpipe | global | none
    full_search: bool = False  # also a whole search on the new cluster
    top_k: int = 1  # strategies in the plan: the chosen one and up to top_k − 1 runners-up
    frozen_layers: int | None = None
    opts: SearchOptions | None = None  # the search's knobs (None: the defaults at the old global batch)
    objective: str = "time"  # what chooses: time, energy, edp, cost or carbon (ampe.energy.objective)
    max_slowdown: float | None = None  # energy objectives: the bound over the fastest candidate (None: 5 %)


def replan_after_change(request: ChangeReplanRequest) -> ChangeReplan:
    """Re-plan the old strategy for the cluster after the change: warm-started, ties toward the smallest change
    (:func:`ampe.search.cluster_replan.replan_cluster`); then energy planning of the chosen strategy (and of the old
    one when ``request.old_energy_j`` is None) unless the energy planner is "none". The plan holds the chosen
    strategy and up to ``top_k`` - 1 runners-up after it.

    Objective ``time`` chooses the fastest (runners-up fastest first); any other (energy, edp, cost, carbon:
    :mod:`ampe.energy.objective`) plans the clocks of every candidate as ``ampe search`` ranks strategies
    (:func:`~ampe.energy.ranking.rank_strategies`, within ``max_slowdown`` of the fastest, default 5 %) and chooses
    the least figure, ties within 0.5 % toward the smallest change (runners-up by the objective).

    Args:
        request: the old strategy, its cluster, the change and the knobs (:class:`ChangeReplanRequest`).

    Returns:
        The old strategy's estimate, the re-plan, the new cluster and its spec, the plan, energy per iteration of
        both (J) and the energy planning's seconds (:class:`ChangeReplan`).

    Raises:
        InputError: a change the cluster cannot take, nothing fits, an energy objective without an energy planner,
            or cost or carbon when the spec lacks the prices.
    """
    req, old = request, request.old
    goal = objective_named(req.objective)
    if goal.slows and req.energy_planner == "none":
        raise InputError("--objective", "", f"{req.objective} needs an energy planner (not --energy-planner none; "
                         "--objective time chooses by time alone)")
    if goal.priced:  # before any work, as the search: never priced at zero
        require(req.old_cluster.pricing, req.objective, req.old_cluster.source or req.old_cluster.name)
    spec = changed_spec(req.raw_spec, req.old_cluster, req.change)
    where = req.inputs.cluster_spec or "(new cluster spec)"
    new = cluster_from_dict(spec, where)
    if goal.priced:  # a node the change added may lack the prices: refused before any re-planning
        require(new.pricing, req.objective, req.change.add or where)
    old_est = CostModel(req.old_cluster, req.model, req.profile).estimate(old)
    cm = CostModel(new, req.model, req.profile)
    opts = req.opts or SearchOptions(gbs=old.gbs)
    result = replan_cluster(cm, old, req.old_cluster, device_map(req.old_cluster, new), opts, req.full_search)
    if result is None:
        raise InputError(where, "", f"no strategy fits the cluster as it now is ({new.size} devices) near the old "
                         f"one (pp {old.pp}, tp {old.tp}); try --search (a whole search) or --add")
    planner = None if req.energy_planner == "none" else req.energy_planner
    stats = _timed(req.stats, result)
    t0, c0 = time.perf_counter(), time.process_time()
    scores: tuple[float | None, ...] = ()
    bound_s = None
    if goal.slows:
        assert planner is not None
        result, ranking, scores = _choose_by(goal.name, result, new, planner, req.max_slowdown)
        bound_s = ranking.bound_s
        ests = [o.estimate for o in result.options]
        at = result.options.index(result.chosen)
        order = [r for r in ranking.ranked if r.index == at] + _distinct(
            [r for r in ranking.ranked if r.index != at], lambda r: ests[r.index].strategy, req.top_k - 1,
            ests[at].strategy)
        stats = stats.edited(energy=EnergyStats(objective=cast(ObjectiveName, goal.name),
                                                max_slowdown=ranking.max_slowdown, planner=cast(PlannerName, planner),
                                                fastest_s=ranking.fastest_s, bound_s=ranking.bound_s))
        entries = ranked_entries(order, ests, [o.how for o in result.options], new, req.model, old.gbs,
                                 req.frozen_layers)
        plan = build_plan(new, req.model, old.gbs, entries, stats, req.inputs, req.frozen_layers)
    else:
        picked = [result.chosen, *_distinct([o for o in result.options if o is not result.chosen],
                                            lambda o: o.strategy, req.top_k - 1, result.chosen.strategy)]
        stats = stats.edited(drop=("energy",))  # the old plan's choice is not this one's
        if planner is not None:
            stats = stats.edited(energy=EnergyStats(objective=cast(ObjectiveName, goal.name),
                                                    planner=cast(PlannerName, planner)))
        plan = plan_for_estimates(new, req.model, [o.estimate for o in picked], old.gbs, stats, req.inputs,
                                  [o.how for o in picked], req.frozen_layers, planner, keep_order=True)
    new_energy = plan.strategies[0].predicted.energy_j
    old_energy_j = req.old_energy_j
    if planner is not None and old_energy_j is None:
        old_energy_j = rank_strategies([old_est], req.old_cluster, objective="time", top_k=1,
                                       planner=planner).ranked[0].point.energy_j
    return ChangeReplan(old_est, result, new, spec, plan, old_energy_j if planner else None, new_energy,
                        time.perf_counter() - t0, time.process_time() - c0, goal.name, scores, bound_s)


def _timed(stats: SearchStats, result: ClusterReplan) -> SearchStats:
    """``stats`` with the re-plan's seconds and CPU seconds (energy planning excluded) in its ``replanned_from``,
    when it has one."""
    if stats.replanned_from is None:
        return stats
    return stats.edited(replanned_from=stats.replanned_from.edited(seconds=round(result.seconds, 3),
                                                                    cpu_seconds=round(result.cpu_seconds, 3)))


def _choose_by(objective: str, result: ClusterReplan, cluster: Cluster, planner: str,
               max_slowdown: float | None) -> tuple[ClusterReplan, EnergyRanking, tuple[float | None, ...]]:
    """``result`` re-chosen by ``objective`` (energy, edp, cost, carbon; ``planner``: perseus, envpipe, global):
    every candidate's clocks planned as ``ampe search`` ranks (:func:`~ampe.energy.ranking.rank_strategies`, within
    ``max_slowdown`` of the fastest, a fraction; None: 5 %), each one's figure at its best point (J, J·s, money or
    g CO2e per iteration; None beyond the bound), the least chosen with ties within 0.5 % to the smallest change
    (:func:`~ampe.search.cluster_replan.pick`). Returns the re-plan, the ranking (indices into ``result.options``)
    and the figures."""
    goal = objective_named(objective)
    ests = [o.estimate for o in result.options]
    ranking = rank_strategies(ests, cluster, objective=objective, max_slowdown=max_slowdown, top_k=len(ests),
                              planner=planner)
    scores: list[float | None] = [None] * len(ests)
    for r in ranking.ranked:
        if r.within_bound:
            weights = strategy_weights(require(cluster.pricing, objective, cluster.source or cluster.name),
                                       ests[r.index].strategy, objective) if goal.priced else None
            scores[r.index] = goal.score(r.energy, r.point, weights)
    return replace(result, chosen=pick(list(result.options), scores=scores)), ranking, tuple(scores)


def _distinct(items: Sequence[Any], strategy_of: Callable[[Any], Strategy], k: int, first: Strategy) -> list[Any]:
    """Up to ``k`` of ``items``, in order, whose strategies differ from ``first`` and from each other."""
    seen = {strategy_identity(first)}
    out: list[Any] = []
    for x in items:
        if len(out) >= k:
            break
        key = strategy_identity(strategy_of(x))
        if key not in seen:
            seen.add(key)
            out.append(x)
    return out
