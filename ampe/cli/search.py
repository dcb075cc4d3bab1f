"""``ampe search``: rank parallel strategies for a cluster and model, write a plan JSON."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ampe.cli._common import add_inputs, gib, load_inputs, positive_int, print_table
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.model import Model
from ampe.errors import InputError
from ampe.io import write_json_atomic
from ampe.search.engine import SearchOptions, SearchResult, search
from ampe.search.placement import LAYOUTS, ORDERS, summary
from ampe.costmodel.strategy import SCHEDULES
from ampe.search.plan import build_plan, runtime_support, strategy_entry

JOBLIB_BACKENDS = ("loky", "threading", "multiprocessing", "dask", "ray")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("search", help="search parallel strategies and rank them",
                       description="Search pipeline/data/tensor degrees, micro-batch size, device placement and the "
                       "exact layer partition; rank by predicted iteration time; write a plan JSON.")
    add_inputs(p)
    p.add_argument("--global-batch", type=positive_int, default=32, metavar="N", help="global batch (default 32)")
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K", help="strategies to print/write (10)")
    p.add_argument("--jobs", type=positive_int, default=1, metavar="J", help="parallel workers via joblib (1)")
    p.add_argument("--joblib-backend", choices=JOBLIB_BACKENDS, default=None,
                   help="joblib backend (default: joblib's active one, loky); dask/ray need their packages and a "
                   "registered backend")
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
    p.add_argument("--method", choices=("eq5", "simulate"), default="eq5",
                   help="pipeline time used to rank: Eq. 5 (default) or the schedule simulation")
    p.add_argument("--schedules", default="1f1b", metavar="LIST",
                   help="pipeline schedules to search: any of 1f1b,gpipe,interleaved (default 1f1b)")
    p.add_argument("--frozen-layers", type=int, default=0, metavar="N",
                   help="freeze the first N layers (forward only; FreezePipe) and plan for that")
    p.set_defaults(func=run)


def _names(text: str, allowed: tuple[str, ...], flag: str) -> tuple[str, ...]:
    vals = tuple(x.strip() for x in text.split(",") if x.strip())
    bad = [v for v in vals if v not in allowed]
    if bad or not vals:
        raise InputError(flag, "", f"unknown value {bad[0] if bad else text!r} (choose from {', '.join(allowed)})")
    return vals


def _progress():
    """A rich progress callback on stderr when it is a terminal; nothing otherwise."""
    if not sys.stderr.isatty():
        return None, None
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    prog = Progress(TextColumn("searching"), BarColumn(), TextColumn("{task.completed}/{task.total} groups"),
                    TimeElapsedColumn(), transient=True, console=__import__("rich.console").console.Console(
                        file=sys.stderr))
    task = prog.add_task("search", total=None)

    def update(done: int, total: int) -> None:
        prog.update(task, completed=done, total=total)

    return prog, update


def run(args: argparse.Namespace) -> int:
    cluster, model, profile = load_inputs(args)
    if args.local_search < 0:
        raise InputError("--local-search", "", "must be ≥ 0")
    schedules = _names(args.schedules, SCHEDULES, "--schedules")
    if not 0 <= args.frozen_layers < model.num_layers:
        raise InputError("--frozen-layers", "", f"must be in 0..{model.num_layers - 1} for {model.name}")
    if args.frozen_layers:
        model = model.with_frozen_prefix(args.frozen_layers)
    if args.cost_model == "amp":
        from ampe.cli._amp import run_amp

        return run_amp(args, cluster, model, profile)
    opts = SearchOptions(gbs=args.global_batch, top_k=args.top_k, jobs=args.jobs,
                         allow_cross_node_tp=args.allow_cross_node_tp,
                         orders=_names(args.orders, ORDERS, "--orders"),
                         layouts=_names(args.layouts, LAYOUTS, "--layouts"),
                         local_search=args.local_search, method=args.method, joblib_backend=args.joblib_backend,
                         schedules=schedules)
    prog, update = _progress()
    if prog:
        with prog:
            result = search(cluster, model, profile, opts, update)
    else:
        result = search(cluster, model, profile, opts)
    if not result.ranked:
        examples = "; ".join(result.oom_examples)
        raise InputError(args.cluster, "", f"no strategy fits in memory: all {result.candidates} candidates were "
                         f"pruned (e.g. {examples}); try a larger cluster, a smaller --global-batch or model")
    top = result.ranked[: args.top_k]
    entries = [strategy_entry(i + 1, c.estimate, model.dtype, c.placement_name,
                              summary(cluster, c.strategy.placement, c.strategy.pp, c.strategy.dp, c.strategy.tp),
                              {"runtime": runtime_support(c.strategy), "frozen_layers": args.frozen_layers})
               for i, c in enumerate(top)]
    _print(cluster, model, result, entries)
    if args.out:
        write_json_atomic(args.out, build_plan(cluster, model, args.global_batch, entries, _stats(result, args),
                                               _inputs(args)))
        print(f"plan written to {args.out}")
    return 0


def _stats(result: SearchResult, args: argparse.Namespace) -> dict[str, Any]:
    return {"candidates": result.candidates, "pruned_oom": result.pruned_oom, "seconds": round(result.seconds, 3),
            "degrees": result.degrees, "jobs": args.jobs, "method": args.method, "cost_model": args.cost_model}


def _inputs(args: argparse.Namespace) -> dict[str, Any]:
    return {"cluster_spec": args.cluster, "model": args.model, "profile": args.profile,
            "cost_model": args.cost_model, "frozen_layers": args.frozen_layers, "schedules": args.schedules}


def _print(cluster: Cluster, model: Model, result: SearchResult, entries: list[dict[str, Any]]) -> None:
    rows = []
    for e in entries:
        pr = e["predicted"]
        sched = "" if e["schedule"] == "1f1b" else f" {e['schedule']}"
        rows.append([e["rank"], f"{e['pp']}/{e['dp']}/{e['tp']}{sched}", e["mbs"], e["placement_summary"],
                     e["partition"], f"{pr['iteration_s']:.4f}", f"{pr['samples_per_s']:.2f}",
                     gib(pr["max_memory_bytes"])])
    print_table(f"ampe search: {model.name} on {cluster.name} ({cluster.size} devices) — {result.candidates} "
                f"candidates, {result.pruned_oom} pruned (out of memory), {result.seconds:.2f} s",
                ["rank", "pp/dp/tp", "mbs", "placement (GPU types per stage)", "partition", "s/iter", "samples/s",
                 "peak GiB/device"], rows)
