"""A plan entry checked against what it runs on when a plan is read (``evaluate``, ``report``, ``replan``,
``frontier``, ``export``, ``trial``): its frozen prefix within the model, and every clock of its frequency plan
within the clock range of the GPU type that runs it. A plan edited by hand or made for another cluster is refused in
one line instead of being exported with a 9000 MHz V100 clock or costed with 99 of 24 layers frozen."""

from __future__ import annotations

from ampe.costmodel.cluster import Cluster
from ampe.costmodel.strategy import Strategy
from ampe.formats.frequency_plan import FrequencyPlan
from ampe.formats.plan import PlanFile, StrategyEntry


def entry_frozen(doc: PlanFile, entry: StrategyEntry) -> int:
    """Layers a plan entry trains frozen: its own ``frozen_layers``, else the plan's (top level, then ``inputs``),
    else 0 — the prefix its predicted figures were costed with, so every scorer of the entry uses it.

    Args:
        doc: the plan.
        entry: one of its strategies.
    Returns:
        The frozen prefix (layers).
    """
    for k in (entry.frozen_layers, doc.frozen_layers, doc.inputs.frozen_layers):
        if k is not None:
            return k
    return 0


def entry_problem(frozen: int | None, fplan: FrequencyPlan | None, s: Strategy, cluster: Cluster,
                  num_layers: int) -> tuple[str, str] | None:
    """(field, reason) of the first thing wrong with a plan entry, or None.

    Args:
        frozen: the entry's ``frozen_layers`` (None: not given).
        fplan: the entry's frequency plan (None: none).
        s: the entry's strategy, validated and completed (with a placement).
        cluster: the cluster it runs on.
        num_layers: the model's layers.
    """
    if frozen is not None and frozen > num_layers:
        return "frozen_layers", f"{frozen} frozen layers but the model has {num_layers}"
    if fplan is None or s.placement is None:
        return None
    for r in range(s.dp):
        try:
            stages = fplan.replica_stages(r)
        except (IndexError, TypeError):  # a shape the plan's own check reports
            return None
        for j, steps in enumerate(stages[:s.pp]):
            gpus = {cluster.devices[d].gpu for d in s.stage_devices(j, r)}
            lo = min(g.sm_clock_min_mhz for g in gpus)
            hi = max(g.sm_clock_max_mhz for g in gpus)
            bad = next((mhz for _, _, mhz in steps if not lo <= mhz <= hi), None)
            if bad is not None:
                names = ", ".join(sorted(g.name for g in gpus))
                return (f"frequency_plan.stages[{j}]", f"{bad} MHz is outside the clocks of {names} ({lo:g}..{hi:g} "
                        "MHz), which runs this stage")
    return None
