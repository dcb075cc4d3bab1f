"""Re-planning after layers freeze (FreezePipe): frozen layers run forward only, so the old partition is
unbalanced; re-run the exact DP at the same degrees and placement, and optionally the whole search.
"""

from __future__ import annotations

from dataclasses import dataclass

from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.strategy import Strategy
from ampe.search.engine import SearchOptions, best_for_placement, search
from ampe.search.space import Degrees


@dataclass(frozen=True)
class FrozenReplan:
    """The old strategy re-costed with frozen layers, its re-partitioned version and (optionally) a new search's
    best."""

    frozen_layers: int
    keep: Estimate  # old partition, frozen model
    repartitioned: Estimate | None  # same degrees and placement, DP-optimal partition for the frozen model
    researched: Estimate | None = None  # best of a full search on the frozen model

    @property
    def gain(self) -> float:
        """Predicted speed-up of the re-partitioned strategy over keeping the old partition (≥ 1 when better)."""
        if self.repartitioned is None:
            return 1.0
        return self.keep.iteration_s / self.repartitioned.iteration_s


def replan_frozen(cm: CostModel, old: Strategy, frozen_layers: int, full_search: bool = False,
                  opts: SearchOptions | None = None) -> FrozenReplan:
    """Re-plan ``old`` for ``cm``'s model with its first ``frozen_layers`` layers frozen.

    Args:
        cm: the cost model of the cluster and the model as trained so far.
        old: the strategy running now (placed).
        frozen_layers: how many leading layers freeze (forward only).
        full_search: also search every strategy for the frozen model.
        opts: that search's knobs (None: the defaults at the old global batch).

    Returns:
        The old strategy re-costed, its DP-optimal re-partition at the same degrees and placement, and the
        search's best (estimates; times in s).
    """
    frozen = cm.model.with_frozen_prefix(frozen_layers)
    fcm = CostModel(cm.cluster, frozen, cm.profile)
    keep = fcm.estimate(old)
    assert old.placement is not None
    d = Degrees(old.pp, old.dp, old.tp, old.mbs, old.gbs, old.schedule, old.virtual_stages,
                old.expandable_segments)
    new = best_for_placement(fcm, d, old.placement)
    if new is not None and new.iteration_s > keep.iteration_s:
        new = keep  # the DP's optimum is never worse than keeping; guard against re-ranking noise
    researched = None
    if full_search:
        res = search(cm.cluster, frozen, cm.profile, opts or SearchOptions(gbs=old.gbs))
        researched = res.ranked[0].estimate if res.ranked else None
    return FrozenReplan(frozen_layers, keep, new, researched)
