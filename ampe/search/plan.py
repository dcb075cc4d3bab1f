"""Plan files (``ampe.plan/1``, the typed model :class:`ampe.formats.plan.PlanFile`): building their entries.

Every strategy entry is also valid input to ``ampe evaluate --strategy`` (it carries pp, dp, tp, mbs, gbs, gas,
partition, placement and schedule), and carries a ready-to-use DeepSpeed config.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from ampe import __version__
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.runnable import RUNS, runtime_problems
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.training import deepspeed_config
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan import (
    PLAN_SCHEMA,
    Caveat,
    DeepSpeedConfig,
    DeviceEntry,
    PlanCost,
    PlanFile,
    PlanInputs,
    Predicted,
    RuntimeSupport,
    SearchStats,
    StrategyEntry,
    TrainingRunFigures,
)


def runtime_support(s: Strategy, model: Model) -> RuntimeSupport:
    """Whether ampe's trial worker can run strategy ``s`` for ``model`` (``deepspeed``) and, if not, every reason
    (``note``; :func:`ampe.costmodel.runnable.runtime_problems`, which the worker itself checks): the one answer the
    search, the plan, ``ampe trial`` and the worker use."""
    problems = runtime_problems(s, model)
    return RuntimeSupport(deepspeed=not problems, note="; ".join(problems) if problems else RUNS)


def strategy_caveats(est: Estimate, model: Model) -> list[Caveat]:
    """Why ``est``'s strategy may not run as planned (:class:`~ampe.formats.plan.Caveat`): its memory at risk (a
    device's footprint within capacity but not within the reserve: ``Estimate.memory_risk``), and not runnable where
    :func:`runtime_support` says ampe's runtime cannot run it for ``model``."""
    out = list(est.caveats)
    support = runtime_support(est.strategy, model)
    if not support.deepspeed:
        out.append(Caveat(kind="not_runnable", note=support.note))
    return out


@dataclass(frozen=True)
class EntryEnergy:
    """What the energy planner adds to one plan entry: the chosen point's figures (J, s, W, %), whether it is within
    the slowdown bound and on the Pareto set, its frequency plan (None: every clock at its maximum, nothing to
    apply), the training run's figures (when one was named) and its money and CO2e (on a priced cluster)."""

    energy_j: float
    energy_max_clock_j: float
    energy_savings_pct: float
    average_power_w: float
    plan_time_s: float
    max_clock_time_s: float
    energy_source: str
    within_slowdown: bool
    pareto: bool
    frequency_plan: FrequencyPlan | None
    training_run: TrainingRunFigures | None = None
    cost: PlanCost | None = None


@dataclass(frozen=True)
class EntryFacts:
    """What one plan entry says beyond its estimate: the placement's name and summary, whether ampe's runtime runs
    it, its caveats, the frozen prefix it was planned with, the energy planner's figures, AMP's time (s)."""

    placement_name: str = ""
    placement_summary: str = ""
    runtime: RuntimeSupport | None = None
    caveats: tuple[Caveat, ...] = ()
    frozen_layers: int | None = None
    energy: EntryEnergy | None = None
    amp_iteration_s: float | None = None


def strategy_entry(rank: int, est: Estimate, dtype: str, facts: EntryFacts | None = None,
                   attention: str | None = None, tf32: bool | None = None) -> StrategyEntry:
    """One ranked strategy of a plan file; it names the precision ``dtype``, the ``attention`` kernel and whether
    fp32 products run as TF32 (``tf32``), as it was costed (the model's, unless the strategy names its own).

    Fields left out here stay unset, so the written JSON omits them (``PlanFile.to_json`` excludes unset fields)."""
    s, facts = est.strategy, facts or EntryFacts()
    fields: dict[str, Any] = {"dtype": dtype, **({"attention": attention} if attention is not None else {}),
                              **({"tf32": tf32} if tf32 is not None else {}), **s.to_dict()}
    if facts.runtime is not None:
        fields["runtime"] = facts.runtime
    if facts.caveats:
        fields["caveats"] = list(facts.caveats)
    if facts.frozen_layers is not None:
        fields["frozen_layers"] = facts.frozen_layers
    if facts.energy is not None:
        fields["frequency_plan"] = facts.energy.frequency_plan
    return StrategyEntry(rank=rank, placement_name=facts.placement_name, placement_summary=facts.placement_summary,
                         predicted=_predicted(est, facts),
                         deepspeed=DeepSpeedConfig(**deepspeed_config(s, fields["dtype"])), **fields)


def _predicted(est: Estimate, facts: EntryFacts) -> Predicted:
    """The entry's ``predicted`` section: the cost model's figures, and the energy planner's where it ran."""
    more: dict[str, Any] = {}
    e = facts.energy
    if e is not None:
        more = {"energy_j": e.energy_j, "energy_max_clock_j": e.energy_max_clock_j,
                "energy_savings_pct": e.energy_savings_pct, "average_power_w": e.average_power_w,
                "plan_time_s": e.plan_time_s, "max_clock_time_s": e.max_clock_time_s, "energy_source": e.energy_source,
                "within_slowdown": e.within_slowdown, "pareto": e.pareto,
                **({"training_run": e.training_run} if e.training_run is not None else {}),
                **({"cost": e.cost} if e.cost is not None else {})}
    if facts.amp_iteration_s is not None:
        more["amp_iteration_s"] = facts.amp_iteration_s
    return Predicted(iteration_s=est.iteration_s, samples_per_s=est.samples_per_s,
                     max_memory_bytes=est.max_memory_bytes, memory_bytes_per_stage=list(est.memory_bytes_per_stage),
                     stage_times_s=list(est.stage_times_s), pipeline_s=list(est.pipeline_s), dp_sync_s=est.dp_sync_s,
                     fits=est.fits, method=est.method, compute_source=est.compute_source,
                     memory_breakdown=[m.to_dict() for m in est.memory_breakdown], **more)


def build_plan(cluster: Cluster, model: Model, gbs: int, strategies: Sequence[StrategyEntry],
               search_stats: SearchStats, inputs: PlanInputs, frozen_layers: int | None = None) -> PlanFile:
    """The whole plan, validated by the model every reader uses. ``inputs`` records how to reproduce it (spec and
    profile paths, model name); ``frozen_layers``: the plan runs with that prefix frozen (``ampe replan``)."""
    frozen: dict[str, Any] = {} if frozen_layers is None else {"frozen_layers": frozen_layers}
    return PlanFile(schema=PLAN_SCHEMA, ampe_version=__version__,
                    created=datetime.now(UTC).isoformat(timespec="seconds"), cluster=cluster.name, model=model.name,
                    global_batch=gbs,
                    devices=[DeviceEntry(id=d.id, node=d.node, gpu=d.gpu.name) for d in cluster.devices],
                    inputs=inputs, search=search_stats,
                    strategies=list(strategies),
                    **frozen)
