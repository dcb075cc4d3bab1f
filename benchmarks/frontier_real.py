"""ampe's frontier on Perseus's real per-clock profiles against Perseus's published frontiers.

For every shipped profile (``../shared/data/perseus/stage_profile``, Apache-2.0, Perseus SOSP'24 artifact) and
micro-batch count with a published frontier: ampe plans in Perseus's accounting (times floored to its τ, read off
the published file's time step; its blocking power per GPU) and prints T_min against Perseus's, the worst and mean
energy excess over Perseus's points (ampe's cheapest point not slower, both waiting until that time), and seconds.
It also prints ampe's T_min in measured time (every computation at its fastest option, unfloored), and then the
DVFS fit table of ``benchmarks/dvfs_fit.py`` (skip it with ``--no-dvfs``).

Prints figures; never fails on speed. Usage: ``python benchmarks/frontier_real.py [--data DIR] [--only a100_sxm]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from ampe.energy.pipeline_dag import build_dag
from ampe.energy.profile_csv import load_instruction_profile
from ampe.tradeoff.evaluate import evaluate_choice, fastest_choice
from ampe.tradeoff.frontier import trace_frontier
from tests.support.published_frontier import load_published_frontier, match

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "perseus"
P_BLOCK = {"a100_sxm": 83.64, "a40": 70.38}  # W per GPU, Perseus's settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=SHARED if SHARED.exists() else
                    Path(__file__).resolve().parent.parent / "tests" / "data" / "perseus",
                    help="folder with stage_profile/ and frontier/ (default: the shared data, else the test copy)")
    ap.add_argument("--only", default=None, help="only this GPU folder (a100_sxm or a40)")
    ap.add_argument("--no-dvfs", action="store_true", help="do not print the DVFS fit table afterwards")
    args = ap.parse_args()
    print(f"== ampe vs Perseus's published frontiers ({args.data})")
    print(f"{'profile':>24} {'M':>3} {'tau':>6} {'T_min ampe':>10} {'Perseus':>8} {'diff %':>7} {'worst %':>8} "
          f"{'mean %':>7} {'unmatched':>9} {'points':>7} {'seconds':>8} {'measured T_min':>14}")
    worst_all = -1.0
    for path in sorted((args.data / "frontier").glob("*/*.csv")):
        gpu = path.parent.name
        if args.only and gpu != args.only:
            continue
        model, mb = path.stem.split("_bf16_mb")
        published = load_published_frontier(path)
        unit = published.unit_s
        raw = load_instruction_profile(args.data / "stage_profile" / f"{model}+{gpu}_bf16.csv")
        watts = P_BLOCK[gpu]
        t0 = time.perf_counter()
        profile = raw.floored(unit)
        dag = build_dag(profile.stage_specs(), int(mb), blocking_w=[watts * g for g in profile.gpus_per_stage])
        points = trace_frontier(dag, unit).points()
        seconds = time.perf_counter() - t0
        m = match([p.time_s for p in points], [p.effective_j for p in points], sum(dag.blocking_w), published)
        real = build_dag(raw.stage_specs(), int(mb), blocking_w=[watts * g for g in raw.gpus_per_stage])
        measured = evaluate_choice(real, fastest_choice(real)).time_s
        worst_all = max(worst_all, m.worst_excess)
        print(f"{model + '+' + gpu:>24} {mb:>3} {unit * 1e3:>4.1f}ms {points[0].time_s:>10.4f} "
              f"{published.t_min_s:>8.4f} {100 * m.t_min_excess:>+7.3f} {100 * m.worst_excess:>+8.3f} "
              f"{100 * m.mean_excess:>+7.3f} {m.unmatched:>9} {len(points):>7} {seconds:>8.2f} {measured:>14.4f}",
              flush=True)
    print(f"   worst energy excess over all files: {100 * worst_all:+.3f}% (target <= +0.5%; T_min target <= "
          "+0.05%)")
    print("   diff % = ampe T_min / Perseus T_min - 1; worst/mean % = ampe energy / Perseus energy - 1 at Perseus's "
          "points (negative: ampe cheaper);\n   seconds = floor + DAG + whole frontier (trace and realization); "
          "measured T_min = all fastest options, real (unfloored) times")
    if not args.no_dvfs:
        from benchmarks.dvfs_fit import main as dvfs_fit_table

        print("\n== DVFS model fitted to the shipped clock sweeps (benchmarks/dvfs_fit.py)")
        dvfs_fit_table()


if __name__ == "__main__":
    main()
