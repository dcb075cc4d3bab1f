"""Memory options against real CPU DeepSpeed trials: activation recomputation (none/full) and ZeRO-1 on gpt2-tiny
and llama-tiny, world size 2 (``cluster_specs/local-cpu.yaml``, fp32, roofline — no profile).

For every strategy it runs one trial (torchrun, 2 warm-up + 3 timed iterations) and prints predicted vs measured
iteration time and per-rank memory (predicted minus ``reserved`` against the worker's tensor-byte peak), then per
model the Spearman ρ of predicted vs measured time and the largest memory error. Times depend on the machine's load:
run it on a quiet machine (no gate here; a disturbed run shows as an outlier).

Run: .venv/bin/python benchmarks/memory_options_cpu.py [--models gpt2-tiny,llama-tiny] [--out runs/memory-options]
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
from ampe.costmodel.model import load_model
from ampe.costmodel.strategy import strategy_from_dict
from ampe.report.compare import spearman

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


def trial(out: Path, model: str, strategy: dict) -> list[dict]:
    """Run one trial; the ranks' reports."""
    out.mkdir(parents=True, exist_ok=True)
    world = strategy["pp"] * strategy["dp"] * strategy["tp"]
    job = {"schema": "ampe.job/1", "trial_id": out.name, "model": model, "strategy": strategy, "frequency_plan": None,
           "freq_backend": "none", "gpu_types": ["cpu"] * world, "warmup_iters": 2, "timed_iters": 3, "seed": 0,
           "dtype": "fp32", "device": "cpu", "frozen_layers": 0, "out_dir": str(out)}
    (out / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", str(world), "-m", "ampe.runtime.worker",
                           str(out / "job.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-2000:])
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2-tiny,llama-tiny")
    ap.add_argument("--out", default="runs/memory-options")
    args = ap.parse_args()
    cluster = load_cluster(ROOT / "cluster_specs" / "local-cpu.yaml")
    for name in args.models.split(","):
        cm = CostModel(cluster, load_model(name))
        pred_t, meas_t, mem_err = [], [], []
        print(f"\n{name}: predicted vs measured (local-cpu, fp32, roofline)")
        print(f"{'strategy':<44} {'pred s':>8} {'meas s':>8} {'pred MB/rank':>22} {'meas MB/rank':>22}")
        for k, sd in enumerate(STRATEGIES):
            est = cm.estimate(strategy_from_dict(sd))
            s = est.strategy
            pred_mem = [est.memory_breakdown[r // (s.dp * s.tp)].total - est.memory_breakdown[0].reserved
                        for r in range(s.world_size)]
            ranks = trial(Path(args.out) / name / f"s{k}", name, sd)
            meas = statistics.median(max(r["iteration_s"][i] for r in ranks) for i in range(3))
            got = [r["peak_memory_bytes"] for r in ranks]
            pred_t.append(est.iteration_s)
            meas_t.append(meas)
            mem_err += [abs(p - m) / m for p, m in zip(pred_mem, got, strict=True)]
            label = f"{s.pp}/{s.dp}/{s.tp} mbs{s.mbs} rc={s.recompute} z={s.zero}"
            pm = " ".join(f"{p / 1e6:10.2f}" for p in pred_mem)
            mm = " ".join(f"{m / 1e6:10.2f}" for m in got)
            print(f"{label:<44} {est.iteration_s:8.3f} {meas:8.3f} {pm:>22} {mm:>22}")
        rho, _ = spearman(pred_t, meas_t)
        print(f"{name}: Spearman rho (time) = {rho if rho is None else round(rho, 3)} over {len(pred_t)} strategies; "
              f"memory error max {max(mem_err) * 100:.1f} %, mean {statistics.mean(mem_err) * 100:.1f} %")


if __name__ == "__main__":
    main()
