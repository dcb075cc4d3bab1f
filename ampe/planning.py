"""Making a plan: search → energy planning → a typed :class:`~ampe.formats.plan.PlanFile`, as one library call.

``make_plan(cluster, model, profile, PlanRequest(...))`` is what ``ampe search`` runs (the CLI only parses arguments
and prints); :func:`plan_for_estimates` makes a plan of strategies chosen elsewhere (``ampe replan``, benchmarks).
This module sits above :mod:`ampe.search` and :mod:`ampe.energy`, which do not know each other.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.pricing import PRICED, describe, require, strategy_weights
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import RECOMPUTE, ZERO_STAGES, Strategy, shares_label, strategy_identity
from ampe.energy.budget import MAX_DAG_NODES, check_nodes
from ampe.energy.inputs import job_of
from ampe.energy.price import point_cost, point_costs
from ampe.energy.ranking import EnergyRanking, RankedStrategy, rank_strategies
from ampe.energy.run import iterations_for_tokens, training_run
from ampe.energy.strategy import DEFAULT_MAX_SLOWDOWN, frequency_plan_of, is_all_max
from ampe.errors import InputError
from ampe.formats.plan import (
    Caveat,
    EnergyStats,
    ObjectiveName,
    PipelineMethod,
    PlanCost,
    PlanFile,
    PlanInputs,
    PlannerName,
    SearchStats,
    StrategyEntry,
    TrainingRunFigures,
)
from ampe.search.defaults import states_exceed_cluster
from ampe.search.engine import Candidate, SearchOptions, SearchResult, search
from ampe.search.placement import summary
from ampe.search.plan import EntryEnergy, EntryFacts, build_plan, runtime_support, strategy_caveats, strategy_entry
from ampe.search.shares import share_variants
from ampe.search.spread import spread_variant
from ampe.search.subsets import left_out, search_devices


@dataclass(frozen=True)
class PlanRequest:
    """What to plan: the search's knobs, the energy planner's, and the inputs to record for reproduction."""

    search: SearchOptions
    objective: str = "time"  # time | energy | edp | cost | carbon
    max_slowdown: float | None = None  # energy/edp: allowed slowdown against the fastest strategy (fraction)
    straggler: float = 1.0
    energy_planner: str = "perseus"  # perseus | envpipe | global | none
    slack_margin: float = 0.0
    unit_time_s: float | None = None  # τ of the frontiers (default: each strategy's T_min / 1000)
    # cost/carbon, perseus: True solves every strategy's points directly in its cost window, False traces every one,
    # None those whose trace is not cheap (rank_strategies)
    priced_direct: bool | None = None
    pipeline_degrees: tuple[int, ...] | None = None  # keep only these pp (None: all)
    frozen_layers: int = 0
    devices: str = "all"  # "auto": also search the cluster without each GPU-type group (ampe.search.subsets)
    iterations: int | None = None  # a training run's length, for its kWh (or tokens, below)
    tokens: int | None = None  # … in tokens: iterations = ⌈tokens / (global batch × sequence length)⌉
    max_dag_nodes: int = MAX_DAG_NODES  # one strategy's energy DAGs at most (nodes); those over it are not planned
    inputs: PlanInputs = field(default_factory=PlanInputs)  # recorded in the plan (paths as the user gave them)


@dataclass(frozen=True)
class PlanResult:
    """The plan and what made it: the search result, the strategies kept, and the energy ranking (if planned)."""

    plan: PlanFile
    search: SearchResult
    kept: tuple[Candidate, ...]  # feasible strategies after the pipeline-degree filter, fastest first
    energy: EnergyRanking | None
    findings: tuple[CostFinding, ...] = ()  # for the user: e.g. that leaving out a GPU-type group is cheaper


def make_plan(cluster: Cluster, model: Model, profile: Profile | None, request: PlanRequest,
              progress: Callable[[int, int], None] | None = None,
              energy_progress: Callable[[float, float], None] | None = None) -> PlanResult:
    """Search strategies, plan their clocks and rank them.

    Args:
        cluster: the devices and their links (bandwidth in bytes/s).
        model: the model as given; ``request.frozen_layers`` freezes its prefix (FreezePipe).
        profile: measured per-layer times (s), or None for the roofline.
        request: the search's and the energy planner's knobs, and the inputs to record (:class:`PlanRequest`).
        progress: ``progress(done, total)``, candidate groups searched.
        energy_progress: ``energy_progress(done, total)``, energy planning (estimated node-steps).

    Returns:
        The plan (top ``search.top_k``; times in s, memory in B, energy in J per iteration), the search result, the
        strategies kept and the energy ranking (:class:`PlanResult`).

    Raises:
        InputError: nothing fits, no strategy has the requested pipeline degrees, a priced objective without the
            spec's prices, or energy planning beyond its bound (:mod:`ampe.energy.budget`).
    """
    if request.objective in PRICED:  # before any work: a spec without the prices is refused, never priced at zero
        require(cluster.pricing, request.objective, cluster.source or cluster.name)
    if request.frozen_layers:
        model = model.with_frozen_prefix(request.frozen_layers)
    if request.devices == "auto":
        result = search_devices(cluster, model, profile, request.search, progress)
    else:
        result = search(cluster, model, profile, request.search, progress)
    if result.candidates == 0:
        raise InputError(cluster.source or cluster.name, "", f"no parallel layout of the {cluster.size} devices "
                         f"exists for {model.name} ({model.num_layers} layers) at global batch {request.search.gbs}: "
                         "pp·dp·tp must use every device, with pp ≤ layers, dp dividing the global batch and tp "
                         "inside a node (see --allow-cross-node-tp)")
    if not result.ranked:
        examples = "; ".join(result.oom_examples)
        raise InputError(cluster.source or cluster.name, "", f"no strategy fits in memory: all {result.candidates} "
                         f"candidates were pruned (e.g. {examples}); "
                         + memory_advice(cluster, model, profile, request.search))
    kept = list(result.ranked)
    if request.pipeline_degrees:
        kept = [c for c in kept if c.strategy.pp in request.pipeline_degrees]
        if not kept:
            raise InputError("--pp", "", f"no strategy with pipeline degree "
                             f"{','.join(map(str, request.pipeline_degrees))} fits (feasible degrees: "
                             f"{sorted({c.strategy.pp for c in result.ranked})})")
    top_k = request.search.top_k
    iterations = run_iterations(request, model)
    energy = None
    planned = kept
    if request.energy_planner == "none":
        caveated = _caveated(kept, model)
        ordered = [c for c, bad in zip(kept, caveated, strict=True) if not bad] + \
            [c for c, bad in zip(kept, caveated, strict=True) if bad]
        entries = [candidate_entry(i + 1, c, cluster, model, request.frozen_layers)
                   for i, c in enumerate(ordered[:top_k])]
    else:
        kept = plannable_shares(kept, cluster, model, profile, request.search.method, request.max_dag_nodes)
        planned, over = dag_bounded(kept, cluster, request.max_dag_nodes)  # before the variants: their bound too
        variants = (0, 0)
        if request.objective != "time":
            cm = CostModel(cluster, model, profile)
            spread = with_spread_variants(planned, cm, request)  # the same DAG sizes as their strategies'
            every = with_share_variants(spread, cm, request)
            variants = (len(spread) - len(planned), len(every) - len(spread))
            planned, more = dag_bounded(every, cluster, request.max_dag_nodes)
            over = sorted([*over, *more], key=lambda o: o[0].estimate.iteration_s)
        energy = rank_caveats_last(planned, _caveated(planned, model), cluster, request, energy_progress)
        entries = []
        for i, r in enumerate(energy.ranked[:top_k]):
            cost = plan_cost(cluster, planned[r.index].estimate.strategy, r, request.search.gbs * model.seq_len,
                             iterations)
            entries.append(candidate_entry(i + 1, planned[r.index], cluster, model, request.frozen_layers,
                                           entry_energy(r, iterations, request.tokens, cost)))
        entries += unplanned_entries(over, energy, entries, cluster, model, request)
    stats = search_stats(result, request, None if energy is None else
                         energy_stats(energy, request, *variants, unplanned=len(over)))
    plan = build_plan(cluster, model, request.search.gbs, entries, stats, request.inputs)
    findings = cost_findings(cluster, planned, energy, request, entries) if energy is not None else ()
    return PlanResult(plan, result, tuple(kept), energy, findings)


def plannable_shares(kept: Sequence[Candidate], cluster: Cluster, model: Model, profile: Profile | None,
                     method: str, max_nodes: int = MAX_DAG_NODES) -> list[Candidate]:
    """``kept`` where a candidate's uneven shares would give the energy planner more DAG nodes than it takes
    (each distinct (replica class, share) is a DAG of its own) re-costed under equal shares, and re-sorted by
    iteration time (ties keep their order): a plan is never refused for its shares.

    Args:
        kept: the search's ranked candidates.
        cluster, model, profile: the search's inputs.
        method: the pipeline time ("eq5" or "simulate").
        max_nodes: the energy planner's bound on one strategy's DAG nodes (``budget.MAX_DAG_NODES``).

    Returns:
        The candidates, fastest first.
    """
    out, cm = [], None
    for c in kept:
        if c.strategy.uneven and job_of(0, c.estimate, cluster).nodes > max_nodes:
            cm = cm or CostModel(cluster, model, profile)
            c = Candidate(cm.estimate(replace(c.strategy, replica_gas=None), method), c.placement_name)
        out.append(c)
    return sorted(out, key=lambda c: round(c.estimate.iteration_s, 12))


def _caveated(candidates: Sequence[Candidate], model: Model) -> list[bool]:
    """Whether each candidate has a caveat (memory at risk, not runnable: :func:`strategy_caveats`)."""
    return [bool(strategy_caveats(c.estimate, model)) for c in candidates]


def rank_caveats_last(planned: Sequence[Candidate], caveated: Sequence[bool], cluster: Cluster,
                      request: PlanRequest, progress: Callable[[float, float], None] | None = None) -> EnergyRanking:
    """The energy ranking of ``planned`` (:func:`~ampe.energy.ranking.rank_strategies` under the request's
    objective, indices into ``planned``) with every strategy that has a caveat after every one that has none: the
    strategies without one are ranked among themselves first, then, only where they are fewer than ``top_k``, the
    others among themselves for the places left. The figures of the ranking (fastest strategy, slowdown bound,
    counts) are the first group's, the counts of both added."""
    top_k = request.search.top_k
    groups = [[i for i, bad in enumerate(caveated) if not bad], [i for i, bad in enumerate(caveated) if bad]]
    out: EnergyRanking | None = None
    for group in groups:
        if not group or (out is not None and len(out.ranked) >= top_k):
            continue
        got = rank_strategies([planned[i].estimate for i in group], cluster, objective=request.objective,
                              max_slowdown=request.max_slowdown,
                              top_k=top_k - (len(out.ranked) if out else 0), planner=request.energy_planner,
                              unit_s=request.unit_time_s, straggler=request.straggler, margin=request.slack_margin,
                              jobs=request.search.jobs, progress=progress, priced_direct=request.priced_direct,
                              max_dag_nodes=request.max_dag_nodes)
        ranked = tuple(replace(r, index=group[r.index]) for r in got.ranked)
        out = replace(got, ranked=ranked) if out is None else replace(
            out, ranked=out.ranked + ranked, evaluated=out.evaluated + got.evaluated,
            screened=out.screened + got.screened, traced=out.traced + got.traced, seconds=out.seconds + got.seconds)
    assert out is not None  # planned is never empty here
    return out


def dag_bounded(planned: Sequence[Candidate], cluster: Cluster, max_nodes: int = MAX_DAG_NODES
                ) -> tuple[list[Candidate], list[tuple[Candidate, int]]]:
    """``planned`` split by the energy planner's bound on one strategy's DAG (its distinct replicas' DAGs together),
    counted without building any (:func:`~ampe.energy.inputs.job_of`): one strategy too large never refuses the
    others. Where every one is over it, the largest is refused as before (InputError, exit 2).

    Args:
        planned: the candidates to energy-plan, fastest first.
        cluster: the cluster they run on.
        max_nodes: the bound (nodes).

    Returns:
        The candidates within the bound, and those over it with their node counts (both in the order given).
    """
    jobs = [job_of(i, c.estimate, cluster) for i, c in enumerate(planned)]
    if jobs and all(j.nodes > max_nodes for j in jobs):
        check_nodes(jobs, "energy planning", max_nodes)
    return ([c for c, j in zip(planned, jobs, strict=True) if j.nodes <= max_nodes],
            [(c, j.nodes) for c, j in zip(planned, jobs, strict=True) if j.nodes > max_nodes])


def unplanned_entries(over: Sequence[tuple[Candidate, int]], energy: EnergyRanking, planned: Sequence[StrategyEntry],
                      cluster: Cluster, model: Model, request: PlanRequest) -> list[StrategyEntry]:
    """Plan entries, ranked after the ``planned`` ones, of the strategies over the DAG bound that could have taken a
    place in the plan: at most ``top_k`` of them, those whose cost-model time is within the ranking's slowdown bound
    or the slowest planned entry's time (a strategy's T_min point is never faster than its cost-model time), and as
    many more as the plan has places left. Each has the cost model's figures only (no energy, no frequency plan: it
    runs at maximum clocks) and an ``energy_not_planned`` caveat that says why and what to change.

    Args:
        over: the strategies over the bound with their DAG nodes, fastest first (:func:`dag_bounded`).
        energy: the ranking of the others (its slowdown bound, s).
        planned: their plan entries (times in s).
        cluster, model: the search's inputs.
        request: the request (``top_k``, the bound ``max_dag_nodes``, the frozen prefix).

    Returns:
        The entries, ranks following the planned ones'.
    """
    top_k = request.search.top_k
    limit = max([energy.bound_s or 0.0] + [e.predicted.plan_time_s or 0.0 for e in planned]) * (1 + 1e-9)
    listed: list[tuple[Candidate, int]] = []
    for c, nodes in over:
        if len(listed) < top_k and (c.estimate.iteration_s <= limit or len(planned) + len(listed) < top_k):
            listed.append((c, nodes))
    return [candidate_entry(len(planned) + n + 1, c, cluster, model, request.frozen_layers,
                            caveat=_not_planned(c.estimate.strategy, nodes, request.max_dag_nodes))
            for n, (c, nodes) in enumerate(listed)]


def _not_planned(s: Strategy, nodes: int, max_nodes: int) -> Caveat:
    """The caveat of a strategy whose energy DAG (``nodes``) is over the planner's bound (``max_nodes``)."""
    chunks = f" × {s.virtual_stages} chunks" if s.virtual_stages > 1 else ""
    return Caveat(kind="energy_not_planned", note=(
        f"its energy-planning DAG has {nodes} nodes ({s.pp} stages{chunks} × {s.gas} micro-batches), over the "
        f"planner's bound of {max_nodes}: its clocks were not planned (no energy figures, no frequency plan: it "
        "runs at maximum clocks) and it is listed after every planned strategy, at its cost-model time; to plan "
        "it, fewer micro-batches (a smaller --global-batch) or fewer stages (--pp), or rank every strategy by time "
        "alone with --energy-planner none"))


def with_spread_variants(kept: Sequence[Candidate], cm: CostModel, request: PlanRequest) -> list[Candidate]:
    """``kept`` (fastest first) plus, for each strategy whose cost-model time is within the slowdown bound of the
    fastest (at most 2·top_k of them), its slack-spreading re-partition at the same bottleneck where that differs and
    fits (:func:`ampe.search.spread.spread_variant`; placement name + ", spread partition"); fastest first. The
    fastest is the fastest without a caveat where there is one, as the energy ranking's bound
    (:func:`rank_caveats_last`): a faster strategy at risk of running out of memory ranks after them.

    Only for the energy objectives: Eq. 5 is often indifferent between such partitions, the energy planner is not
    (GPT-3 2.7B, selective recomputation, 8 A40s: 2.5 % against 20.4 % saved at no slowdown, docs/energy.md §10.7).
    """
    if not kept:
        return list(kept)
    bound = _slowdown_bound(kept, cm.model, request)
    have = {strategy_identity(c.strategy) for c in kept}
    out = list(kept)
    for c in sorted(kept, key=lambda c: c.estimate.iteration_s)[: 2 * request.search.top_k]:
        if c.estimate.iteration_s > bound:
            break
        est = spread_variant(cm, c.estimate, request.search.recompute, request.search.method)
        if est is not None and strategy_identity(est.strategy) not in have:
            have.add(strategy_identity(est.strategy))
            out.append(Candidate(est, f"{c.placement_name}, spread partition"))
    return sorted(out, key=lambda c: c.estimate.iteration_s)


def _slowdown_bound(kept: Sequence[Candidate], model: Model, request: PlanRequest) -> float:
    """The energy ranking's bound on the iteration time (s): the slowdown allowed over the fastest candidate
    without a caveat (over the fastest of all where every one has one)."""
    x = DEFAULT_MAX_SLOWDOWN if request.max_slowdown is None else request.max_slowdown
    clean = [c for c, bad in zip(kept, _caveated(kept, model), strict=True) if not bad] or kept
    return (1 + x) * min(c.estimate.iteration_s for c in clean) * (1 + 1e-12)


def with_share_variants(kept: Sequence[Candidate], cm: CostModel, request: PlanRequest) -> list[Candidate]:
    """``kept`` plus, for each two-replica strategy within the slowdown bound (at most 2·top_k of them), its other
    splits of the batch within the bound (:func:`ampe.search.shares.share_variants`; placement name + ", shares
    a:b"); fastest first. Only for the energy objectives with ``--shares auto``: the energy ranking then chooses over
    shares and clocks together, which is exact for two replicas (docs/shares.md)."""
    if not kept or request.search.shares == "equal":
        return list(kept)
    bound = _slowdown_bound(kept, cm.model, request)
    have = {(strategy_identity(c.strategy), c.strategy.shares) for c in kept}
    out = list(kept)
    for c in sorted(kept, key=lambda c: c.estimate.iteration_s)[: 2 * request.search.top_k]:
        if c.estimate.iteration_s > bound:
            break
        for est in share_variants(cm, c.estimate, bound, request.search.method):
            if (strategy_identity(est.strategy), est.strategy.shares) not in have:
                have.add((strategy_identity(est.strategy), est.strategy.shares))
                out.append(Candidate(est, f"{c.placement_name}, shares {shares_label(est.strategy)}"))
    return sorted(out, key=lambda c: c.estimate.iteration_s)


def memory_advice(cluster: Cluster, model: Model, profile: Profile | None, opts: SearchOptions) -> str:
    """What would fit when nothing does: the memory options (recomputation, ZeRO-1, FlashAttention) under which a
    strategy fits, with an example; or that the model states alone exceed the cluster; or that only a smaller batch
    or more devices can help."""
    exceed, why = states_exceed_cluster(model, cluster)
    if exceed:
        return why + ": a larger cluster (or a smaller model) is needed"
    tries: list[tuple[str, Model, SearchOptions]] = []
    widened = replace(opts, recompute=RECOMPUTE, zero=ZERO_STAGES, local_search=0, jobs=1)
    if set(opts.recompute) != set(RECOMPUTE) or set(opts.zero) != set(ZERO_STAGES):
        tries.append(("--recompute none,selective,full --zero 0,1", model, widened))
    if model.attention == "eager":
        tries.append(("--attention flash" + (" --recompute none,selective,full --zero 0,1" if tries else ""),
                      model.with_attention("flash"), widened))
    for flags, m, o in tries:
        found = search(cluster, m, profile, o)
        if found.ranked:
            s = found.ranked[0].strategy
            return (f"it would fit with {flags} (e.g. pp={s.pp} dp={s.dp} tp={s.tp} mbs={s.mbs} "
                    f"recompute={s.recompute_label} zero={s.zero})")
    return (why + ", but no strategy fits with its activations even with full recomputation and ZeRO-1: try a "
            "smaller --global-batch, more devices or --allow-cross-node-tp")


def plan_for_estimates(cluster: Cluster, model: Model, estimates: Sequence[Estimate], gbs: int,
                       stats: SearchStats, inputs: PlanInputs, placement_names: Sequence[str] | None = None,
                       frozen_layers: int | None = None, energy_planner: str | None = None,
                       keep_order: bool = False) -> PlanFile:
    """A plan of given, already costed strategies, ranked in the order given; with ``energy_planner`` (e.g.
    ``"perseus"``) ranked by iteration time instead (in the order given with ``keep_order``), each with its
    no-slowdown frequency plan (and, on a priced cluster, its money and CO2e: ``predicted.cost``)."""
    names = list(placement_names) if placement_names is not None else ["given"] * len(estimates)
    if energy_planner is None:
        entries = [_entry(i + 1, e, cluster, model, name, frozen_layers) for i, (e, name) in
                   enumerate(zip(estimates, names, strict=True))]
    else:
        energy = rank_strategies(list(estimates), cluster, objective="time", top_k=len(estimates),
                                 planner=energy_planner)
        order = sorted(energy.ranked, key=lambda r: r.index) if keep_order else energy.ranked
        entries = ranked_entries(order, estimates, names, cluster, model, gbs, frozen_layers)
    return build_plan(cluster, model, gbs, entries, stats, inputs, frozen_layers)


def ranked_entries(order: Sequence[RankedStrategy], estimates: Sequence[Estimate], names: Sequence[str],
                   cluster: Cluster, model: Model, gbs: int, frozen_layers: int | None) -> list[StrategyEntry]:
    """Plan entries of energy-planned strategies in ``order`` (ranks 1, 2, …), each at its chosen point with its
    energy and, on a priced cluster, its money and CO2e."""
    entries = []
    for i, r in enumerate(order):
        cost = plan_cost(cluster, estimates[r.index].strategy, r, gbs * model.seq_len)
        entries.append(_entry(i + 1, estimates[r.index], cluster, model, names[r.index], frozen_layers,
                              entry_energy(r, cost=cost)))
    return entries


def candidate_entry(rank: int, c: Candidate, cluster: Cluster, model: Model, frozen_layers: int | None,
                    energy: EntryEnergy | None = None, caveat: Caveat | None = None) -> StrategyEntry:
    """The plan entry of one searched candidate, with the energy planner's figures when it ran and a ``caveat``
    beyond the strategy's own (:func:`strategy_caveats`)."""
    return _entry(rank, c.estimate, cluster, model, c.placement_name, frozen_layers, energy, caveat)


def _entry(rank: int, est: Estimate, cluster: Cluster, model: Model, placement_name: str, frozen_layers: int | None,
           energy: EntryEnergy | None = None, caveat: Caveat | None = None) -> StrategyEntry:
    s = est.strategy
    caveats = (*strategy_caveats(est, model), *((caveat,) if caveat is not None else ()))
    facts = EntryFacts(placement_name, summary(cluster, s.placement or (), s.pp, s.dp, s.tp),
                       runtime_support(s, model), caveats, frozen_layers, energy)
    return strategy_entry(rank, est, model.dtype, facts, attention=model.attention, tf32=model.tf32)


def run_iterations(request: PlanRequest, model: Model) -> int | None:
    """Iterations of the training run the request names (``iterations``, or ``tokens`` over global batch ×
    sequence length), None when it names none. Raises :class:`InputError` when tokens cannot be converted."""
    if request.iterations is not None:
        return request.iterations
    if request.tokens is None:
        return None
    if model.seq_len <= 0:
        raise InputError("--tokens", "", f"model {model.name} has no sequence length; give --iterations instead")
    return iterations_for_tokens(request.tokens, request.search.gbs, model.seq_len)


def entry_energy(r: RankedStrategy, iterations: int | None = None, tokens: int | None = None,
                 cost: PlanCost | None = None) -> EntryEnergy:
    """The energy planner's figures for one plan entry: the chosen point, its Pareto flag and frequency plan (None
    when every clock stays at its maximum: nothing to apply); with ``iterations``, the training run's kWh and hours
    (``predicted.training_run``); ``cost``: its money and CO2e (:func:`plan_cost`)."""
    sp = r.point
    run = None
    if iterations is not None:
        t = training_run(iterations, sp.energy_j, sp.energy_max_clock_j, sp.time_s, r.energy.fastest_time_s, tokens)
        run = TrainingRunFigures(iterations=t.iterations, tokens=t.tokens, energy_kwh=t.energy_kwh,
                                 energy_max_clock_kwh=t.energy_max_clock_kwh, saved_kwh=t.saved_kwh, hours=t.hours,
                                 hours_max_clock=t.hours_max_clock)
    plan = None if is_all_max(r.energy, sp) else frequency_plan_of(r.energy, sp)
    return EntryEnergy(energy_j=sp.energy_j, energy_max_clock_j=sp.energy_max_clock_j,
                       energy_savings_pct=sp.savings_pct, average_power_w=sp.average_power_w, plan_time_s=sp.time_s,
                       max_clock_time_s=r.energy.fastest_time_s, energy_source=r.energy.source,
                       within_slowdown=r.within_bound, pareto=r.pareto, frequency_plan=plan, training_run=run,
                       cost=cost)


def plan_cost(cluster: Cluster, strategy: Strategy, r: RankedStrategy, tokens_per_iteration: int,
              iterations: int | None = None) -> PlanCost | None:
    """``predicted.cost`` of one plan entry when the cluster spec gives prices (None otherwise): money and CO2e of
    one iteration at the chosen point (and of the run), each only where the spec has every figure it needs for the
    strategy's devices (:mod:`ampe.costmodel.pricing`, :mod:`ampe.energy.price`). Figures the spec cannot give stay
    unset, so the written JSON omits them."""
    pricing = cluster.pricing
    if pricing is None or strategy.placement is None:
        return None
    used = sorted(set(strategy.placement))
    mine = pricing.subset(used)
    se, sp = r.energy, r.point
    kwh, c, g = point_costs(se, sp, [strategy_weights(pricing, strategy, f) for f in ("kwh", "cost", "carbon")])
    optional: dict[str, Any] = {} if iterations is None else {"iterations": iterations}
    if mine.missing("cost") is None:
        optional.update({"per_iteration": c.total, "rent_per_iteration": c.time_part,
                         "electricity_per_iteration": c.energy_part})
        if tokens_per_iteration > 0:
            optional["per_million_tokens"] = c.total / tokens_per_iteration * 1e6
        if iterations is not None:
            optional["per_run"] = c.total * iterations
    if mine.missing("carbon") is None:
        optional["co2e_g_per_iteration"] = g.energy_part
        if iterations is not None:
            optional["co2e_kg_per_run"] = g.energy_part * iterations / 1000
    if r.direct:
        optional["direct"] = True
    return PlanCost(currency=pricing.currency, devices=len(used), gpu_hours_per_iteration=len(used) * sp.time_s / 3600,
                    energy_kwh_per_iteration=kwh.energy_part, prices=describe(pricing, used), energy_source=se.source,
                    **optional)


@dataclass(frozen=True)
class DevicesAutoHint:
    """``--devices all`` under a priced objective on a cluster of several GPU types: ``--devices auto`` would also
    price the strategies that leave out a GPU-type group (sometimes cheaper per token)."""


@dataclass(frozen=True)
class NoSubsetWithinBound:
    """``--devices auto``: no strategy that leaves out a GPU-type group is within the slowdown bound, so none was
    priced; a wider bound would price them."""

    max_slowdown: float  # the bound (fraction)
    fastest_subset_s: float  # the fastest strategy leaving a group out, by the cost model (s)
    fastest_s: float  # the fastest strategy of all (s)


@dataclass(frozen=True)
class PricedChoice:
    """One priced strategy a finding names: its rank in the plan (None: beyond the top k), degrees, micro-batch
    size, money (currency units) or emissions (g CO2e) per iteration, and iteration time (s)."""

    rank: int | None
    pp: int
    dp: int
    tp: int
    mbs: int
    per_iteration: float
    time_s: float


@dataclass(frozen=True)
class CheaperWithout:
    """``--devices auto``: leaving out a GPU-type group is cheaper per token (emits less, ``measure`` "carbon")
    than the best strategy on every device (``reference``; None when none came among the ``priced``)."""

    left_out: str  # the group left out, e.g. "4×T4"
    measure: Literal["cost", "carbon"]
    currency: str
    best: PricedChoice
    reference: PricedChoice | None
    priced: int  # strategies the energy planner priced
    top_k: int  # entries in the plan the energy planner planned (those over its DAG bound come after)


CostFinding = DevicesAutoHint | NoSubsetWithinBound | CheaperWithout


def planned_entries(entries: Sequence[StrategyEntry], energy: EnergyRanking,
                    top_k: int) -> list[tuple[StrategyEntry, RankedStrategy]]:
    """The plan's entries the energy planner planned, each with its place in ``energy``'s ranking: the first
    min(``top_k``, ranked) of both, in order (entries over the DAG bound come after them, unplanned:
    :func:`unplanned_entries`)."""
    n = min(top_k, len(energy.ranked))
    return list(zip(entries[:n], energy.ranked[:n], strict=True))


def cost_findings(cluster: Cluster, planned: Sequence[Candidate], energy: EnergyRanking, request: PlanRequest,
                  entries: Sequence[StrategyEntry]) -> tuple[CostFinding, ...]:
    """What a person paying for the run should know beyond the table: with ``--devices auto``, whether leaving out a
    GPU-type group is cheaper per token (emits less, under ``carbon``) than the best strategy on every device, among
    all the strategies the energy planner priced (not only the top k); with ``all``, that ``auto`` would try it.
    Data only: the CLI writes the sentences (``ampe.cli._cost``)."""
    pricing = cluster.pricing
    if pricing is None:
        return ()
    what: Literal["cost", "carbon"] = ("carbon" if request.objective == "carbon" or pricing.missing("cost") is not None
                                       else "cost")
    if pricing.missing(what) is not None:
        return ()
    if request.devices != "auto":
        return (DevicesAutoHint(),) if request.objective in PRICED and len(cluster.gpu_types()) > 1 else ()
    shown = planned_entries(entries, energy, request.search.top_k)  # the planned entries (unplanned come after)
    rank_of = {id(r): i + 1 for i, (_, r) in enumerate(shown)}
    full: list[tuple[PricedChoice, Strategy]] = []
    part: list[tuple[PricedChoice, Strategy]] = []
    for r in energy.ranked:
        s = planned[r.index].estimate.strategy
        choice = PricedChoice(rank_of.get(id(r)), s.pp, s.dp, s.tp, s.mbs,
                              point_cost(r.energy, r.point, strategy_weights(pricing, s, what)).total, r.point.time_s)
        (full if len(set(s.placement or ())) == cluster.size else part).append((choice, s))
    if not part and request.objective in PRICED and energy.bound_s is not None:
        outside = [c.estimate.iteration_s for c in planned if len(set(c.estimate.strategy.placement or ()))
                   < cluster.size]
        if outside and min(outside) > energy.bound_s:
            return (NoSubsetWithinBound(energy.max_slowdown or 0, min(outside), energy.fastest_s),)
    if not part:
        return ()
    best, bs = min(part, key=lambda x: x[0].per_iteration)
    ref = min(full, key=lambda x: x[0].per_iteration)[0] if full else None
    if ref is not None and best.per_iteration >= ref.per_iteration:
        return ()
    return (CheaperWithout(left_out(cluster, bs.placement or ()), what, pricing.currency, best, ref,
                           len(energy.ranked), len(shown)),)


def search_stats(result: SearchResult, request: PlanRequest, energy: EnergyStats | None = None) -> SearchStats:
    """The plan's ``search`` section: what the search did, and how the clocks were planned (``energy``) when they
    were."""
    more: dict[str, Any] = {} if energy is None else {"energy": energy}  # absent, not null, when not planned
    return SearchStats(candidates=result.candidates, pruned_oom=result.pruned_oom, seconds=round(result.seconds, 3),
                       degrees=result.degrees, jobs=request.search.jobs,
                       method=cast(PipelineMethod, request.search.method), cost_model="ampe", **more)


def energy_stats(energy: EnergyRanking, request: PlanRequest, spread_variants: int, share_variants: int,
                 unplanned: int = 0) -> EnergyStats:
    """The plan's ``search.energy`` section: how the clocks were planned, with the slack-spreading and share variants
    the energy objectives added to the strategies, and the strategies left unplanned (their DAG over
    ``request.max_dag_nodes``: :func:`dag_bounded`; recorded with the bound only when there are some) (counts)."""
    optional: dict[str, Any] = {"priced_direct": request.priced_direct} if _forced(request, energy) else {}
    if unplanned:
        optional.update(unplanned=unplanned, max_dag_nodes=request.max_dag_nodes)
    return EnergyStats(objective=cast(ObjectiveName, energy.objective), max_slowdown=energy.max_slowdown,
                       fastest_s=energy.fastest_s, bound_s=energy.bound_s,
                       planner=cast(PlannerName, request.energy_planner), straggler=request.straggler,
                       slack_margin=request.slack_margin, unit_time_s=request.unit_time_s,
                       evaluated=energy.evaluated, screened=energy.screened, frontiers=energy.traced,
                       seconds=round(energy.seconds, 3), coarsening=energy.coarsening,
                       spread_variants=spread_variants, share_variants=share_variants,
                       **optional)


def _forced(request: PlanRequest, energy: EnergyRanking) -> bool:
    """Whether ``--priced-path direct|traced`` took effect: only the priced objectives under the perseus planner
    have the two paths (absent, the default: each strategy's by its work, recorded in its ``predicted.cost``)."""
    return request.priced_direct is not None and energy.objective in ("cost", "carbon") \
        and request.energy_planner == "perseus"
