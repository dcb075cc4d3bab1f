"""``ampe replan``: re-plan a planned strategy after the cluster changed (``--without``, ``--add``, ``--slow``:
docs/replan.md), or re-partition it after freezing a prefix of layers (``--frozen-layers``, FreezePipe)."""

from __future__ import annotations

import argparse
from typing import Any

from ampe.cli._common import calibration_sidecar, gib, positive_int, print_table, slowdown_share
from ampe.cli._planio import (
    check_outputs_over_plan,
    load_plan_inputs,
    plan_profile_path,
    strategy_at_rank,
    write_plan,
)
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.energy.objective import OBJECTIVES
from ampe.errors import InputError
from ampe.formats.plan import EnergyStats, PlanFile, PlanInputs, ReplannedFrom
from ampe.formats.plan_inputs import absolute_inputs
from ampe.search.frozen_replan import FrozenReplan, replan_frozen


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replan", help="re-plan a plan's strategy after a node fails, comes back or turns slow, or "
                       "after freezing layers",
                       description="After a cluster change (--without, --add, --slow): re-plan the strategy on the "
                       "cluster as it now is, warm-started from the old one, ties (within 0.5 %) broken toward the "
                       "smallest change; print what moves and the change in time and energy, and write the new plan "
                       "and the new cluster spec (docs/replan.md). With --frozen-layers N: freeze the first N layers "
                       "(forward only), re-run the exact layer assignment at the same degrees and placement, and "
                       "print the predicted gain over keeping the old partition.")
    p.add_argument("--plan", required=True, metavar="PLAN.json",
                   help="a plan from `ampe search` or `ampe replan` (its cluster spec, model and profile are reused)")
    p.add_argument("--without", metavar="NODE|DEVICE,...",
                   help="devices gone: node names (p3-1), device ids as the plan numbers them (17) or a node's "
                   "device (p3-1:2), comma-separated")
    p.add_argument("--add", metavar="SPEC.yaml",
                   help="a spec fragment with `nodes:` (and optionally gpu_types, links): node groups added, or back "
                   "(a group whose nodes are down comes back)")
    p.add_argument("--slow", metavar="DEVICE=FACTOR,...",
                   help="stragglers: the device's (or node's) compute takes FACTOR times as long (2 = half speed; "
                   "1 = healthy again)")
    p.add_argument("--frozen-layers", type=int, metavar="N",
                   help="freeze the first N layers (DeepSpeed LayerSpec entries; forward only, FreezePipe)")
    p.add_argument("--rank", type=positive_int, default=1, metavar="R", help="which strategy of the plan (1)")
    p.add_argument("--search", action="store_true",
                   help="also run a full search (on the frozen model; after a change, on the new cluster and on the "
                   "devices the best warm start uses)")
    p.add_argument("--energy-planner", choices=("perseus", "envpipe", "global", "none"), default="perseus",
                   help="after a change: clocks of the chosen strategy (and of the old one when its plan has no "
                   "energy figures); none: time only")
    p.add_argument("--objective", choices=tuple(OBJECTIVES), default=None,
                   help="after a change: what the choice minimises (default: the plan's own objective, "
                   "inputs.objective, else time): time keeps the fastest; energy, edp, cost or carbon plan every "
                   "candidate's clocks within --max-slowdown of the fastest, as `ampe search` ranks (cost and carbon "
                   "need the spec's prices)")
    p.add_argument("--max-slowdown", type=slowdown_share, default=None, metavar="X",
                   help="after a change, with an objective other than time: allowed slowdown against the fastest "
                   "candidate, a percent (5%%) or a fraction (0.05); default 5%%")
    p.add_argument("--top-k", type=positive_int, default=1, metavar="K",
                   help="after a change: strategies written, the chosen one first, then the fastest others (1)")
    p.add_argument("--out", metavar="PLAN.json",
                   help="write the new plan for `ampe trial` / `ampe export`; after a change also the cluster spec "
                   "as it now is (--cluster-out); with --frozen-layers the re-searched (with --search), "
                   "re-partitioned and old strategies, fastest first, each with its no-slowdown frequency plan")
    p.add_argument("--cluster-out", metavar="SPEC.yaml",
                   help="after a change: where the cluster spec as it now is goes (default: beside --out, "
                   "<out>.cluster.yaml); the new plan names it")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    changed = args.without is not None or args.add is not None or args.slow is not None
    if changed == (args.frozen_layers is not None):
        raise InputError("--without/--add/--slow", "", "give a cluster change (--without, --add, --slow) or "
                         "--frozen-layers N, not both" if changed else "give a cluster change (--without, --add, "
                         "--slow) or --frozen-layers N")
    if args.cluster_out is not None and args.out is None:  # the spec without its plan would be a spec no plan names
        raise InputError("--cluster-out", "", "only with --out (the re-plan that names the spec as it now is)")
    for flag, value in (("--objective", args.objective), ("--max-slowdown", args.max_slowdown)):
        if value is not None and not changed:
            raise InputError(flag, "", "only after a cluster change (--without, --add, --slow)")
    if changed:
        from ampe.cli._replan_change import run_change

        return run_change(args)
    doc, cluster, model, profile = load_plan_inputs(args.plan)
    check_outputs_over_plan(args, doc, args.plan)
    if not 0 <= args.frozen_layers < model.num_layers:
        raise InputError("--frozen-layers", "", f"must be in 0..{model.num_layers - 1} for {model.name}")
    old = strategy_at_rank(doc, args.plan, args.rank, cluster, model)
    r = replan_frozen(CostModel(cluster, model, profile), old, args.frozen_layers, full_search=args.search)
    rows = [["keep old partition", list(r.keep.strategy.partition or ()), f"{r.keep.iteration_s:.4f}",
             gib(r.keep.max_memory_bytes), "1.00x"]]
    if r.repartitioned is not None:
        rows.append(["re-partitioned (same degrees, placement)", list(r.repartitioned.strategy.partition or ()),
                     f"{r.repartitioned.iteration_s:.4f}", gib(r.repartitioned.max_memory_bytes), f"{r.gain:.2f}x"])
    if r.researched is not None:
        s = r.researched.strategy
        rows.append([f"full re-search: pp/dp/tp {s.pp}/{s.dp}/{s.tp} mbs {s.mbs}", list(s.partition or ()),
                     f"{r.researched.iteration_s:.4f}", gib(r.researched.max_memory_bytes),
                     f"{r.keep.iteration_s / r.researched.iteration_s:.2f}x"])
    print_table(f"ampe replan: {model.name}, first {args.frozen_layers} layers frozen (strategy rank {args.rank}: "
                f"pp/dp/tp {old.pp}/{old.dp}/{old.tp}, mbs {old.mbs})",
                ["plan", "partition", "s/iter", "peak GiB", "gain"], rows)
    if args.out:
        write_plan(args.out, _frozen_plan(doc, cluster, model, profile, r, args))
        print(f"plan written to {args.out}")
    return 0


def _frozen_plan(doc: PlanFile, cluster: Cluster, model: Model, profile: Profile | None, r: FrozenReplan,
                 args: argparse.Namespace) -> dict[str, Any]:
    """A plan whose strategies run with the first N layers frozen: re-partitioned first, then the old partition."""
    from ampe.planning import plan_for_estimates

    frozen = model.with_frozen_prefix(args.frozen_layers)
    named = [(e, name) for e, name in ((r.researched, "re-searched"), (r.repartitioned, "re-partitioned"),
                                       (r.keep, "old partition")) if e is not None]
    unique: dict[tuple, tuple] = {}
    for e, name in named:  # the same strategy twice (re-partitioning changed nothing) is written once
        unique.setdefault((e.strategy.pp, e.strategy.dp, e.strategy.tp, e.strategy.mbs,
                           e.strategy.partition, e.strategy.placement), (e, name))
    ests = [e for e, _ in unique.values()]
    # the calibration is the one found now, beside the plan's profile (it may have been added or removed since)
    inputs = PlanInputs.model_validate({**absolute_inputs(doc.inputs.model_dump(exclude_unset=True), args.plan),
                                        "frozen_layers": args.frozen_layers,
                                        "calibration": calibration_sidecar(plan_profile_path(doc, args.plan),
                                                                           profile)})
    # the old plan's energy figures are not this plan's: its clocks are planned here, under the time objective
    stats = doc.search.edited(energy=EnergyStats(objective="time", planner="perseus"),
                              replanned_from=ReplannedFrom(plan=args.plan, rank=args.rank))
    return plan_for_estimates(cluster, frozen, ests, doc.global_batch, stats, inputs,
                              [name for _, name in unique.values()], args.frozen_layers,
                              energy_planner="perseus").to_json()
