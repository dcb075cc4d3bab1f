"""Plan files (``ampe.plan/1``, the typed model :class:`ampe.formats.plan.PlanFile`): building their entries.

Every strategy entry is also valid input to ``ampe evaluate --strategy`` (it carries pp, dp, tp, mbs, gbs, gas,
partition, placement and schedule), and carries a ready-to-use DeepSpeed config.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ampe import __version__
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import Estimate
from ampe.costmodel.model import Model
from ampe.costmodel.runnable import RUNS, runtime_problems
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.training import deepspeed_config
from ampe.formats.plan import PLAN_SCHEMA, Caveat, PlanFile


def runtime_support(s: Strategy, model: Model) -> dict[str, Any]:
    """Whether ampe's trial worker can run strategy ``s`` for ``model`` (``deepspeed``) and, if not, every reason
    (``note``; :func:`ampe.costmodel.runnable.runtime_problems`, which the worker itself checks): the one answer the
    search, the plan, ``ampe trial`` and the worker use."""
    problems = runtime_problems(s, model)
    return {"deepspeed": not problems, "note": "; ".join(problems) if problems else RUNS}


def strategy_caveats(est: Estimate, model: Model) -> list[Caveat]:
    """Why ``est``'s strategy may not run as planned (:class:`~ampe.formats.plan.Caveat`): its memory at risk (a
    device's footprint within capacity but not within the reserve: ``Estimate.memory_risk``), and not runnable where
    :func:`runtime_support` says ampe's runtime cannot run it for ``model``."""
    out = list(est.caveats)
    support = runtime_support(est.strategy, model)
    if not support["deepspeed"]:
        out.append(Caveat(kind="not_runnable", note=support["note"]))
    return out


def strategy_entry(rank: int, est: Estimate, dtype: str, placement_name: str = "",
                   placement_summary: str = "", extra: dict[str, Any] | None = None,
                   attention: str | None = None, tf32: bool | None = None) -> dict[str, Any]:
    """One ranked strategy of a plan file; it names the precision ``dtype``, the ``attention`` kernel and whether
    fp32 products run as TF32 (``tf32``), as it was costed (the model's, unless the strategy names its own)."""
    s = est.strategy
    entry: dict[str, Any] = {"rank": rank}
    entry.update(s.to_dict())
    entry.setdefault("dtype", dtype)
    if attention is not None:
        entry.setdefault("attention", attention)
    if tf32 is not None:
        entry.setdefault("tf32", tf32)
    dtype = entry["dtype"]
    entry["placement_name"] = placement_name
    entry["placement_summary"] = placement_summary
    entry["predicted"] = {
        "iteration_s": est.iteration_s,
        "samples_per_s": est.samples_per_s,
        "max_memory_bytes": est.max_memory_bytes,
        "memory_bytes_per_stage": list(est.memory_bytes_per_stage),
        "stage_times_s": list(est.stage_times_s),
        "pipeline_s": list(est.pipeline_s),
        "dp_sync_s": est.dp_sync_s,
        "fits": est.fits,
        "method": est.method,
        "compute_source": est.compute_source,
        "memory_breakdown": [m.to_dict() for m in est.memory_breakdown],
    }
    entry["deepspeed"] = deepspeed_config(s, dtype)
    if extra:
        entry.update(extra)
    return entry


def caveats_json(caveats: Sequence[Caveat]) -> dict[str, Any]:
    """A plan entry's ``caveats`` field (nothing when there are none: plans without caveats read as before)."""
    return {"caveats": [c.model_dump(mode="json") for c in caveats]} if caveats else {}


def build_plan(cluster: Cluster, model: Model, gbs: int, strategies: Sequence[dict[str, Any]],
               search_stats: dict[str, Any], inputs: dict[str, Any], frozen_layers: int | None = None) -> PlanFile:
    """The whole plan, validated by the model every reader uses. ``inputs`` records how to reproduce it (spec and
    profile paths, model name); ``frozen_layers``: the plan runs with that prefix frozen (``ampe replan``)."""
    doc: dict[str, Any] = {
        "schema": PLAN_SCHEMA,
        "ampe_version": __version__,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "cluster": cluster.name,
        "model": model.name,
        "global_batch": gbs,
        "devices": [{"id": d.id, "node": d.node, "gpu": d.gpu.name} for d in cluster.devices],
        "inputs": inputs,
        "search": search_stats,
        "strategies": list(strategies),
    }
    if frozen_layers is not None:
        doc["frozen_layers"] = frozen_layers
    return PlanFile.parse(doc, "<plan being written>")
