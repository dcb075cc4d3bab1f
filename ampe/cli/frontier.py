"""``ampe frontier``: the iteration time–energy Pareto frontier of one pipeline from a Perseus/Zeus profile CSV.

Writes a JSON list of points ``{"time_s", "energy_j", "effective_energy_j", "chosen", "plan"}`` (fastest first),
where ``plan`` is per stage ``[[instruction, microbatch, mhz], ...]`` in execution order (see docs/energy.md).
"""

from __future__ import annotations

import argparse
import math
from typing import Any

from ampe.cli._common import positive_float, positive_int
from ampe.errors import InputError
from ampe.io import write_json_atomic


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``frontier`` subcommand."""
    p = sub.add_parser(
        "frontier", help="time-energy Pareto frontier of per-computation GPU clocks (Perseus) from a profile CSV",
        description="Trace the iteration time-energy frontier of one pipeline over per-forward/backward SM clocks "
                    "(Phillips-Dessouky min cuts, Perseus) from a measured stage,instruction,frequency,time,energy "
                    "profile, and write every point with its frequency plan.")
    p.add_argument("--profile", required=True, metavar="PERSEUS.csv",
                   help="zeus/Perseus instruction profile: stage,instruction,frequency,time,energy (+ rank columns)")
    p.add_argument("--stages", required=True, type=positive_int, metavar="S", help="pipeline stages in the profile")
    p.add_argument("--microbatches", required=True, type=positive_int, metavar="M", help="micro-batches per iteration")
    p.add_argument("--schedule", choices=("1f1b", "gpipe"), default="1f1b", help="pipeline schedule (default 1f1b)")
    p.add_argument("--p2p-power", type=_non_negative_float, default=70.0, metavar="W",
                   help="GPU power while blocked on communication, per GPU (default 70 W, the Perseus repo value)")
    p.add_argument("--unit-time", type=positive_float, default=1e-3, metavar="SEC",
                   help="time quantum tau of the frontier (default 0.001 s)")
    p.add_argument("--straggler", type=_factor, default=1.0, metavar="K",
                   help="the chosen point runs at min(T*, K*T_min) (default 1: no straggler, T_min)")
    p.add_argument("--max-points", type=positive_int, default=None, metavar="N",
                   help="write at most N points, evenly spread in time (default: all)")
    p.add_argument("--no-polish", action="store_true",
                   help="write PD's plans mapped to clocks as they are (no deadline fitting, free-float polish "
                        "or fill down to the all-max time)")
    p.add_argument("--out", required=True, metavar="F.json", help="frontier JSON to write")
    p.add_argument("--plot", metavar="F.png", help="also plot time vs energy (PNG), chosen point marked")
    p.set_defaults(func=run)


def _non_negative_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (v >= 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError(f"must be a finite number ≥ 0, got {text}")
    return v


def _factor(text: str) -> float:
    v = positive_float(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be ≥ 1, got {text}")
    return v


def run(args: argparse.Namespace) -> int:
    from ampe.energy.bloat import PipelineFrontier, plan_replicas
    from ampe.energy.dag import build_dag
    from ampe.energy.evaluate import evaluate, fastest_choice
    from ampe.energy.frontier import trace_frontier
    from ampe.energy.plan import plan_of
    from ampe.energy.profile_csv import load_instruction_profile

    profile = load_instruction_profile(args.profile, args.stages)
    dag = build_dag(profile.stage_specs(), args.microbatches, schedule=args.schedule,
                    blocking_w=[args.p2p_power * g for g in profile.gpus_per_stage])
    frontier = trace_frontier(dag, args.unit_time)
    points = frontier.points(polish=not args.no_polish)
    all_max = evaluate(dag, fastest_choice(dag), frontier.table)
    pf = PipelineFrontier(tuple(points), frontier.table.total_blocking_w, all_max)
    chosen = plan_replicas([pf], args.straggler)
    chosen_point = chosen.points[0]
    kept = _thin(points, args.max_points, chosen_point)
    out: list[dict[str, Any]] = []
    for p in kept:
        record = plan_of(dag, p.choice, p.evaluation()).to_json()
        record["chosen"] = p is chosen_point
        out.append({k: record[k] for k in ("time_s", "energy_j", "effective_energy_j", "chosen", "plan")})
    write_json_atomic(args.out, out, indent=None)
    saved = chosen.savings * 100
    print(f"frontier: {len(points)} points ({len(kept)} written to {args.out}); T_min {points[0].time_s:.4f} s, "
          f"T* {points[-1].time_s:.4f} s; all clocks max: {all_max.time_s:.4f} s, {all_max.energy_j:.1f} J")
    print(f"chosen (straggler {args.straggler:g}): {chosen_point.time_s:.4f} s computing, iteration "
          f"{chosen.t_prime_s:.4f} s, {chosen.energy_j:.1f} J ({saved:.1f}% less than all clocks max); "
          f"energies from the measured profile, blocking power {args.p2p_power:g} W per GPU")
    if args.plot:
        _plot(args.plot, points, chosen_point, all_max, args.stages, args.microbatches)
        print(f"plot: {args.plot}")
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


def _plot(path: str, points: list, chosen: Any, all_max: Any, stages: int, microbatches: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    ax.plot([p.time_s for p in points], [p.energy_j for p in points], ".-", ms=3, lw=1, label="frontier (ampe)")
    ax.plot([all_max.time_s], [all_max.energy_j], "s", color="tab:gray", label="all clocks max")
    ax.plot([chosen.time_s], [chosen.energy_j], "*", ms=14, color="tab:red", label="chosen point")
    ax.set_xlabel("iteration time (s)")
    ax.set_ylabel("energy per iteration (J)")
    ax.set_title(f"Pipeline frontier: {stages} stages × {microbatches} micro-batches")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
