"""Search scaling (issue: strategy search) and the gain of heterogeneity-aware search.

Part 1 — search time on N×N clusters (N nodes × N GPUs), GPT-2 24×1024 (gpt2-amp), gbs 32, exact DP, beside AMP's
Table 2 (58.0 / 325.6 / 890.3 / 1627.4 s for 2×2 … 16×16). Homogeneous = T4 nodes (AMP's g4dn); mixed = half p3
(V100) nodes, half g4dn (T4) nodes with AMP's het-cluster bandwidths.

Part 2 — predicted iteration time, under ampe's own cost model, of ampe's best, the Megatron heuristic's best and
AMP-compat's best, on the bundled specs.

Run: .venv/bin/python benchmarks/search_scaling.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import load_model
from ampe.costmodel.profile import load_profile
from ampe.search.baselines import megatron_candidates
from ampe.search.engine import SearchOptions, search

AMP_TABLE2 = {2: 58.0, 4: 325.6, 8: 890.3, 16: 1627.4}
PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"


def square(n: int, mixed: bool):
    if not mixed:
        nodes = [{"name": "g4", "gpu": "T4", "count": n, "intra_gbps": 50, "inter_gbps": 50, "repeat": n}]
    else:
        half = max(1, n // 2)
        nodes = [{"name": "p3", "gpu": "V100-16GB", "count": n, "intra_gbps": 170, "inter_gbps": 10, "repeat": half},
                 {"name": "g4", "gpu": "T4", "count": n, "intra_gbps": 50, "inter_gbps": 50, "repeat": n - half}]
    return cluster_from_dict({"name": f"{'mixed' if mixed else 'homog'}-{n}x{n}", "nodes": nodes})


def part1(sizes: list[int]) -> None:
    model, prof = load_model("gpt2-amp"), load_profile(PROFILE)
    print("Part 1: search time, GPT-2 24x1024 (gpt2-amp), gbs 32, exact DP, AMP profile, 1 job")
    print(f"{'cluster':>8} {'GPUs':>5} | {'homog s':>8} {'cands':>6} {'pruned':>6} | {'mixed s':>8} {'cands':>6} "
          f"{'pruned':>6} | {'AMP Table 2 s':>13} {'speed-up':>9}")
    prev = None
    for n in sizes:
        row = []
        for mixed in (False, True):
            c = square(n, mixed)
            t0 = time.perf_counter()
            res = search(c, model, prof, SearchOptions(gbs=32))
            row.append((time.perf_counter() - t0, res.candidates, res.pruned_oom))
        amp = AMP_TABLE2.get(n)
        amp_s = f"{amp:13.1f} {amp / row[0][0]:8.0f}x" if amp else f"{'-':>13} {'-':>9}"
        print(f"{n:>4}x{n:<3} {n * n:>5} | {row[0][0]:8.2f} {row[0][1]:6d} {row[0][2]:6d} | {row[1][0]:8.2f} "
              f"{row[1][1]:6d} {row[1][2]:6d} | {amp_s}")
        if prev:
            print(f"{'':>15}   growth vs previous size: {row[0][0] / prev:.2f}x time for {4}x GPUs")
        prev = row[0][0]


def part2() -> None:
    print("\nPart 2: predicted s/iter under ampe's cost model (lower is better), gbs 32")
    print(f"{'spec':>18} {'model':>10} | {'ampe':>8} {'Megatron':>9} {'AMP-compat':>10} | {'vs Megatron':>11} "
          f"{'vs AMP':>7}")
    try:
        from ampe.search.amp_compat import amp_search
    except ImportError:  # pragma: no cover
        amp_search = None
    cases = [("amp-homogeneous", "gpt2-amp", True), ("amp-het-cluster", "gpt2-amp", True),
             ("amp-het-model", "transgan", True), ("mixed-a100-a40", "gpt3-1.3b", False),
             ("mixed-h100-a100", "gpt3-2.7b", False)]
    for spec, model_name, amp_ok in cases:
        cluster = load_cluster(ROOT / "cluster_specs" / f"{spec}.yaml")
        model = load_model(model_name)
        prof = load_profile(PROFILE) if amp_ok else None
        gbs = 64 if model_name == "transgan" else 32
        cm = CostModel(cluster, model, prof)
        best = search(cluster, model, prof, SearchOptions(gbs=gbs)).ranked[0].estimate.iteration_s
        mega = megatron_candidates(cm, gbs)
        mega_s = mega[0].iteration_s if mega else float("inf")
        amp_s = float("nan")
        if amp_search is not None and amp_ok:
            ranked = amp_search(cluster, model, prof, gbs)
            for cand in ranked:
                e = cm.estimate(cand.strategy)
                if e.fits:
                    amp_s = e.iteration_s
                    break
        print(f"{spec:>18} {model_name:>10} | {best:8.4f} {mega_s:9.4f} {amp_s:10.4f} | {mega_s / best:10.2f}x "
              f"{amp_s / best:6.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only 2x2 … 16x16")
    args = ap.parse_args()
    part1([2, 4, 8, 16] if args.quick else [2, 4, 8, 16, 32])
    part2()


if __name__ == "__main__":
    main()
