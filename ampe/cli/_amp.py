"""``ampe search --cost-model amp``: AMP's own predictions, shown beside ampe's for the same strategies."""

from __future__ import annotations

import argparse

from ampe.cli._common import calibration_sidecar, fits_label, gib, print_table
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.errors import InputError
from ampe.formats.plan import PlanInputs, SearchStats
from ampe.search.amp_compat import amp_candidates, amp_search
from ampe.search.placement import summary
from ampe.search.plan import EntryFacts, build_plan, strategy_entry


def run_amp(args: argparse.Namespace, cluster: Cluster, model: Model, profile: Profile | None) -> int:
    """Rank AMP's candidates by AMP's cost model; also cost each with ampe's model (memory included)."""
    if profile is None:
        raise InputError("--profile", "", "--cost-model amp needs a measured profile (AMP's model has no roofline)")
    import time

    t0 = time.perf_counter()
    ranked = amp_search(cluster, model, profile, args.global_batch)
    seconds = time.perf_counter() - t0
    cm = CostModel(cluster, model, profile)
    rows, entries = [], []
    pruned = 0
    for i, pred in enumerate(ranked):
        ours = cm.estimate(pred.strategy)
        pruned += not ours.within_capacity
        if i >= args.top_k:
            continue
        s = ours.strategy
        rows.append([i + 1, f"{s.pp}/{s.dp}/{s.tp}", s.mbs, list(s.partition or ()), f"{pred.predicted_s:.4f}",
                     f"{ours.iteration_s:.4f}", gib(ours.max_memory_bytes), fits_label(ours)])
        assert s.placement is not None  # estimates hold completed strategies
        facts = EntryFacts("megatron/given", summary(cluster, s.placement, s.pp, s.dp, s.tp),
                           amp_iteration_s=pred.predicted_s)
        entries.append(strategy_entry(i + 1, ours, model.dtype, facts, attention=model.attention))
    print_table(f"AMP-compatible search: {model.name} on {cluster.name} — {len(ranked)} candidates "
                f"(AMP count {len(amp_candidates(cluster, args.global_batch))}), {seconds:.2f} s; "
                "ranked by AMP's model",
                ["rank", "pp/dp/tp", "mbs", "partition", "AMP s/iter", "ampe s/iter", "ampe peak GiB", "fits"], rows)
    print(f"{pruned} of AMP's {len(ranked)} candidates do not fit in memory under ampe's memory model "
          "(AMP has none and would launch them)")
    if args.out:
        stats = SearchStats(candidates=len(ranked), pruned_oom=0, seconds=round(seconds, 3), cost_model="amp",
                            ampe_predicts_oom=pruned)
        inputs = PlanInputs(cluster_spec=args.cluster, model=args.model, profile=args.profile,
                            calibration=calibration_sidecar(args.profile, profile), cost_model="amp")
        from ampe.cli._planio import write_plan

        write_plan(args.out, build_plan(cluster, model, args.global_batch, entries, stats, inputs).to_json())
        print(f"plan written to {args.out}")
    return 0
