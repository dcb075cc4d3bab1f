"""``ampe search``: rank parallel strategies for a cluster and model, write a plan JSON."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ampe.cli._backend import BACKENDS, joblib_backend
from ampe.cli._common import (
    add_inputs,
    calibration_note,
    calibration_sidecar,
    check_jobs,
    factor,
    gib,
    global_batch,
    int_list,
    load_inputs,
    margin_share,
    positive_int,
    print_table,
    say_profile,
    slowdown_share,
    unit_time,
)
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.model import Model
from ampe.costmodel.strategy import RECOMPUTE, SCHEDULES, recompute_label, shares_label, strategy_from_dict
from ampe.energy.objective import OBJECTIVES
from ampe.energy.ranking import EnergyRanking
from ampe.energy.strategy import DEFAULT_MAX_SLOWDOWN, PLANNERS
from ampe.errors import InputError
from ampe.formats.plan import PlanFile, PlanInputs, StrategyEntry
from ampe.planning import PlanRequest, make_plan, planned_entries
from ampe.search.engine import SearchOptions, SearchResult
from ampe.search.placement import LAYOUTS, ORDERS
from ampe.search.shares import SHARES

# --priced-path → PlanRequest.priced_direct: auto (each strategy by its work), traced, direct
PRICED_PATHS: dict[str, bool | None] = {"auto": None, "traced": False, "direct": True}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search parallel strategies and rank them",
                       description="Search pipeline/data/tensor degrees, micro-batch size, device placement and the "
                       "exact layer partition; rank by predicted iteration time; write a plan JSON.")
    add_inputs(p)
    p.add_argument("--global-batch", type=global_batch, default=None, metavar="N",
                   help="global batch in samples (default: from the model and cluster, a tokens-per-batch rule; "
                   "printed)")
    p.add_argument("--devices", choices=("all", "auto"), default="all",
                   help="all: every strategy uses every device (default); auto: also strategies that leave out a "
                   "whole GPU-type group, ranked on the same table (the table says what was left out)")
    p.add_argument("--recompute", default="none,selective,full", metavar="LIST",
                   help="activation recomputation options to search, tried cheapest first: any of "
                   "none,selective,full (default all)")
    p.add_argument("--zero", default="0,1", metavar="LIST",
                   help="ZeRO stages to search: 0 and/or 1 (optimizer states sharded over the dp group; used where "
                   "it makes a strategy fit; default 0,1)")
    p.add_argument("--expandable-segments", choices=("on", "off"), default=None,
                   help="PyTorch's caching allocator with expandable_segments (PYTORCH_CUDA_ALLOC_CONF, which `ampe "
                   "trial` and `ampe export` set for every rank): on removes most of its fragmentation from the "
                   "footprint (default on for a cluster with GPUs; a CPU-only cluster leaves it unset: no CUDA "
                   "allocator)")
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K", help="strategies to print/write (10)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="J", help="parallel workers via joblib (1)")
    p.add_argument("--joblib-backend", choices=BACKENDS, default=None,
                   help="where candidates and energy plans are computed: loky (default), threading, multiprocessing, "
                   "dask or ray (docs/backends.md)")
    p.add_argument("--scheduler", metavar="ADDRESS", default=None,
                   help="dask: the scheduler to use (default: a local cluster of --jobs workers)")
    p.add_argument("--ray-address", metavar="ADDRESS", default=None,
                   help="ray: the cluster to join (default: a local Ray)")
    p.add_argument("--out", metavar="PLAN.json", help="write the plan here")
    p.add_argument("--cost-model", choices=("ampe", "amp"), default="ampe",
                   help="ampe's heterogeneity-aware model (default) or AMP-compatible reproduction")
    p.add_argument("--allow-cross-node-tp", action="store_true", help="let tensor parallelism span nodes")
    p.add_argument("--orders", default=",".join(ORDERS), metavar="LIST",
                   help=f"device orders for placement candidates (default {','.join(ORDERS)})")
    p.add_argument("--layouts", default=",".join(LAYOUTS), metavar="LIST",
                   help=f"rank layouts for placement candidates (default {','.join(LAYOUTS)})")
    p.add_argument("--local-search", type=int, default=3, metavar="N",
                   help="refine the N best candidates by swapping stage device blocks (default 3; 0 = off)")
    p.add_argument("--shares", choices=SHARES, default="auto",
                   help="each data-parallel replica's share of the batch: auto (default: the integer shares that "
                   "minimise each candidate's iteration time, so faster replicas run more micro-batches; "
                   "docs/shares.md) or equal (gbs/dp each)")
    p.add_argument("--method", choices=("eq5", "simulate"), default="eq5",
                   help="pipeline time used to rank: Eq. 5 (default) or the schedule simulation")
    p.add_argument("--schedules", default="1f1b", metavar="LIST",
                   help="pipeline schedules to search: any of 1f1b,gpipe,interleaved (default 1f1b)")
    p.add_argument("--tf32", choices=("on", "off"), default="off",
                   help="let fp32 matrix products run as TF32 on tensor cores (A100, A40, H100, H200; the runtime "
                   "sets torch.backends.cuda.matmul.allow_tf32 and cudnn's) or not (default off, PyTorch's default: "
                   "fp32 stays fp32); changes nothing for a bf16/fp16 model")
    p.add_argument("--frozen-layers", type=int, default=0, metavar="N",
                   help="freeze the first N layers (forward only; FreezePipe) and plan for that")
    p.add_argument("--pp", type=int_list, default=None, metavar="LIST",
                   help="keep only strategies with these pipeline degrees, e.g. 2,4 (default: all)")
    _add_energy_args(p.add_argument_group("energy (per-computation SM clocks, Perseus; see docs/energy.md)"))
    p.set_defaults(func=run)


def _add_energy_args(e: argparse._ArgumentGroup) -> None:
    """``ampe search``'s energy flags: the objective, its bound and the frequency planner's knobs."""
    e.add_argument("--objective", choices=tuple(OBJECTIVES), default="time",
                   help="rank by iteration time (default; each strategy at its no-slowdown T_min point), by energy, "
                   "energy x time, money (GPU-hours x price + kWh x PUE x electricity price: the spec's "
                   "price_per_hour and electricity_per_kwh) or CO2e (kWh x PUE x carbon_g_per_kwh), within "
                   "--max-slowdown of the fastest strategy")
    e.add_argument("--max-slowdown", type=slowdown_share, default=None, metavar="X",
                   help=f"energy/edp/cost/carbon: allowed slowdown against the fastest strategy's iteration time, a "
                   f"percent (5%%) or a fraction (0.05; a bare number above 1 is refused), at most 1000%%; default "
                   f"{DEFAULT_MAX_SLOWDOWN:g}")
    e.add_argument("--straggler", type=factor, default=1.0, metavar="F",
                   help="a straggler makes the synchronous pipeline time F x the slowest replica's T_min "
                   "(default 1); replicas slow down to it")
    e.add_argument("--energy-planner", choices=(*PLANNERS, "none"), default="perseus",
                   help="per-computation clocks: perseus (default, the frontier), envpipe or global (baselines "
                   "for comparison), none (no energy planning)")
    e.add_argument("--slack-margin", type=margin_share, default=0.0, metavar="G",
                   help="plan as if every slowed computation ran G longer than modelled (5%% or 0.05, at most "
                   "100%%), so the plan keeps that much of each slack against model error and noise (default 0)")
    path = e.add_mutually_exclusive_group()
    path.add_argument("--priced-path", choices=PRICED_PATHS, default="auto",
                      help="cost/carbon: trace each strategy's frontier (traced: exact), or solve its points directly "
                      "inside its cost window, where no slower point can beat its all-max point (direct: less work at "
                      "scale, points up to 0.015%% dearer; a coarse screening of more than 2·top-k candidates still "
                      "traces); auto (default): traced where the trace is estimated at most 1 CPU s, direct beyond "
                      "(docs/energy.md §10.9)")
    path.add_argument("--priced-direct", dest="priced_path", action="store_const", const="direct",
                      help="the same as --priced-path direct")
    e.add_argument("--unit-time", type=unit_time, default=None, metavar="SEC",
                   help="time quantum tau of the frontiers (default: each strategy's T_min / 1000)")
    length = e.add_mutually_exclusive_group()
    length.add_argument("--iterations", type=positive_int, default=None, metavar="N",
                     help="also report each strategy's energy (and money and CO2e, with a priced spec) for a training "
                     "run of N iterations (kWh, plan and all-max clocks)")
    length.add_argument("--tokens", type=_count, default=None, metavar="T",
                     help="the same for a run of T tokens (e.g. 3e11): ceil(T / (global batch x sequence length)) "
                     "iterations")
    e.add_argument("--plot", metavar="STRATEGIES.png",
                   help="plot the strategies' iteration time against energy, Pareto set marked (PNG)")
    e.add_argument("--timeline", metavar="T.png",
                   help="draw the rank-1 strategy's pipeline timeline at its chosen point (PNG Gantt chart)")


MAX_TOKENS = 10**18


def _count(text: str) -> int:
    """argparse type: a positive whole number, also written like 3e11 (at most 1e18)."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:20]!r}") from None
    if not (1 <= v <= MAX_TOKENS) or v != int(v):
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 1e18, got {text[:20]}")
    return int(v)


def _names(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise InputError(flag, "", f"unknown value {bad[0] if bad else text!r} (choose from {', '.join(allowed)})")
    return vals


def run(args: argparse.Namespace) -> int:
    check_jobs(args.jobs, remote=bool(args.scheduler or args.ray_address))
    cluster, model, profile = load_inputs(args)
    model = model.with_tf32(args.tf32 == "on")
    args.model_attention = model.attention
    say_profile(profile, model)
    note = calibration_note(args.profile, profile, amp=args.cost_model == "amp")
    if note:
        print(note)
    if args.global_batch is None:
        from ampe.search.defaults import default_global_batch

        args.global_batch, why = default_global_batch(model, cluster)
        print(f"global batch: {why}")
    if args.local_search < 0:
        raise InputError("--local-search", "", "must be ≥ 0")
    schedules = _names(args.schedules, SCHEDULES, "--schedules")
    if not 0 <= args.frozen_layers < model.num_layers:
        raise InputError("--frozen-layers", "", f"must be in 0..{model.num_layers - 1} for {model.name}")
    _check_energy_args(args)
    if args.cost_model == "amp":
        from ampe.cli._amp import run_amp

        return run_amp(args, cluster, model.with_frozen_prefix(args.frozen_layers) if args.frozen_layers else model,
                       profile)
    recompute = _names(args.recompute, RECOMPUTE, "--recompute")
    if model.attention == "flash" and set(recompute) == {"selective"}:
        raise InputError("--recompute", "", f"selective changes nothing with {model.name}'s FlashAttention (it keeps "
                         "no attention scores already): add none or full")
    zero = tuple(int(z) for z in _names(args.zero, ("0", "1"), "--zero"))
    opts = SearchOptions(gbs=args.global_batch, top_k=args.top_k, jobs=args.jobs, recompute=recompute, zero=zero,
                         expandable_segments=default_expandable(cluster, args.expandable_segments),
                         allow_cross_node_tp=args.allow_cross_node_tp,
                         orders=_names(args.orders, ORDERS, "--orders"),
                         layouts=_names(args.layouts, LAYOUTS, "--layouts"),
                         local_search=args.local_search, method=args.method,
                         schedules=schedules, shares=args.shares)
    request = PlanRequest(search=opts, objective=args.objective, max_slowdown=args.max_slowdown,
                          straggler=args.straggler, energy_planner=args.energy_planner,
                          slack_margin=args.slack_margin, unit_time_s=args.unit_time,
                          priced_direct=PRICED_PATHS[args.priced_path],
                          pipeline_degrees=tuple(args.pp) if args.pp else None, frozen_layers=args.frozen_layers,
                          devices=args.devices,
                          iterations=args.iterations, tokens=args.tokens,
                          inputs=_inputs(args, calibration_sidecar(args.profile, profile)))
    from ampe.cli._diagnostics import diagnostics
    from ampe.cli._progress import PhaseProgress

    searching = PhaseProgress("ampe search", "searching", "candidate groups")
    planning = PhaseProgress("ampe search", "energy planning")
    with (joblib_backend(args.joblib_backend, args.jobs, args.scheduler, args.ray_address), searching, planning,
          diagnostics(_say_after(searching))):
        made = make_plan(cluster, model, profile, request, searching.update, _energy_started(searching, planning))
    entries = made.plan.strategies
    _print(cluster, model, made.search, entries, made.energy, len(made.kept))
    _print_unplanned(made.plan)
    from ampe.cli._cost import print_cost

    print_cost(entries, made.findings)
    if made.energy is not None:
        _pictures(args, made.energy, entries)
    if args.out:
        from ampe.cli._planio import write_plan

        write_plan(args.out, made.plan.to_json())
        print(f"plan written to {args.out}")
    return 0


def _print_unplanned(plan: PlanFile) -> None:
    """One line when strategies were left out of energy planning (their DAG over the planner's bound)."""
    stats = plan.search.energy
    if stats is not None and stats.unplanned:
        listed = [e.rank for e in plan.strategies if any(c.kind == "energy_not_planned" for c in e.caveats)]
        n = stats.unplanned
        print(f"energy planning: {n} strateg{'y has' if n == 1 else 'ies have'} an energy DAG over the planner's "
              f"bound of {stats.max_dag_nodes} nodes and {'was' if n == 1 else 'were'} not planned (the others "
              "were): " + (f"rank{'s' if len(listed) > 1 else ''} {', '.join(map(str, listed))} of this plan, after "
                           "every planned one" if listed else "none could take a place in this plan")
              + " (search.energy.unplanned)")


def default_expandable(cluster: Cluster, flag: str | None) -> bool | None:
    """The allocator setting a search plans with: ``--expandable-segments on|off`` as given; by default on where the
    cluster has GPUs (it removes most of the caching allocator's fragmentation, the largest part of the footprint
    the allocated peak does not show; ``ampe trial`` and ``ampe export`` set it for every rank, so the plan is what
    runs), unset on a CPU-only cluster (no CUDA allocator; plans and trial keys stay as they were)."""
    if flag is not None:
        return flag == "on"
    return None if all(d.gpu.healthy().is_cpu for d in cluster.devices) else True


def _energy_started(searching: Any, planning: Any) -> Any:
    """The energy planner's progress callback: the search's bar ends when the first energy update comes."""
    def update(done: float, total: float) -> None:
        searching.close()
        planning.update(done, total)

    return update


def _say_after(searching: Any) -> Any:
    """A line on stderr from the library's diagnostics (the energy planner's coarsening), once the search's bar is
    gone."""
    def say(line: str) -> None:
        searching.close()
        print(f"ampe search: {line}", file=sys.stderr, flush=True)

    return say


def _check_energy_args(args: argparse.Namespace) -> None:
    if args.energy_planner == "none":
        if args.objective != "time":
            raise InputError("--objective", "", f"{args.objective} needs an energy planner (not --energy-planner "
                             "none)")
        for flag, value in (("--plot", args.plot), ("--timeline", args.timeline), ("--iterations", args.iterations),
                            ("--tokens", args.tokens)):
            if value:
                raise InputError(flag, "", "needs an energy planner (not --energy-planner none)")
    if args.objective == "time" and args.max_slowdown is not None:
        raise InputError("--max-slowdown", "", "applies to --objective energy, edp, cost or carbon (time keeps every "
                         "strategy at its no-slowdown T_min point)")
    if args.priced_path != "auto" and (args.objective not in ("cost", "carbon") or args.energy_planner != "perseus"):
        raise InputError("--priced-path", "", f"{args.priced_path} (or --priced-direct) applies to --objective cost "
                         "or carbon with --energy-planner perseus")
    if args.cost_model == "amp" and (args.objective != "time" or args.plot or args.timeline or args.iterations
                                     or args.tokens):
        raise InputError("--cost-model", "", "the energy objectives and pictures need --cost-model ampe")


def _pictures(args: argparse.Namespace, energy: EnergyRanking, entries: Sequence[StrategyEntry]) -> None:
    if args.plot:
        from ampe.viz import StrategyMark, strategies_plot

        marks = [StrategyMark(_short(e), r.point.time_s, r.point.energy_j, r.energy.fastest_time_s,
                              r.point.energy_max_clock_j, r.pareto)
                 for e, r in planned_entries(entries, energy, args.top_k)]
        kind = _short_source(energy)
        kind = kind if kind in ("modelled", "measured") else "partly measured"
        strategies_plot(args.plot, marks, f"Strategies by {energy.objective}: iteration time vs energy "
                        f"({args.energy_planner}; energy {_short_source(energy)})", energy.bound_s,
                        f"{kind} energy per iteration, all devices")
        print(f"strategies plot: {args.plot}")
    if args.timeline and energy.ranked:
        from ampe.cli._common import draw_timeline

        best = energy.ranked[0]
        se, sp = best.energy, best.point
        r = max(range(len(se.replicas)), key=lambda k: sp.points[k].time_s)  # the slowest replica
        rep = se.replicas[r]
        draw_timeline(args.timeline, rep.dag, sp.points[r].choice, rep.inputs.gpus,
                      f"Rank 1 ({_short(entries[0])}), replica {r} at its chosen point: pipeline "
                      f"{sp.points[r].time_s:.4f} s, iteration {sp.time_s:.4f} s")


def _memory_options(e: StrategyEntry) -> str:
    """``recompute=…`` and ``ZeRO-1`` of a plan entry, or ``-`` when it uses neither."""
    rec = recompute_label(e.stage_recompute) if e.stage_recompute else e.recompute
    parts = ([f"recompute {rec}"] if e.recompute != "none" else []) + (["ZeRO-1"] if e.zero else [])
    return ", ".join(parts) or "-"


def _short(e: StrategyEntry) -> str:
    sched = "" if e.schedule == "1f1b" else f" {e.schedule}"
    return f"#{e.rank} {e.pp}/{e.dp}/{e.tp} mbs{e.mbs}{sched}"


def _short_source(energy: EnergyRanking) -> str:
    if not energy.ranked:
        return "n/a"
    sources = {r.energy.source.split(" ")[0].rstrip(":") for r in energy.ranked}
    return "/".join(sorted(sources))  # modelled, measured or mixed


def _inputs(args: argparse.Namespace, calibration: str | None) -> PlanInputs:
    return PlanInputs(cluster_spec=args.cluster, model=args.model, profile=args.profile, calibration=calibration,
                      cost_model=args.cost_model, frozen_layers=args.frozen_layers, schedules=args.schedules,
                      attention=args.model_attention, tf32=args.tf32 == "on", devices=args.devices,
                      objective=args.objective, shares=args.shares,
                      **({"seq_len": args.seq_len} if args.seq_len is not None else {}))


def _print(cluster: Cluster, model: Model, result: SearchResult, entries: Sequence[StrategyEntry],
           energy: EnergyRanking | None = None, kept: int | None = None) -> None:
    _print_strategies(cluster, model, result, entries, energy, kept)
    _print_stages(model, entries)
    if energy is not None:
        _print_energy(energy, entries)


def _shape(e: StrategyEntry) -> str:
    """``pp/dp/tp``, the schedule unless 1F1B, and uneven shares."""
    return (f"{e.pp}/{e.dp}/{e.tp}" + ("" if e.schedule == "1f1b" else f" {e.schedule}")
            + (f" shares {shares_label(strategy_from_dict(e.model_dump(), 'plan'))}" if e.replica_gas else ""))


def _print_strategies(cluster: Cluster, model: Model, result: SearchResult, entries: Sequence[StrategyEntry],
                      energy: EnergyRanking | None, kept: int | None) -> None:
    """The ranked strategies' table, what its columns mean, and each strategy's caveats."""
    from ampe.search.placement import compact_summary
    from ampe.search.subsets import left_out

    rows: list[list[Any]] = []
    partial = any(len(e.placement) < cluster.size for e in entries)
    saving = any(_memory_options(e) != "-" for e in entries)  # the column only when a strategy uses an option
    caveated = any(e.caveats for e in entries)  # the column only when a strategy has a caveat
    for e in entries:
        pr = e.predicted
        rows.append([e.rank, _shape(e), e.mbs] + ([_memory_options(e)] if saving else [])
                    + [compact_summary(cluster, tuple(e.placement), e.pp, e.dp, e.tp).replace(" ×", NBSP_TIMES),
                       f"{pr.iteration_s:.4f}", f"{pr.samples_per_s:.2f}", _or_dash(pr.max_memory_bytes, gib)]
                    + ([left_out(cluster, e.placement) or "-"] if partial else [])
                    + ([", ".join(c.label for c in e.caveats) or "-"] if caveated else []))
    filtered = "" if kept is None or kept == len(result.ranked) else f", {kept} kept by --pp"
    if result.too_large:
        filtered += f", {result.too_large} degree choices left out (partition table over the DP's bound)"
    order = ("ranked by s/iter (each strategy at maximum clocks)" if energy is None or energy.objective == "time"
             else f"ranked by {energy.objective} (the energy table below), not by s/iter")
    print_table(f"ampe search: {model.name} on {cluster.name} ({cluster.size} devices) — {result.candidates} "
                f"candidates, {result.pruned_oom} pruned (out of memory){filtered}, {result.seconds:.2f} s; {order}",
                ["rank", "pp/dp/tp", "mbs"] + (["memory options"] if saving else [])
                + [PLACEMENT_COLUMN, "s/iter", "samples/s", "peak GiB"] + (["left out"] if partial else [])
                + (["caveats"] if caveated else []),
                rows)
    if any(NBSP_TIMES in r[4 if saving else 3] for r in rows):
        print(f"{PLACEMENT_COLUMN}: each stage holds dp·tp devices; `A40 ×2` = two stages in a row on A40s, "
              "`T4×1+V100-16GB×1` = one stage mixing types.")
    print("peak GiB: the footprint of the fullest device (allocated peak + allocator fragmentation + CUDA context); "
          "a strategy fits when it leaves the device's reserve free" + (
              f" (allocator: expandable_segments {entries[0].expandable_segments})"
              if entries and entries[0].expandable_segments is not None else ""))
    for e in entries:
        for c in e.caveats:
            after = "every planned strategy" if c.kind == "energy_not_planned" else "every strategy without a caveat"
            print(f"rank {e.rank}: {c.label} (ranked after {after}): {c.note}")


def _print_stages(model: Model, entries: Sequence[StrategyEntry]) -> None:
    """Each strategy's device ids and layer boundaries per stage; a warning per stage without a transformer block."""
    from ampe.search.defaults import stages_without_blocks

    print_table("stages: device ids and layer boundaries",
                ["rank", "pp/dp/tp", "devices per stage", "partition"],
                [[e.rank, _shape(e), device_ids(e), e.partition] for e in entries])
    for e in entries:
        empty = stages_without_blocks(model, e.partition)
        if empty:
            print(f"warning: rank {e.rank}: stage{'s' if len(empty) > 1 else ''} {', '.join(map(str, empty))} "
                  f"{'hold' if len(empty) > 1 else 'holds'} no transformer block (only embedding/norm/head layers): "
                  "those devices mostly wait",
                  file=sys.stderr)


def _print_energy(energy: EnergyRanking, entries: Sequence[StrategyEntry]) -> None:
    """The energy table per iteration (and per training run when the plan has one)."""
    from ampe.units import si

    energy_rows = []
    for e in entries:
        pr = e.predicted
        if pr.plan_time_s is None:  # over the planner's DAG bound: its caveat says why
            energy_rows.append([e.rank, _shape(e), e.mbs, f"{pr.iteration_s:.4f}", "not planned", "-", "-", "-", "-",
                                ""])
            continue
        energy_rows.append([e.rank, _shape(e), e.mbs, f"{pr.max_clock_time_s or pr.iteration_s:.4f}",
                            f"{pr.plan_time_s:.4f}" + ("" if pr.within_slowdown else " †"),
                            _or_dash(pr.energy_max_clock_j, lambda j: si(j, "J")),
                            _or_dash(pr.energy_j, lambda j: si(j, "J")), f"{pr.energy_savings_pct:.1f}",
                            _or_dash(pr.average_power_w, lambda w: si(w, "W")), "★" if pr.pareto else ""])
    bound = ("" if energy.bound_s is None or energy.max_slowdown is None else
             f" within {energy.max_slowdown * 100:g}% of the fastest ({energy.fastest_s:.4f} s → ≤ "
             f"{energy.bound_s:.4f} s)")
    straggler = "" if not energy.ranked or energy.ranked[0].energy.straggler == 1 else \
        f", straggler ×{energy.ranked[0].energy.straggler:g}"
    print_table(f"energy per iteration, all devices — objective: {energy.objective}{bound}{straggler}; "
                f"{energy.evaluated} strategies planned in {energy.seconds:.2f} s",
                ["rank", "pp/dp/tp", "mbs", "s/iter max clk", "s/iter plan", "energy max clk", "energy plan",
                 "saved %", "avg power", "Pareto"], energy_rows)
    src = energy.ranked[0].energy.source if energy.ranked else "modelled"
    print(f"Energy {src}; the tail (gradient all-reduce, optimizer) at blocking power. s/iter max clk: every "
          "clock at maximum, in the energy planner's exact schedule (the s/iter above is the search's "
          f"{(entries[0].predicted.method or 'eq5') if entries else 'eq5'} estimate and can differ slightly); "
          "s/iter plan: with the frequency plan" + (" († slower than the bound: shown at its T_min "
          "point)" if any(not r.within_bound for r in energy.ranked) else "") +
          ". ★ = Pareto set, time vs energy, of the strategies planned." + (
              " not planned: its energy DAG is over the planner's bound (its caveat above); s/iter max clk is then the "
              "search's estimate" if any(e.predicted.plan_time_s is None for e in entries) else ""))
    _print_training_run(entries)


def _or_dash(x: float | None, shown: Callable[[float], str]) -> str:
    """A figure of a plan entry as ``shown`` writes it; ``-`` where the entry lacks it."""
    return "-" if x is None else shown(x)


def _print_training_run(entries: Sequence[StrategyEntry]) -> None:
    """Each strategy's energy and hours for the training run the plan was asked about (none: nothing)."""
    from ampe.units import si

    runs = [(e, e.predicted.training_run) for e in entries if e.predicted.training_run is not None]
    if runs:
        first = runs[0][1]
        length = f"{first.iterations} iterations" + ("" if first.tokens is None else f" ({first.tokens:.3g} tokens)")
        print_table(f"energy per training run of {length}, all devices",
                    ["rank", "pp/dp/tp", "mbs", "hours max clk", "hours plan", "energy max clk", "energy plan",
                     "saved"],
                    [[e.rank, f"{e.pp}/{e.dp}/{e.tp}", e.mbs, f"{t.hours_max_clock:.4g}", f"{t.hours:.4g}",
                      si(t.energy_max_clock_kwh * 1e3, "Wh"), si(t.energy_kwh * 1e3, "Wh"), si(t.saved_kwh * 1e3, "Wh")]
                     for e, t in runs])


PLACEMENT_COLUMN = "GPU type per stage"
NBSP_TIMES = "\u00a0×"  # `A40 ×2` wraps as one word: a long placement breaks only between stages


def device_ids(entry: StrategyEntry) -> str:
    """Each stage's device ids, compactly (``0-3|8-11``): what sets apart rows whose GPU types look alike, and
    what `ampe evaluate` needs as ``placement`` (the plan JSON has the full list)."""
    pp, dp, tp, place = entry.pp, entry.dp, entry.tp, entry.placement
    per = dp * tp
    return "|".join(_ranges(sorted(place[j * per:(j + 1) * per])) for j in range(pp))


def _ranges(ids: list[int]) -> str:
    out, start = [], None
    for k, d in enumerate(ids):
        if start is None:
            start = d
        if k + 1 == len(ids) or ids[k + 1] != d + 1:
            out.append(str(start) if start == d else f"{start}-{d}")
            start = None
    return ",".join(out)
