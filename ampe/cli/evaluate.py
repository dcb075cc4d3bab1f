"""``ampe evaluate``: cost one or more hand-written strategies (a JSON object, a list, or a plan file)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from ampe.cli._common import (
    add_inputs,
    calibration_note,
    fits_label,
    gib,
    global_batch,
    load_inputs,
    print_table,
    say_profile,
)
from ampe.cli._progress import PhaseProgress
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy, shares_label, strategies_from_json, validate
from ampe.errors import InputError
from ampe.formats.plan import plan_from_json
from ampe.io import read_json, write_json_atomic

MAX_STRATEGIES = 1000  # per file: 1 000 gpt2-tiny strategies cost and print in 2.5 s on two shared cores


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("evaluate", help="predict iteration time and memory of given strategies",
                       description="Predict iteration time, throughput, stage times and per-device memory of one or "
                       "more strategies: {pp, dp, tp, mbs, gbs?, partition?, placement?}.")
    add_inputs(p)
    p.add_argument("--strategy", required=True, metavar="S.json", help="one strategy, a list, or an ampe plan file")
    p.add_argument("--global-batch", type=global_batch, default=None, metavar="N",
                   help="global batch for strategies that give neither gbs nor gas")
    p.add_argument("--method", choices=("eq5", "simulate"), default="eq5",
                   help="pipeline time: AMP's Eq. 5 closed form or the schedule simulation (default eq5)")
    p.add_argument("--json", metavar="OUT.json", help="also write the results as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cluster, model, profile = load_inputs(args)
    say_profile(profile, model)
    note = calibration_note(args.profile, profile)
    if note:
        print(note)
    raw = read_json(args.strategy)
    if isinstance(raw, dict) and ("schema" in raw or "strategies" in raw):  # a plan file: every reader validates it
        plan_from_json(raw, args.strategy)
    nested = isinstance(raw, list) or (isinstance(raw, dict) and "strategies" in raw)
    label = "strategies" if isinstance(raw, dict) and "strategies" in raw else ""
    items = raw["strategies"] if label else raw if isinstance(raw, list) else [raw]
    if not isinstance(items, list) or not items:
        raise InputError(args.strategy, label or "(root)", "no strategies")
    if len(items) > MAX_STRATEGIES:  # before any is validated: 10 000 took over a minute and printed nothing
        raise InputError(args.strategy, label or "(root)", f"{len(items)} strategies; evaluate costs at most "
                         f"{MAX_STRATEGIES} at a time (split the file, or let `ampe search` explore a space that "
                         "large)")
    checked: list[Strategy] = []
    bad: list[InputError] = []
    for i, item in enumerate(items):  # every bad strategy is reported; the good ones are still costed
        try:
            s = strategies_from_json(item, args.strategy, args.global_batch)[0]
            if args.attention != "auto":  # the flag names the kernel: a strategy's own (a plan entry's) gives way
                s = replace(s, attention=None)
            checked.append(validate(s, cluster.size, model.num_layers, args.strategy))
        except InputError as e:
            field = f"{label}[{i}].{e.field}" if nested else e.field
            bad.append(InputError(args.strategy, field, e.message))
    if len(bad) == 1 and not checked:
        raise bad[0]
    for error in bad:
        sys.stderr.write(f"ampe evaluate: error: {error}\n")
    if not checked:
        return 2
    cm = CostModel(cluster, model, profile)
    results = []
    with PhaseProgress("ampe evaluate", "costing", "strategies") as progress:
        for s in checked:
            results.append(cm.estimate(s, args.method))
            progress.update(len(results), len(checked))
    rows = []
    saving = any(e.strategy.recompute != "none" or e.strategy.zero for e in results)  # the column only then
    for i, est in enumerate(results):
        s = est.strategy
        mem_opts = ", ".join(([f"recompute {s.recompute_label}"] if s.recompute != "none" else [])
                             + (["ZeRO-1"] if s.zero else [])) or "-"
        rows.append([
            i, f"{s.pp}/{s.dp}/{s.tp}", s.mbs, shares_label(s)] + ([mem_opts] if saving else []) + [
            list(s.partition or ()),
            f"{est.iteration_s:.4f}", f"{est.samples_per_s:.2f}",
            " ".join(f"{t:.4f}" for t in est.stage_times_s),
            " ".join(gib(m) for m in est.memory_bytes_per_stage),
            fits_label(est, why=True),
        ])
    print_table(f"ampe evaluate: {model.name} on {cluster.name} ({cluster.size} devices, compute from "
                f"{results[0].compute_source}, {args.method})",
                ["#", "pp/dp/tp", "mbs", "gas"] + (["memory options"] if saving else [])
                + ["partition", "s/iter", "samples/s", "stage s (fwd+bwd)", "GiB/stage", "fits"], rows)
    from ampe.search.defaults import stages_without_blocks

    for i, est in enumerate(results):
        attention, dtype = est.strategy.attention or model.attention, est.strategy.dtype or model.dtype
        precision = f"{dtype} with fp32 master weights and Adam states" if dtype != "fp32" else "fp32"
        print_table(f"#{i} memory per device by stage (GiB; the stage's fullest device: alloc. = its allocated peak, "
                    f"+ allocator fragmentation + context = its total footprint; {attention} attention, {precision})",
                    ["stage", "weights+grads+optimizer", "acts", "in flight", "buffers", "recompute",
                     "opt. step", "workspace", "alloc.", "frag.", "context", "total"],
                    [[j, gib(m.states), gib(m.activations), m.in_flight, gib(m.buffers + m.transient),
                      gib(m.recompute), gib(m.optimizer_step), gib(m.workspace), gib(m.allocated),
                      gib(m.fragmentation), gib(m.context), gib(m.total)]
                     for j, m in enumerate(est.memory_breakdown)])
        empty = stages_without_blocks(model, est.strategy.partition or ())
        if empty:
            sys.stderr.write(f"ampe evaluate: warning: #{i}: stage{'s' if len(empty) > 1 else ''} "
                             f"{', '.join(map(str, empty))} {'hold' if len(empty) > 1 else 'holds'} no "
                             "transformer block\n")
    if args.json:
        write_json_atomic(args.json, {"cluster": cluster.name, "model": model.name,
                                      "results": [e.to_dict() for e in results]})
    return 2 if bad else 0
