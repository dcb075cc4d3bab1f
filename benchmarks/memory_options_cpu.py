"""Memory options against real CPU DeepSpeed trials: activation recomputation (none/full) and ZeRO-1 on gpt2-tiny
and llama-tiny, world size 2 (``cluster_specs/local-cpu.yaml``, fp32, roofline — no profile).

For every strategy it runs ``--reps`` trials (torchrun, 2 warm-up + 5 timed iterations; the strategies in rounds,
so a burst of load from other processes spreads over all of them) and prints predicted vs measured iteration time,
per-rank memory (the predicted allocated peak against the worker's tensor-byte peak) and CPU time, then per model:

* Spearman ρ of predicted vs measured wall time per iteration (median over repetitions of each trial's median);
* Spearman ρ of predicted busy seconds vs measured CPU seconds of the busiest rank per iteration (each rank runs
  one thread, so its CPU seconds are its own work, whatever else loads the machine): the busy prediction is the
  rank's micro-batches' forward + backward plus its tail (gradient sync, optimizer), without the pipeline bubble,
  which costs no CPU;
* the largest memory error.

Two strategy sets: ``separated`` (default: 7 strategies whose predicted times are at least ~10 % apart, so the ranking
is a test of the model rather than of noise; recomputation none/full/per stage, ZeRO-1, pp 2 and dp 2) and
``memory`` (the 8 strategies first used for the memory check, two pairs of which are predicted within 2 %).

Run: .venv/bin/python benchmarks/memory_options_cpu.py [--models gpt2-tiny,llama-tiny] [--set separated|memory]
     [--reps 2] [--out runs/memory-options]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.report.compare import spearman

SEPARATED = [
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 4, "gbs": 8, "zero": 1},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 8},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 4, "gbs": 8, "zero": 1, "recompute": "full"},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "gbs": 8},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "stage_recompute": ["full", "none"]},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8, "recompute": "full"},
]
STRATEGIES = [
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 2, "gbs": 8, "recompute": "full"},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 4, "gbs": 8, "recompute": "full"},
    {"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 8},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 2, "gbs": 8, "zero": 1},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 4, "gbs": 8, "zero": 1, "recompute": "full"},
    {"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "gbs": 8, "recompute": "full"},
]


SETS = {"separated": SEPARATED, "memory": STRATEGIES}
TIMED = 5


def trial(out: Path, model: str, strategy: dict) -> list[dict]:
    """Run one trial; the ranks' reports."""
    out.mkdir(parents=True, exist_ok=True)
    world = strategy["pp"] * strategy["dp"] * strategy["tp"]
    job = {"schema": "ampe.job/1", "trial_id": out.name, "model": model, "strategy": strategy, "frequency_plan": None,
           "freq_backend": "none", "gpu_types": ["cpu"] * world, "warmup_iters": 2, "timed_iters": TIMED, "seed": 0,
           "dtype": "fp32", "device": "cpu", "frozen_layers": 0, "out_dir": str(out)}
    (out / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", str(world), "-m", "ampe.runtime.worker",
                           str(out / "job.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def busy_s(est) -> float:  # type: ignore[no-untyped-def]
    """Predicted CPU-busy seconds of the busiest rank per iteration: its stage's micro-batches, forward + backward,
    plus its tail (gradient sync, optimizer step); no pipeline bubble."""
    s = est.strategy
    return max(s.gas * (est.fwd_s[0][j] + est.bwd_s[0][j]) + est.tail_s[j] for j in range(s.pp))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-tiny,llama-tiny")
    ap.add_argument("--set", default="separated", choices=sorted(SETS))
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default="runs/memory-options")
    args = ap.parse_args()
    cluster = load_cluster(ROOT / "cluster_specs" / "local-cpu.yaml")
    strategies = SETS[args.set]
    print(f"load average at start: {os.getloadavg()[0]:.2f} (2-core machine)")
    for name in args.models.split(","):
        cm = CostModel(cluster, load_model(name))
        ests = [cm.estimate(strategy_from_dict(sd)) for sd in strategies]
        walls: list[list[float]] = [[] for _ in strategies]
        cpus: list[list[float]] = [[] for _ in strategies]
        mem_err: list[float] = []
        peaks: list[list[int]] = [[] for _ in strategies]
        loads = []
        for rep in range(args.reps):
            order = range(len(strategies)) if rep % 2 == 0 else reversed(range(len(strategies)))
            for k in order:
                ranks = trial(Path(args.out) / name / f"s{k}-r{rep}", name, strategies[k])
                walls[k].append(statistics.median(max(r["iteration_s"][i] for r in ranks) for i in range(TIMED)))
                cpus[k].append(statistics.median(max(r["cpu_s_per_iter"][i] for r in ranks) for i in range(TIMED)))
                peaks[k] = [r["peak_memory_bytes"] for r in ranks]
                loads.append(os.getloadavg()[0])
        print(f"\n{name}: predicted vs measured (local-cpu, fp32, roofline; {args.set} set, {args.reps} repetitions, "
              f"median of medians; load average during the trials {min(loads):.1f}-{max(loads):.1f})")
        print(f"{'strategy':<40} {'pred s':>7} {'wall s':>7} {'busy s':>7} {'cpu s':>7} {'pred MB/rank':>18} "
              f"{'meas MB/rank':>18}")
        pred_t, meas_t, pred_b, meas_c = [], [], [], []
        for k, est in enumerate(ests):
            s = est.strategy
            pred_mem = [est.memory_breakdown[r // (s.dp * s.tp)].allocated for r in range(s.world_size)]
            mem_err += [abs(p - m) / m for p, m in zip(pred_mem, peaks[k], strict=True)]
            pred_t.append(est.iteration_s)
            meas_t.append(statistics.median(walls[k]))
            pred_b.append(busy_s(est))
            meas_c.append(statistics.median(cpus[k]))
            label = f"{s.pp}/{s.dp}/{s.tp} mbs{s.mbs} rc={s.recompute_label} z={s.zero}"
            pm = " ".join(f"{p / 1e6:8.1f}" for p in pred_mem)
            mm = " ".join(f"{m / 1e6:8.1f}" for m in peaks[k])
            print(f"{label:<40} {pred_t[-1]:7.3f} {meas_t[-1]:7.3f} {pred_b[-1]:7.3f} {meas_c[-1]:7.3f} {pm:>18} "
                  f"{mm:>18}   (wall per rep: {' '.join(f'{w:.3f}' for w in walls[k])})")
        rho, _ = spearman(pred_t, meas_t)
        rho_c, _ = spearman(pred_b, meas_c)
        print(f"{name}: Spearman rho wall time = {_fmt(rho)}, CPU time = {_fmt(rho_c)} over {len(pred_t)} "
              f"strategies; memory error max {max(mem_err) * 100:.1f} %, mean {statistics.mean(mem_err) * 100:.1f} %")


def _fmt(rho: float | None) -> str:
    return "n/a" if rho is None else f"{rho:.3f}"


if __name__ == "__main__":
    main()
