"""``ampe frontier``: the iteration time–energy Pareto frontier of one pipeline, from a Perseus/Zeus profile CSV or
for a strategy of a plan file (``--plan plan.json --rank R``; the slowest data-parallel replica, or ``--replica``).

Writes a JSON list of points ``{"time_s", "energy_j", "effective_energy_j", "chosen"}`` (fastest first); the chosen
point (``--plans all``: every point) also has ``plan``, per stage ``[[instruction, microbatch, mhz], ...]`` in
execution order (see docs/energy.md).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from ampe.cli._common import factor, margin_share, non_negative_int, positive_int, unit_time, watts
from ampe.cli._progress import PhaseProgress
from ampe.energy import budget
from ampe.errors import InputError
from ampe.io import write_json_atomic

MAX_PLAN_ENTRIES = 10_000_000  # --plans all: points × computations written (each entry ≈ 20 bytes of JSON)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``frontier`` subcommand."""
    p = sub.add_parser(
        "frontier", help="time-energy Pareto frontier of per-computation GPU clocks (Perseus), from a profile CSV "
                         "or a plan's strategy",
        description="Trace the iteration time-energy frontier of one pipeline over per-forward/backward SM clocks "
                    "(Phillips-Dessouky min cuts, Perseus), either from a measured stage,instruction,frequency,"
                    "time,energy profile (--profile) or for a strategy of an `ampe search` plan (--plan, --rank; "
                    "times from the cost model, energy from the DVFS model), and write every point with its "
                    "frequency plan.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--profile", metavar="PERSEUS.csv",
                     help="zeus/Perseus instruction profile: stage,instruction,frequency,time,energy (+ rank columns)")
    src.add_argument("--plan", metavar="PLAN.json", help="plan file written by `ampe search --out`")
    p.add_argument("--rank", type=positive_int, default=None, metavar="R",
                   help="with --plan: the strategy's rank in the plan (default 1)")
    p.add_argument("--replica", type=non_negative_int, default=None, metavar="K",
                   help="with --plan: the data-parallel replica to trace (default: the slowest one)")
    p.add_argument("--stages", type=positive_int, metavar="S", help="with --profile: pipeline stages in the profile")
    p.add_argument("--microbatches", type=positive_int, metavar="M",
                   help="with --profile: micro-batches per iteration")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default=None,
                   help="with --profile: pipeline schedule (default 1f1b)")
    p.add_argument("--p2p-power", type=watts, default=None, metavar="W",
                   help="with --profile: GPU power while blocked on communication, per GPU (default 70 W, the "
                        "Perseus repo value); with --plan it comes from the DVFS model")
    p.add_argument("--unit-time", type=unit_time, default=None, metavar="SEC",
                   help="time quantum tau of the frontier (default 0.001 s with --profile, T_min/1000 with --plan)")
    p.add_argument("--floor-times", action="store_true",
                   help="with --profile: Perseus's time accounting, every measured time floored to the unit time "
                        "(what Perseus's published frontiers report; default: the measured times)")
    p.add_argument("--straggler", type=factor, default=1.0, metavar="K",
                   help="the chosen point runs at min(T*, K*T_min) (default 1: no straggler, T_min); with --plan "
                        "T_min is the slowest replica's")
    p.add_argument("--slack-margin", type=margin_share, default=None, metavar="G",
                   help="with --plan: plan as if slowed computations ran G longer, 5%% or 0.05 (default: the plan's "
                   "own margin)")
    p.add_argument("--max-points", type=positive_int, default=None, metavar="N",
                   help="write at most N points, evenly spread in time (default: all)")
    p.add_argument("--plans", choices=("chosen", "all"), default="chosen",
                   help="which points carry their per-stage clock plan: the chosen one (default; every point always "
                        "has its time and energies) or all (large: points x computations)")
    p.add_argument("--resolution", type=non_negative_int, default=None, metavar="N",
                   help="realize at most N planned points, evenly spread from T* to T_min (default 1000; 0: every "
                        "unit step)")
    p.add_argument("--no-polish", action="store_true",
                   help="write PD's plans mapped to clocks as they are (no deadline fitting, free-float polish "
                        "or fill down to the all-max time)")
    p.add_argument("--out", required=True, metavar="F.json", help="frontier JSON to write")
    p.add_argument("--plot", metavar="F.png", help="also plot time vs energy (PNG), chosen point marked")
    p.add_argument("--export-profile", metavar="F.csv",
                   help="with --plan: also write the strategy's per-stage instruction profile "
                   "(stage,instruction,frequency,time,energy: the Perseus/Zeus format, so Zeus's pipeline frequency "
                   "optimizer and `ampe frontier --profile` can take ampe's plan)")
    p.add_argument("--timeline", metavar="T.png",
                   help="also draw the chosen point's pipeline timeline (PNG Gantt chart: bars coloured by clock, "
                        "with --plan as a share of each stage's own GPU type's maximum, stages named with their type; "
                        "transfers, critical path)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.plan:
        for flag, value in (("--stages", args.stages), ("--microbatches", args.microbatches),
                            ("--schedule", args.schedule), ("--p2p-power", args.p2p_power),
                            ("--floor-times", args.floor_times or None), ("--resolution", args.resolution)):
            if value is not None:
                raise InputError(flag, "", "applies to --profile only (a plan's strategy brings its own)")
        source = _from_plan(args)
    else:
        for flag, value in (("--rank", args.rank), ("--replica", args.replica),
                            ("--export-profile", args.export_profile)):
            if value is not None:
                raise InputError(flag, "", "applies to --plan only")
        for flag, value in (("--stages", args.stages), ("--microbatches", args.microbatches)):
            if value is None:
                raise InputError(flag, "", "required with --profile")
        source = _from_profile(args)
    return _write(args, source)


@dataclass(frozen=True)
class _Source:
    """The traced pipeline: its DAG, realized frontier, τ (s), the synchronous time T' (s) the chosen point must
    meet, a label, and how its energies were obtained."""

    dag: Any
    frontier: Any  # ampe.energy.bloat.PipelineFrontier
    unit_s: float
    t_prime_s: float
    label: str
    note: str
    gpus: tuple[Any, ...] = ()  # each stage's GPU type (a plan's strategy); empty for a bare measured profile
    energy_kind: str = "modelled"  # the plot's word for the energies: modelled (DVFS model) or measured (a profile)


def _from_profile(args: argparse.Namespace) -> _Source:
    from ampe.energy.bloat import PipelineFrontier
    from ampe.energy.pipeline_dag import build_dag
    from ampe.energy.profile_csv import load_instruction_profile
    from ampe.tradeoff.evaluate import evaluate_choice, fastest_choice
    from ampe.tradeoff.frontier import REALIZED, trace_frontier

    if args.slack_margin is not None:
        raise InputError("--slack-margin", "", "applies to --plan only (a measured profile has no model to guard)")
    watts = 70.0 if args.p2p_power is None else args.p2p_power
    unit = args.unit_time or 1e-3
    nodes = budget.dag_nodes(args.stages, args.microbatches, transfers=False)  # a profile's DAG has no transfers
    if nodes > budget.MAX_DAG_NODES:  # before anything is built: 10 000 000 micro-batches grew to 4 GB
        raise InputError("--microbatches", "", f"{args.stages} stages × {args.microbatches} micro-batches make "
                         f"{nodes} DAG nodes; at most {budget.MAX_DAG_NODES}")
    profile = load_instruction_profile(args.profile, args.stages)
    _check_sense(args, profile.stage_specs(), profile.gpus_per_stage, unit, watts)
    if args.floor_times:
        profile = profile.floored(unit)
    specs = profile.stage_specs()
    blocking = [watts * g for g in profile.gpus_per_stage]
    # before the DAG is built: the bottleneck stage runs every micro-batch, so T_min ≥ M × its f + b at f_max
    ratio = max(budget.options_ratio(o, blocking[j]) for j, stage in enumerate(specs) for o in stage.values())
    fastest = [sum(min(x.time_s for x in o.options) for o in stage.values()) for stage in specs]
    budget.check_trace(nodes, args.microbatches * max(fastest), ratio, unit)
    realized = REALIZED if args.resolution is None else (args.resolution or None)
    dag = build_dag(specs, args.microbatches, schedule=args.schedule or "1f1b", blocking_w=blocking)
    start = evaluate_choice(dag, fastest_choice(dag))
    with PhaseProgress("ampe frontier", "tracing", "units of τ") as progress:
        traced = trace_frontier(dag, unit, progress=progress.update)
    budget.check_realize(len(dag.nodes), traced.planned_points, realized)  # traced: the points are counted
    with PhaseProgress("ampe frontier", "realizing", "points") as progress:
        points = traced.points(polish=not args.no_polish, realized=realized, progress=progress.update)
    pf = PipelineFrontier(tuple(points), traced.table.total_blocking_w, start)
    return _Source(dag, pf, unit, args.straggler * pf.t_min_s, f"{args.stages} stages × {args.microbatches} "
                   "micro-batches", f"energies from the measured profile, blocking power {watts:g} W per GPU"
                   + (f", times floored to {unit:g} s (Perseus's accounting)" if args.floor_times else ""),
                   energy_kind="measured")


def _check_sense(args: argparse.Namespace, specs: Any, gpus: Any, unit: float, watts: float) -> None:
    """Refuse options that make a measured profile's frontier meaningless: a unit time that ``--floor-times`` floors
    a measured time to 0 (an iteration of 0 s), a blocking power above every measured computation's power (waiting
    would cost more than computing)."""
    options = [(j, x) for j, stage in enumerate(specs) for o in stage.values() for x in o.options if x.time_s > 0]
    if args.floor_times and options:
        shortest = min(x.time_s for _, x in options)
        if shortest < unit:
            raise InputError("--unit-time", "", f"{unit:g} s floors the shortest measured time ({shortest:.3g} s) "
                             "to 0 (--floor-times): give a unit time below it")
    if args.p2p_power is not None and options:
        busiest = max(x.energy_j / x.time_s / gpus[j] for j, x in options)
        if watts > busiest:
            raise InputError("--p2p-power", "", f"{watts:g} W per GPU while blocked is above the highest measured "
                             f"power ({busiest:.3g} W per GPU computing); a GPU draws less waiting than computing")


def _from_plan(args: argparse.Namespace) -> _Source:
    """One replica of a plan's strategy (the slowest unless --replica), planned as ``ampe search`` plans it (same
    τ, slack margin and straggler rule: T' from the slowest replica, whichever one is traced)."""
    from ampe.cli._planio import check_outputs_over_plan, load_plan_inputs, strategy_at_rank
    from ampe.costmodel.estimate import CostModel
    from ampe.costmodel.plan_entry import entry_frozen
    from ampe.energy import strategy as energy
    from ampe.energy.inputs import job_of

    if args.no_polish:
        raise InputError("--no-polish", "", "applies to --profile only (plans are always polished)")
    doc, cluster, model, profile = load_plan_inputs(args.plan)
    check_outputs_over_plan(args, doc, args.plan)
    rank = args.rank or 1
    strategy = strategy_at_rank(doc, args.plan, rank, cluster, model)
    entry = next(e for e in doc.strategies if e.rank == rank)
    frozen = entry_frozen(doc, entry)  # costed as the plan costed it: with the entry's frozen prefix
    estimate = CostModel(cluster, model.with_frozen_prefix(frozen) if frozen else model, profile).estimate(
        strategy, doc.search.method or "eq5")
    job = job_of(0, estimate, cluster)
    budget.check_nodes([job], args.plan)
    t_min = estimate.iteration_s  # the pipeline's T_min is at most the cost model's iteration time
    budget.check_trace(job.nodes, t_min, job.ratio, args.unit_time or t_min / energy.RESOLUTION)
    margin = args.slack_margin
    if margin is None:
        margin = float(entry.frequency_plan.margin or 0.0) if entry.frequency_plan is not None else 0.0
    with PhaseProgress("ampe frontier", "tracing and realizing") as progress:
        se = energy.plan_clocks(estimate, cluster, unit_s=args.unit_time, straggler=args.straggler,
                                max_time_s=math.inf, margin=margin, progress=progress.update)
    reps = se.replicas
    if args.replica is not None and args.replica >= len(reps):
        raise InputError("--replica", "", f"strategy {rank} has {len(reps)} data-parallel replicas (0.."
                         f"{len(reps) - 1})")
    r = args.replica if args.replica is not None else max(range(len(reps)), key=lambda k: reps[k].frontier.t_min_s)
    s = estimate.strategy
    gpus = reps[r].inputs.gpus
    label = (f"rank {rank}: pp{s.pp}·dp{s.dp}·tp{s.tp}·mbs{s.mbs}, replica {r}, {s.gas} micro-batches "
             f"({', '.join(gpus[j].name for j in range(reps[r].inputs.num_stages))})")
    note = (f"energies {se.source}, blocking power from the DVFS model" +
            (f", slack margin {margin:g}" if margin else ""))
    return _Source(reps[r].dag, reps[r].frontier, se.unit_s, se.t_prime_min_s, label, note, tuple(gpus),
                   _energy_kind(se.source))


def _energy_kind(source: str) -> str:
    """``modelled``, ``measured`` or ``partly measured``, from an energy source label (``modelled (analytic DVFS
    model)``, ``measured (per-clock profile…)``, ``mixed: …``)."""
    word = source.split(" ")[0].rstrip(":;,")
    return {"measured": "measured", "mixed": "partly measured"}.get(word, "modelled")


def _write(args: argparse.Namespace, source: _Source) -> int:
    from ampe.energy.bloat import plan_at
    from ampe.energy.plan import plan_of
    from ampe.units import si

    dag, pf, unit, label, note = source.dag, source.frontier, source.unit_s, source.label, source.note
    if args.export_profile:
        from ampe.energy.profile_csv import instruction_profile_csv
        from ampe.io import write_text_atomic

        try:
            text = instruction_profile_csv(dag)
        except ValueError as e:
            raise InputError("--export-profile", "", str(e)) from None
        write_text_atomic(args.export_profile, text)
        print(f"instruction profile written to {args.export_profile} ({dag.num_stages} stages; energies {note})")
    points, all_max = list(pf.points), pf.all_max
    chosen = plan_at([pf], source.t_prime_s)
    chosen_point = chosen.points[0]
    kept = _thin(points, args.max_points, chosen_point)
    computations = sum(len(order) for order in dag.stage_order)
    if args.plans == "all" and len(kept) * computations > MAX_PLAN_ENTRIES:
        raise InputError("--plans", "", f"all: {len(kept)} points × {computations} computations is "
                         f"{len(kept) * computations} clock entries (at most {MAX_PLAN_ENTRIES}, about 200 MB of "
                         f"JSON); add --max-points {max(3, MAX_PLAN_ENTRIES // computations)} or fewer")
    out: list[dict[str, Any]] = []
    for p in kept:
        record: dict[str, Any] = {"time_s": p.time_s, "energy_j": p.energy_j, "effective_energy_j": p.effective_j,
                                  "chosen": p is chosen_point}
        if args.plans == "all" or p is chosen_point:
            record["plan"] = plan_of(dag, p.choice, p.evaluation()).to_json()["plan"]
        out.append(record)
    write_json_atomic(args.out, out, indent=None)
    saved = chosen.savings * 100
    print(f"frontier of {label}: {len(points)} points ({len(kept)} written to {args.out}, clock plans: "
          f"{args.plans}); T_min "
          f"{points[0].time_s:.4f} s, T* {points[-1].time_s:.4f} s; all clocks max: {all_max.time_s:.4f} s, "
          f"{si(all_max.energy_j, 'J')}; unit time {unit:.3g} s")
    print(f"chosen (straggler {args.straggler:g}): {chosen_point.time_s:.4f} s computing, iteration "
          f"{chosen.t_prime_s:.4f} s, {si(chosen.energy_j, 'J')} ({saved:.1f}% less than all clocks max); {note}")
    if args.plot:
        from ampe.viz import frontier_plot

        view = frontier_plot(args.plot, [(p.time_s, p.energy_j) for p in points], (chosen_point.time_s,
                             chosen_point.energy_j), (all_max.time_s, all_max.energy_j), f"Pipeline frontier: {label}",
                             f"{source.energy_kind} energy per iteration\n(waiting until its own end)")
        clipped = "" if not view.clipped else (
            f" (time axis {view.lo_s:.4g}-{view.hi_s:.4g} s: the energy stops falling at {view.energy_min_s:.4g} s; "
            f"beyond, up to T* {view.t_star_s:.4g} s, every point is slower and costs more; all points are in "
            f"{args.out})")
        print(f"plot: {args.plot}{clipped}")
    if args.timeline:
        from ampe.cli._common import draw_timeline

        draw_timeline(args.timeline, dag, chosen_point.choice, source.gpus,
                      f"Timeline of the chosen point: {label}\n{chosen_point.time_s:.4f} s, "
                      f"{si(chosen_point.energy_j, 'J')}")
    return 0


def _thin(points: list, limit: int | None, keep: Any) -> list:
    """At most ``limit`` points spread evenly in time; both ends and ``keep`` always stay."""
    if limit is None or len(points) <= limit:
        return points
    if limit < 3:
        raise InputError("--max-points", "", "must be ≥ 3 (both ends and the chosen point)")
    t0, t1 = points[0].time_s, points[-1].time_s
    picked = {0, len(points) - 1, points.index(keep)}
    for j in range(1, limit - 1):
        if len(picked) >= limit:
            break
        target = t0 + (t1 - t0) * j / (limit - 1)
        picked.add(min(range(len(points)), key=lambda i: abs(points[i].time_s - target)))
    return [points[i] for i in sorted(picked)]
