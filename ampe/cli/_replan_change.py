"""``ampe replan --without/--add/--slow``: parse the change, call
:func:`ampe.change_planning.replan_after_change`, print what moves and what it costs, write the new plan and cluster
spec (docs/replan.md)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from ampe.cli._common import calibration_sidecar, print_table
from ampe.cli._paths import check_not_input
from ampe.cli._planio import (
    check_devices,
    check_outputs_over_plan,
    load_plan_inputs,
    plan_profile_path,
    spec_path,
    strategy_at_rank,
    write_plan,
)
from ampe.costmodel.cluster import Cluster
from ampe.costmodel.cluster_change import ClusterChange, parse_slow, parse_without
from ampe.costmodel.plan_entry import entry_frozen
from ampe.costmodel.strategy import Strategy
from ampe.errors import InputError
from ampe.formats.plan import PlanInputs, Predicted, ReplannedFrom
from ampe.formats.plan_inputs import absolute_inputs
from ampe.io import check_output_path, read_yaml, write_text_atomic
from ampe.search.cluster_replan import layer_stages
from ampe.units import money, si

MOVES_SHOWN = 12  # rank moves listed one per line; the rest are counted


def run_change(args: argparse.Namespace) -> int:
    cpu0 = time.process_time()
    from ampe.change_planning import ChangeReplanRequest, replan_after_change

    change = ClusterChange(parse_without(args.without) if args.without is not None else (), args.add,
                           parse_slow(args.slow) if args.slow is not None else ())
    cluster_out = args.cluster_out or (str(Path(args.out).with_suffix("")) + ".cluster.yaml" if args.out else None)
    if args.out:
        check_output_path(args.out)
    if cluster_out:
        check_output_path(cluster_out, "--cluster-out")
    doc, old_cluster, model, profile = load_plan_inputs(args.plan)
    check_outputs_over_plan(args, doc, args.plan, (("--cluster-out", cluster_out),) if cluster_out else ())
    for flag, name in (("--out", args.out), ("--cluster-out", cluster_out)):
        if name:
            check_not_input(flag, name, [("--plan", args.plan), ("--add", args.add or "")])
    check_devices(doc, args.plan, old_cluster)
    raw = read_yaml(spec_path(doc, args.plan))
    old = strategy_at_rank(doc, args.plan, args.rank, old_cluster, model)
    entry = next(e for e in doc.strategies if e.rank == args.rank)
    frozen = entry_frozen(doc, entry)
    trained = model.with_frozen_prefix(frozen) if frozen else model
    objective = args.objective or doc.inputs.objective or "time"
    if objective == "time" and args.max_slowdown is not None:
        raise InputError("--max-slowdown", "", "applies to --objective energy, edp, cost or carbon (time keeps the "
                         "fastest candidate)")
    inputs = {**absolute_inputs(doc.inputs.model_dump(exclude_unset=True), args.plan),
              "cluster_spec": cluster_out or "(not written)",
              "calibration": calibration_sidecar(plan_profile_path(doc, args.plan), profile), "objective": objective}
    inputs.pop("frozen_layers", None)  # the prefix the re-plan is costed with: the entry's (below), not the old plan's
    if frozen:
        inputs["frozen_layers"] = frozen
    stats = doc.search.edited(replanned_from=ReplannedFrom(
        plan=args.plan, rank=args.rank, without=list(change.without), add=change.add,
        slow={ref: f for ref, f in change.slow}, objective=objective))
    from ampe.cli._diagnostics import diagnostics

    with diagnostics(print):  # the re-plan's notes on stdout, before its tables
        r = replan_after_change(ChangeReplanRequest(old_cluster, raw, trained, profile, old, change,
                                                    PlanInputs.model_validate(inputs), stats,
                                                    entry.predicted.energy_j, args.energy_planner, args.search,
                                                    args.top_k, frozen or None, objective=objective,
                                                    max_slowdown=args.max_slowdown))
    cpu = time.process_time() - cpu0
    by = "--objective" if args.objective else "the plan's objective" if doc.inputs.objective else "the default"
    _print(args, r, old_cluster, old, cpu, _cost_of(entry.predicted), by)
    if args.out and cluster_out:
        write_text_atomic(cluster_out, _spec_yaml(r.spec, args.plan, change))
        write_plan(args.out, r.plan.to_json())
        print(f"cluster spec as it now is written to {cluster_out}; plan written to {args.out}")
    return 0


def _spec_yaml(spec: dict[str, Any], plan: str, change: ClusterChange) -> str:
    import yaml

    what = "; ".join(x for x in (f"without {','.join(change.without)}" if change.without else "",
                                 f"add {change.add}" if change.add else "",
                                 "slow " + ",".join(f"{k}={v:g}" for k, v in change.slow) if change.slow else "")
                     if x)
    return (f"# The cluster as it now is: written by `ampe replan --plan {plan}` ({what}).\n"
            "# `down:` lists nodes and node:index devices that are out; `stragglers:` compute-time factors.\n"
            + yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))


def _where(cluster: Cluster, dev: int) -> str:
    d = cluster.devices[dev]
    return f"{d.node}:{d.local_index}"


def _cost_of(predicted: Predicted) -> tuple[float, str] | None:
    """(money per iteration, currency) of a plan entry's ``predicted.cost``, when the spec had prices."""
    cost = predicted.cost
    if cost is None or cost.per_iteration is None:
        return None
    return cost.per_iteration, cost.currency


def _cost_line(args: argparse.Namespace, priced: bool, old: tuple[float, str] | None,
               new: tuple[float, str] | None) -> str:
    if new is None:
        if priced and args.energy_planner == "none":
            return "cost: not planned (--energy-planner none: the electricity needs the energy)"
        return "cost: not shown (the cluster spec has no prices)"
    if old is None or old[1] != new[1]:
        return f"cost: {new[0]:.4g} {new[1]}/iter (the old plan has no cost figure to compare)"
    return f"cost: {old[0]:.4g} → {new[0]:.4g} {new[1]}/iter ({100 * (new[0] / old[0] - 1):+.1f} %)"


def _print(args: argparse.Namespace, r: Any, old_cluster: Cluster, old: Strategy, cpu_s: float,
           old_cost: tuple[float, str] | None, by: str) -> None:
    new_cluster: Cluster = r.cluster
    chosen = r.result.chosen
    s = chosen.strategy
    print(f"ampe replan: {old_cluster.name}, {old_cluster.size} → {new_cluster.size} devices "
          f"(strategy rank {args.rank}: pp/dp/tp {old.pp}/{old.dp}/{old.tp}, mbs {old.mbs}, "
          f"{r.old.iteration_s:.4f} s/iter before)")
    figure = r.objective != "time"
    shown = [o for i, o in enumerate(r.result.options) if i < 8 or o is chosen]
    rows = []
    for o in shown:
        t = o.strategy
        row = ["*" if o is chosen else "", o.how, f"{t.pp}/{t.dp}/{t.tp}", t.mbs, f"{o.estimate.iteration_s:.4f}",
               f"{100 * (o.estimate.iteration_s / r.old.iteration_s - 1):+.1f}%"]
        if figure:
            row.append(objective_figure(r.objective, r.scores[r.result.options.index(o)], new_cluster))
        rows.append([*row, o.change.ranks_moved, o.change.layers_moved])
    rule = (f"the least {r.objective} within 0.5 % of the least, the smallest change" if figure else
            "the smallest change within 0.5 % of the fastest")
    print_table(f"candidates (fastest first; * chosen: {rule}; {r.result.evaluated} costed, {r.result.skipped} "
                "ruled out by the bound)",
                ["", "how", "pp/dp/tp", "mbs", "s/iter", "vs before",
                 *([f"{r.objective}/iter"] if figure else []), "ranks moved", "layers moved"], rows)
    print(objective_line(r.objective, by, r.bound_s))
    _print_moves(old_cluster, new_cluster, old, s, chosen.change)
    dt = chosen.estimate.iteration_s / r.old.iteration_s - 1
    line = f"time: {r.old.iteration_s:.4f} → {chosen.estimate.iteration_s:.4f} s/iter ({100 * dt:+.1f} %)"
    planned_s = r.plan.strategies[0].predicted.plan_time_s
    if figure and planned_s is not None:
        line += f", {planned_s:.4f} s/iter at the chosen clocks"
    if r.old_energy_j and r.new_energy_j:
        line += (f"; energy: {si(r.old_energy_j, 'J')} → {si(r.new_energy_j, 'J')} per iteration "
                 f"({100 * (r.new_energy_j / r.old_energy_j - 1):+.1f} %, modelled)")
    elif args.energy_planner == "none":
        line += "; energy: not planned (--energy-planner none)"
    priced = getattr(r.cluster, "pricing", None) is not None
    print(line + "; " + _cost_line(args, priced, old_cost, _cost_of(r.plan.strategies[0].predicted)))
    print(f"re-planned in {r.result.cpu_seconds:.2f} CPU s ({r.result.seconds:.2f} s wall); energy planning "
          f"{r.energy_cpu_s:.2f} CPU s ({r.energy_s:.2f} s wall); {cpu_s:.2f} CPU s in all, from reading the plan")


def objective_figure(objective: str, value: float | None, cluster: Cluster) -> str:
    """A candidate's figure under ``objective`` (J, J·s, money or g CO2e per iteration), or that it is beyond the
    slowdown bound (None)."""
    if value is None:
        return "beyond bound"
    if objective == "cost":
        return f"{money(value)} {cluster.pricing.currency if cluster.pricing else ''}".strip()
    return si(value, {"energy": "J", "edp": "J·s", "carbon": "g CO2e"}[objective])


def objective_line(objective: str, by: str, bound_s: float | None = None) -> str:
    """What replan chose by and why that objective (``by``: "--objective", "the plan's objective", "the
    default"); for time, that it keeps the iteration time; otherwise what it minimised within which bound (s)."""
    if objective == "time":
        return (f"chosen by time ({by}): replan keeps the iteration time (and the fewest moves among near-ties)")
    what = {"energy": "energy", "edp": "energy × time", "cost": "money", "carbon": "CO2e"}[objective]
    within = f" within {bound_s:.4f} s/iter (the slowdown bound)" if bound_s is not None else ""
    return (f"chosen by {objective} ({by}): the least {what} per iteration{within}, each candidate at its best "
            "clocks (and the fewest moves among candidates within 0.5 % of the least)")


def _print_moves(old_cluster: Cluster, new_cluster: Cluster, old: Strategy, s: Strategy, change: Any) -> None:
    """Ranks that change device, hosts that gain or lose ranks, layers that change stage."""
    assert old.placement is not None and s.placement is not None
    moved = []
    for rank in change.moved:
        j, q, k = rank // (s.dp * s.tp), rank // s.tp % s.dp, rank % s.tp
        jo = change.stage_was[j]
        was = old.placement[jo * old.dp * old.tp + q * old.tp + k] if jo >= 0 and q < old.dp and k < old.tp else None
        src = _where(old_cluster, was) if was is not None else "(new rank)"
        role = f"old stage {jo}" if jo >= 0 else "a new stage"
        moved.append(f"  rank {rank} (stage {j}, replica {q}, shard {k}; {role}): {src} → "
                     f"{_where(new_cluster, s.placement[rank])}")
    gone = len(old.placement) - len(s.placement)
    print(f"moves: {len(moved)} of {len(s.placement)} ranks change device"
          + (f", {gone} fewer ranks" if gone > 0 else f", {-gone} more ranks" if gone < 0 else ""))
    for m in moved[:MOVES_SHOWN]:
        print(m)
    if len(moved) > MOVES_SHOWN:
        print(f"  … and {len(moved) - MOVES_SHOWN} more")
    before: dict[str, int] = {}
    after: dict[str, int] = {}
    for d in old.placement:
        before[old_cluster.devices[d].node] = before.get(old_cluster.devices[d].node, 0) + 1
    for d in s.placement:
        after[new_cluster.devices[d].node] = after.get(new_cluster.devices[d].node, 0) + 1
    diffs = [f"{n} {after.get(n, 0) - before.get(n, 0):+d}" + ("" if n in new_cluster.nodes else " (down)")
             for n in dict.fromkeys([*before, *after]) if after.get(n, 0) != before.get(n, 0)]
    print("hosts: " + (", ".join(diffs[:16]) + (f", … ({len(diffs)} in all)" if len(diffs) > 16 else "")
                       if diffs else "the same ranks per host"))
    print("layers: " + _layer_moves(layer_stages(old), layer_stages(s), change.stage_was))


def _layer_moves(old: tuple[int, ...], new: tuple[int, ...], was: tuple[int, ...]) -> str:
    """Runs of layers that move (``old``, ``new``: each layer's stage), e.g. ``30-31: old stage 3 → new stage 4
    (continues old 5)`` (new stage j continues old stage ``was[j]``); or that none does."""
    if not old or not new:
        return "unknown"
    runs: list[list[int]] = []  # [first, last, old stage, new stage]
    for layer, (a, b) in enumerate(zip(old, new, strict=True)):
        if a == was[b]:
            continue
        if runs and runs[-1][1] == layer - 1 and runs[-1][2:] == [a, b]:
            runs[-1][1] = layer
        else:
            runs.append([layer, layer, a, b])
    if not runs:
        return "none move" + ("" if max(old) == max(new) else f" ({max(old) + 1} → {max(new) + 1} stages: "
                              f"new stages continue old {', '.join(map(str, was))})")

    def cont(b: int) -> str:
        return f"continues old {was[b]}" if was[b] >= 0 else "a new stage"

    text = ", ".join(f"{f}{'' if f == l else f'-{l}'}: old stage {a} → new stage {b} ({cont(b)})"
                     for f, l, a, b in runs[:10])
    return text + (f", … ({len(runs)} runs)" if len(runs) > 10 else "")
