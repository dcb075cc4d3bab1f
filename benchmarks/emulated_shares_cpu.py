"""Uneven data-parallel shares on an emulated mix of speeds (issue 34 item 5), real CPU trials.

``cluster_specs/local-cpu-mixed.yaml`` is one `cpu` core and one `cpu-half` core (half the peak FLOP/s and memory
bandwidth); with ``--emulate-speed`` the rank on the `cpu-half` device stretches every forward and backward to twice
its real duration (:func:`ampe.costmodel.catalog.emulated_slowdowns`). A plan of gpt2-tiny at pp 1 × dp 2 × tp 1,
mbs 1, holds the equal shares 3:3 and the uneven 4:2 (the fast replica takes the slow one's micro-batch); each
round runs both as trials (``ampe.trials.runner.run_trials``, torchrun, no frequency plan) and prints per strategy
the median and fastest iteration time, each replica's own time (until it reached the gradient all-reduce) and the
speed-up of 4:2 over 3:3, measured against ``CostModel.estimate``'s.

The machine is shared (2 cores): rounds alternate the two strategies so a drift of the machine's speed hits both, and
each round's figures are printed with the cores other processes kept busy meanwhile. Each round also runs one trial
whose iterations alternate 4:2 and 3:3 (job ``alternate_shares``; what the CI test measures): neighbouring iterations
see the same machine; for it each rank's iteration is broken down (:func:`breakdown`: compute, run-queue wait,
stretch, all-reduce; docs/trials.md, "Where the time goes").

Run: ``.venv/bin/python benchmarks/emulated_shares_cpu.py [--rounds 3] [--iters 8] [--alternating-only]
[--out runs/emulated-shares]``
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy, with_shares
from ampe.costmodel.training import deepspeed_config
from ampe.costmodel.zoo import load_model
from ampe.formats.trial import TrialResult
from ampe.trials.launch import job_dict
from ampe.trials.prepare import TrialOptions, prepare
from ampe.trials.runner import run_trials

SPEC = ROOT / "cluster_specs" / "local-cpu-mixed.yaml"
MODEL = "gpt2-tiny"
EQUAL, UNEVEN = (3, 3), (4, 2)


def shares_strategy(shares: tuple[int, ...]) -> Strategy:
    """pp 1 × dp 2 × tp 1, mbs 1, replica r on device r with ``shares[r]`` micro-batches."""
    return with_shares(Strategy(pp=1, dp=len(shares), tp=1, mbs=1, gbs=sum(shares),
                                placement=tuple(range(len(shares)))), shares)


@functools.cache
def predicted(shares: tuple[int, ...]) -> float:
    """``CostModel.estimate``'s iteration time of :func:`shares_strategy` on the emulated mix, seconds."""
    return CostModel(load_cluster(SPEC), load_model(MODEL)).estimate(shares_strategy(shares)).iteration_s


def write_plan(path: Path, order: tuple[tuple[int, ...], ...]) -> Path:
    """A plan file whose strategies are :func:`shares_strategy` of each of ``order`` (ranks in that order)."""
    layers = load_model(MODEL).num_layers
    entries = []
    for rank, shares in enumerate(order, start=1):
        s = shares_strategy(shares)
        t = predicted(shares)
        entries.append({"rank": rank, **s.to_dict(), "partition": [0, layers],
                        "predicted": {"iteration_s": t, "samples_per_s": s.gbs / t, "max_memory_bytes": 1,
                                      "memory_bytes_per_stage": [1], "fits": True},
                        "deepspeed": deepspeed_config(s, "fp32")})
    doc = {"schema": "ampe.plan/1", "cluster": "local-cpu-mixed", "model": MODEL, "global_batch": sum(order[0]),
           "inputs": {"cluster_spec": str(SPEC), "model": MODEL, "profile": None},
           "search": {"candidates": len(entries), "pruned_oom": 0, "seconds": 0.0}, "strategies": entries}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1))
    return path


def run_pair(out: Path, order: tuple[tuple[int, ...], ...], warmup: int, iters: int) -> dict[tuple, TrialResult]:
    """Both strategies as trials with emulated speeds, in ``order``; shares → result."""
    results = run_trials(write_plan(out / "plan.json", order),
                         TrialOptions(out_dir=out / "runs", top_k=len(order), warmup_iters=warmup, timed_iters=iters,
                                      launcher="torchrun", freq_backend="none", emulate_speed=True))
    return {r.shares: r for r in results}


def run_alternating(out: Path, warmup: int, iters: int) -> dict[str, Any]:
    """One trial on the emulated mix whose iterations alternate between :data:`UNEVEN` (even) and :data:`EQUAL` (odd)
    shares (job ``alternate_shares``): the job the runner writes for the uneven strategy with ``--emulate-speed``
    (its speed ratios), run by ampe's worker under torchrun. Returns ``result.json`` with each rank's report."""
    from tests.support.worker_runs import launch

    ctx, (trial,), _ = prepare(write_plan(out / "plan.json", (UNEVEN,)),
                               TrialOptions(out_dir=out / "runs", warmup_iters=warmup, timed_iters=iters,
                                            freq_backend="none", emulate_speed=True))
    job = {**job_dict(ctx, trial, out), "alternate_shares": list(EQUAL)}
    proc = launch(out, job.pop("strategy"), **job)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    result = json.loads((out / "result.json").read_text())
    result["ranks"] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return result


def alternating_speed_up(result: dict[str, Any]) -> float:
    """Equal-share over uneven-share iteration time of an alternating trial: the medians of its odd and even
    timed iterations (each the slowest rank's)."""
    times = result["iteration_s"]
    return statistics.median(times[1::2]) / statistics.median(times[0::2])


def _median_of(values: list[Any], rows: list[int]) -> float:
    return statistics.median(float(values[i] or 0.0) for i in rows)


def breakdown(rank: dict[str, Any]) -> dict[int, dict[str, float]]:
    """One rank of an alternating trial, per share it ran (micro-batches): the medians over its timed iterations,
    in seconds, of ``own`` (until the gradient all-reduce), ``compute`` (its forward/backward, the real part),
    ``waited`` (of it, the run-queue wait: its core ran other processes), ``stretch`` (the emulated slowdown's
    sleep), ``rest`` (own − compute − stretch: loading micro-batches, the schedule) and ``after`` (all-reduce,
    optimizer, waiting for the other replica), and ``on_core_per_mb`` ((compute − waited) / share)."""
    share = [v[rank["replica"]] for v in rank["shares_per_iter"]]
    stretch = (rank["emulated"] or {}).get("stretch_s_per_iter") or [0.0] * len(share)
    out = {}
    for g in sorted(set(share)):
        rows = [i for i, v in enumerate(share) if v == g]
        med = functools.partial(_median_of, rows=rows)
        compute = [c - x for c, x in zip(rank["compute_s_per_iter"], stretch, strict=True)]
        after = [t - (o or 0.0) for t, o in zip(rank["iteration_s"], rank["own_s"], strict=True)]
        fig = {"own": med(rank["own_s"]), "compute": med(compute), "waited": med(rank["compute_waited_s_per_iter"]),
               "stretch": med(stretch), "after": med(after)}
        fig["rest"] = fig["own"] - fig["compute"] - fig["stretch"]
        fig["on_core_per_mb"] = (fig["compute"] - fig["waited"]) / g
        out[g] = fig
    return out


def print_breakdown(result: dict[str, Any]) -> None:
    """Each rank's :func:`breakdown` of an alternating trial, one line per rank and share."""
    for rank in result["ranks"]:
        for g, fig in breakdown(rank).items():
            print(f"  rank {rank['rank']} (speed ratio {rank['speed_ratio']:g}), {g} micro-batches: "
                  + ", ".join(f"{k} {v:.3f}" for k, v in fig.items()) + " s")


def separate_round(out: Path, k: int, warmup: int, iters: int, want: float) -> float:
    """Round ``k``'s two separate trials (the order alternating with ``k``), printed; the speed-up of their medians."""
    order = (EQUAL, UNEVEN) if k % 2 == 0 else (UNEVEN, EQUAL)
    got = run_pair(out / f"round{k}", order, warmup, iters)
    for shares in (EQUAL, UNEVEN):
        r = got[shares]
        own = [round(statistics.median(t for t in per if t is not None), 4) for per in r.worker["replica_own_s"]]
        print(f"round {k} shares {shares}: {r.status}, median {statistics.median(r.iteration_s):.4f} s, fastest "
              f"{min(r.iteration_s):.4f} s, own time "
              f"per replica {own} s, other cores busy {r.worker.get('host_other_cores')}")
    ratio = statistics.median(got[EQUAL].iteration_s) / statistics.median(got[UNEVEN].iteration_s)
    least = min(got[EQUAL].iteration_s) / min(got[UNEVEN].iteration_s)
    print(f"round {k}: separate trials' speed-up {ratio:.3f} of the medians, {least:.3f} of the fastest iterations "
          f"(predicted {want:.3f}: {100 * (ratio / want - 1):+.1f} %, {100 * (least / want - 1):+.1f} %)")
    return ratio


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "emulated-shares")
    p.add_argument("--alternating-only", action="store_true", help="per round only the trial alternating shares")
    args = p.parse_args()
    want = predicted(EQUAL) / predicted(UNEVEN)
    print(f"predicted: {EQUAL} {predicted(EQUAL):.4f} s, {UNEVEN} {predicted(UNEVEN):.4f} s, speed-up {want:.3f}")
    separate, alternating = [], []
    for k in range(args.rounds):
        if not args.alternating_only:
            separate.append(separate_round(args.out, k, args.warmup, args.iters, want))
        alt = run_alternating(args.out / f"round{k}" / "alternating", args.warmup, 2 * args.iters)
        alternating.append(alternating_speed_up(alt))
        print(f"round {k}: one trial alternating {UNEVEN}/{EQUAL}: speed-up {alternating[-1]:.3f} "
              f"({100 * (alternating[-1] / want - 1):+.1f} %), other cores busy {alt.get('host_other_cores')}, "
              f"load average {os.getloadavg()[0]:.1f}")
        print_breakdown(alt)
    if separate:
        print(f"over {len(separate)} rounds, separate trials: median speed-up {statistics.median(separate):.3f}")
    within = sum(abs(a / want - 1) <= 0.10 for a in alternating)
    print(f"over {len(alternating)} alternating trials: speed-up median {statistics.median(alternating):.3f}, "
          f"{min(alternating):.3f}-{max(alternating):.3f}, {within} within 10 % of the predicted {want:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
