"""Energy planning at GPT-3 175B scale (issue 13: "32 × 768 plans in minutes, not hours, with memory that grows
linearly in the pipeline's computations").

GPT-3 175B (96 layers) on 256 mixed GPUs, global batch 1536 at micro-batch 2: 32 stages × tensor parallel 8, one
data-parallel replica, 768 micro-batches (the issue's best strategy). The same model at 8 × 192 and 16 × 384 shows
the growth. Stage k runs 96/N layers on 8 GPUs, the first half of the stages H100-80GB, the rest A100-80GB, with
forward seconds per layer at micro-batch 2 (A100: ≈12.2 ms: 2 · 6.1 ms of matmuls + TP all-reduces; H100 ≈ 0.45 of
it), the H100 stages given 2× the layers of the A100 ones so the stages are balanced (± 3 %), backward = 2 × forward,
2 ms P2P. Energies from the fitted DVFS model.

For each shape, in a fresh process (so its peak RSS is its own):

* time objective (``ampe search``'s default): the DAG, its option table, all-max, and the one point solved directly
  (:func:`ampe.tradeoff.direct.point_by`, the LP);
* energy objective: the same plus the Perseus frontier at τ = T_min / 1000 realized up to 5 % slowdown (what
  ``ampe search --objective energy`` does per strategy).

Prints CPU seconds (user + system) and peak RSS per phase and the ratios between shapes (computations × 4 per
step). Never fails on speed. Usage: ``python benchmarks/energy_scale.py [--shapes 8x192,16x384,32x768]
[--objective time,energy]``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def inputs(stages: int, microbatches: int):
    import numpy as np

    from ampe.costmodel.catalog import CATALOG
    from ampe.energy.inputs import PipelineInputs

    rng = np.random.default_rng(stages)
    half = stages // 2
    gpus = tuple(CATALOG["H100-80GB" if s < half else "A100-80GB"] for s in range(stages))
    a100_layer, h100_layer = 0.0122, 0.0122 * 0.45
    # 96 layers: H100 stages take 2x an A100 stage's layers (3 : 1.5 per stage pair at 32 stages), times per stage
    per_a100 = 96 / (half * 2.0 + (stages - half))
    fwd = tuple(float((2 * per_a100 * h100_layer if s < half else per_a100 * a100_layer) * rng.uniform(0.97, 1.03))
                for s in range(stages))
    return PipelineInputs(fwd, tuple(2 * x for x in fwd), gpus, microbatches, p2p_forward_s=(0.002,) * (stages - 1),
                          gpus_per_stage=(8,) * stages)


def child(stages: int, microbatches: int, objective: str) -> None:
    """One shape, one objective; prints a JSON line of phase CPU seconds and peak RSS (MB)."""
    def cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def rss() -> float:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    out: dict = {"shape": f"{stages}x{microbatches}", "objective": objective, "base_mb": rss()}
    c = cpu()
    from ampe.energy.inputs import dag_from_inputs
    from ampe.tradeoff.direct import point_by
    from ampe.tradeoff.evaluate import OptionTable, evaluate_choice, fastest_choice
    from ampe.tradeoff.frontier import trace_frontier

    out["import_s"] = cpu() - c
    c = cpu()
    dag = dag_from_inputs(inputs(stages, microbatches))
    table = OptionTable.of(dag)
    base = evaluate_choice(dag, fastest_choice(dag), table)
    out["nodes"] = len(dag.nodes)
    out["dag_s"], out["dag_mb"] = cpu() - c, rss()
    if objective == "energy":
        c = cpu()
        tau = base.time_s / 1000
        fr = trace_frontier(dag, tau)
        out["trace_s"], out["trace_mb"] = cpu() - c, rss()
        c = cpu()
        pts = fr.points(max_planned_s=base.time_s * 1.05 * 1.01 + 4 * tau)
        out["points_s"], out["points_mb"], out["points"] = cpu() - c, rss(), len(pts)
        best = min(p.energy_j for p in pts if p.time_s <= base.time_s * 1.05)
        out["saving_5pct"] = 100 * (1 - best / base.energy_j)
    c = cpu()
    t0 = time.perf_counter()
    _, ev = point_by(dag, table=table)
    out["direct_s"], out["direct_wall_s"], out["direct_mb"] = cpu() - c, time.perf_counter() - t0, rss()
    out["saving_tmin"] = 100 * (1 - ev.energy_j / base.energy_j)
    out["slower"] = ev.time_s > base.time_s * (1 + 1e-12)
    out["total_s"], out["peak_mb"] = cpu(), rss()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="8x192,16x384,32x768")
    ap.add_argument("--objective", default="time,energy")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        n, m, obj = args.child.split(",")
        child(int(n), int(m), obj)
        return
    print("== GPT-3 175B, 256 mixed GPUs (H100/A100, TP 8), gbs 1536: energy planning per shape, fresh process each")
    print(f"{'shape':>8} {'objective':>9} {'nodes':>7} {'DAG s':>6} {'PD s':>7} {'realize s':>9} {'LP point s':>10} "
          f"{'total CPU s':>11} {'peak MB':>8} {'saving T_min':>12} {'slower':>6}")
    prev: dict[str, dict] = {}
    for obj in args.objective.split(","):
        for shape in args.shapes.split(","):
            n, m = shape.split("x")
            r = subprocess.run([sys.executable, __file__, "--child", f"{n},{m},{obj}"], capture_output=True, text=True)
            if r.returncode != 0:
                print(f"{shape:>8} {obj:>9} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            d = json.loads(r.stdout.strip().splitlines()[-1])
            grow = ""
            if obj in prev:
                p = prev[obj]
                mem = (d["peak_mb"] - d["base_mb"]) / max(1.0, p["peak_mb"] - p["base_mb"])
                grow = (f"   x{d['nodes'] / p['nodes']:.1f} nodes: CPU x{d['total_s'] / p['total_s']:.1f}, "
                        f"memory above start-up x{mem:.1f}")
            prev[obj] = d
            print(f"{shape:>8} {obj:>9} {d['nodes']:>7} {d['dag_s']:>6.2f} {d.get('trace_s', 0):>7.2f} "
                  f"{d.get('points_s', 0):>9.2f} {d['direct_s']:>10.2f} {d['total_s']:>11.2f} {d['peak_mb']:>8.0f} "
                  f"{d['saving_tmin']:>11.2f}% {d['slower']!s:>6}{grow}", flush=True)
    print("   CPU = user + system seconds of the child; peak MB = its peak RSS; 'saving T_min' = the time objective's "
          "point against all clocks at maximum")


if __name__ == "__main__":
    main()
