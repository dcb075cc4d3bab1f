"""Llama on CPU DeepSpeed trials (issue 24, item 5): eager and flash attention × none, selective and full
recomputation, across micro-batch sizes at a fixed number of tokens, against the cost model with a profile taken by
``ampe profile``.

For each model (default llama-tiny; ``--models llama-tiny,llama-small`` adds seq 1024, h 512, GQA 8:2, where the s²
scores are a large share of the memory) it

1. profiles every layer with ``ampe profile --device cpu`` for each attention kernel, recomputation mode and
   micro-batch size (the CSVs are merged: each model variant reads its own kernel's rows);
2. runs a CPU trial (torchrun, gloo, 2 ranks = pp 2, the uniform partition, fp32) per attention × recomputation ×
   micro-batch size at a fixed global batch (so a fixed number of tokens per iteration), in rounds, each waiting for
   a quiet machine (benchmarks/support/quiet.py) so the ranking measures the model, not other processes;
3. prints per attention × recomputation the worst memory error (each rank's tensor peak against the model's
   per-stage allocated peak) and Spearman ρ of predicted vs measured time across micro-batch sizes.

``--record DIR`` keeps the profile and the measurements (one ``ampe report --measurements`` line per trial, the
strategy as it ran) in ``DIR/<model>/``; tests/runtime/test_llama_cpu_record.py holds the cost model to them.

Run: .venv/bin/python benchmarks/llama_cpu.py [--models llama-tiny] [--mbs 1,2,4,8] [--gbs 8] [--iters 3]
     [--out runs/llama-cpu] [--record tests/data/cpu_llama]
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
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import strategy_from_dict, uniform_partition
from ampe.costmodel.zoo import load_model
from ampe.formats.measurement import Measurement, measurement_line
from ampe.report.compare import spearman

CLUSTER = ROOT / "cluster_specs" / "local-cpu.yaml"
ATTENTIONS = ("eager", "flash")
RECOMPUTE = ("none", "selective", "full")


def profile(model: str, mbs: list[int], out: Path, repeats: int) -> Path:
    """``ampe profile`` of ``model`` for both kernels and every recomputation mode, merged into one CSV."""
    merged = out / f"profile_{model}.csv"
    lines: list[str] = []
    for att in ATTENTIONS:
        part = out / f"profile_{model}_{att}.csv"
        subprocess.run([sys.executable, "-m", "ampe", "profile", "--model", model, "--device", "cpu", "--attention",
                        att, "--recompute", ",".join(RECOMPUTE), "--mbs", ",".join(map(str, mbs)), "--warmup", "2",
                        "--repeats", str(repeats), "--out", str(part)], check=True, cwd=ROOT)
        text = part.read_text().splitlines(keepends=True)
        lines += text if not lines else text[1:]
    merged.write_text("".join(lines))
    return merged


def trial(model: str, attention: str, strategy: dict, out: Path, warmup: int, iters: int) -> list[dict]:
    """One CPU trial (2 ranks) of ampe's worker; its rank reports."""
    out.mkdir(parents=True, exist_ok=True)
    job = {"schema": "ampe.job/1", "trial_id": out.name, "model": model, "strategy": strategy, "freq_backend": "none",
           "gpu_types": ["cpu", "cpu"], "warmup_iters": warmup, "timed_iters": iters, "dtype": "fp32",
           "device": "cpu", "attention": attention, "out_dir": str(out)}
    (out / "job.json").write_text(json.dumps(job))
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "PYTHONPATH": str(ROOT)}
    torchrun = Path(sys.executable).with_name("torchrun")
    proc = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node", "2", "-m", "ampe.runtime.worker",
                           str(out / "job.json")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode:
        raise RuntimeError(f"trial {out.name} failed: {proc.stderr[-2000:]}")
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="llama-tiny")
    p.add_argument("--mbs", default="1,2,4,8")
    p.add_argument("--gbs", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--repeats", type=int, default=10, help="timed pairs per layer in the profile")
    p.add_argument("--max-other-cores", type=float, default=0.3, help="the quiet gate's load limit")
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "llama-cpu")
    p.add_argument("--record", type=Path, default=None)
    args = p.parse_args()
    mbs_list = [int(x) for x in args.mbs.split(",")]
    from benchmarks.support.quiet import QuietGate

    gate = QuietGate(max_other_cores=args.max_other_cores)
    cluster = load_cluster(CLUSTER)
    for name in args.models.split(","):
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        gate.wait()
        prof_path = profile(name, mbs_list, out, args.repeats)
        prof = load_profile(prof_path, known_devices=["cpu"])
        layers = load_model(name).num_layers
        lines: list[str] = []
        results: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        mem_err: dict[tuple[str, str], float] = {}
        for att in ATTENTIONS:
            cm = CostModel(cluster, load_model(name, att), prof)
            for rec in RECOMPUTE:
                for mbs in mbs_list:
                    s = {"pp": 2, "dp": 1, "tp": 1, "mbs": mbs, "gbs": args.gbs,
                         "partition": list(uniform_partition(layers, 2)), "recompute": rec}
                    reading = gate.wait()
                    ranks = trial(name, att, s, out / f"{att}-{rec}-mbs{mbs}", args.warmup, args.iters)
                    per_iter = [max(a, b) for a, b in zip(ranks[0]["iteration_s"], ranks[1]["iteration_s"],
                                                           strict=True)]
                    measured = statistics.median(per_iter)
                    est = cm.estimate(strategy_from_dict(s))
                    errs = [(est.memory_breakdown[r["stage"]].allocated - r["peak_memory_bytes"])
                            / r["peak_memory_bytes"] * 100 for r in ranks]
                    worst = max(errs, key=abs)
                    mem_err[(att, rec)] = max(mem_err.get((att, rec), 0.0), worst, key=abs)  # signed
                    results.setdefault((att, rec), []).append((mbs, est.iteration_s, measured))
                    kernels = sorted({r["attention_kernel"] for r in ranks if r.get("attention_kernel")})
                    print(f"{name} {att:5s} {rec:9s} mbs {mbs}: predicted {est.iteration_s:.4f} s, measured "
                          f"{measured:.4f} s; memory error {worst:+.1f} %; kernel {','.join(kernels)}; machine "
                          f"slowdown {reading.slowdown:.2f}", flush=True)
                    line = Measurement.parse({"strategy": {**s, "zero": 0, "attention": att, "dtype": "fp32"},
                                              "iteration_s": measured, "status": "ok",
                                              "peak_memory_bytes": max(r["peak_memory_bytes"] for r in ranks)},
                                             "benchmark")
                    lines.append(measurement_line(line))
        print(f"\n{name}: attention × recomputation, across mbs {args.mbs} at global batch {args.gbs}")
        print(f"{'attention':9s} {'recompute':9s} {'worst memory error':>19s} {'Spearman ρ (time)':>18s}")
        for (att, rec), pts in results.items():
            rho = spearman([x[1] for x in pts], [x[2] for x in pts])[0]
            print(f"{att:9s} {rec:9s} {mem_err[(att, rec)]:+18.1f}% {'n/a' if rho is None else f'{rho:.3f}':>18s}")
        everything = [x for pts in results.values() for x in pts]
        rho_all = spearman([x[1] for x in everything], [x[2] for x in everything])[0]
        print(f"all {len(everything)} trials: Spearman ρ {rho_all:.3f}\n")
        if args.record is not None:
            dest = args.record / name
            dest.mkdir(parents=True, exist_ok=True)
            (dest / "profile.csv").write_text(prof_path.read_text())
            (dest / "measurements.jsonl").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
