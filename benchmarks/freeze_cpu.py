"""FreezePipe on real CPU trials: the measured gain of freezing the first N layers (and re-partitioning with
``ampe replan``) against the cost model's predicted gain.

Self-contained: ``ampe profile`` gpt2-tiny → ``ampe search --profile`` on ``cluster_specs/local-cpu.yaml`` (2 cores)
→ pick the best pipeline (pp 2) strategy → ``ampe replan --frozen-layers N --out`` (the re-partitioned strategy and
the old partition, both with N frozen layers) → trials of the unfrozen strategy and of both frozen ones, in
alternating order over ``--rounds`` rounds behind a quiet-machine gate → gains.

gain = iteration time without freezing / iteration time with N frozen layers (measured: median iteration per
trial, median over rounds; predicted: the plans' predictions). Acceptance (issue): the measured gain of the
re-planned strategy is within 10 % of the predicted one.

Run: .venv/bin/python benchmarks/freeze_cpu.py [--frozen-layers 4] [--rounds 3] [--mbs 1] [--out runs/freeze-cpu]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ampe.cli import main as ampe
from ampe.io import read_json, write_json_atomic
from ampe.trials.prepare import TrialOptions
from benchmarks.support.gated import other_cores, run_gated
from benchmarks.support.quiet import QuietGate

MODEL = "gpt2-tiny"  # 10 layers: 0 embedding | 1 noop | 2..5 blocks | 6 noop | 7 norm | 8 logits | 9 noop
SPEC = ROOT / "cluster_specs" / "local-cpu.yaml"


def cli(*argv: object) -> None:
    code = ampe([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"ampe {argv[0]} failed with exit code {code}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "freeze-cpu"))
    ap.add_argument("--frozen-layers", type=int, default=4, help="frozen prefix (default 4: embedding, 2 blocks)")
    ap.add_argument("--mbs", type=int, default=1, help="micro-batch size of the pp 2 strategy (default 1)")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--max-wait", type=float, default=20.0)
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    print(f"freeze_cpu: {MODEL}, first {args.frozen_layers} layers frozen; machine: {os.cpu_count()} cores, load "
          f"average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    gate = QuietGate(max_wait_s=args.max_wait, max_slowdown=1.5)
    gate.wait()
    profile, plan = out / "profile.csv", out / "plan.json"
    cli("profile", "--model", MODEL, "--device", "cpu", "--tp", "1", "--mbs", f"{args.mbs}", "--warmup", "5",
        "--repeats", "15", "--out", profile)
    cli("search", "--cluster", SPEC, "--model", MODEL, "--profile", profile, "--global-batch", args.global_batch,
        "--top-k", "60", "--out", plan)
    doc = read_json(plan)
    base = min((e for e in doc["strategies"] if e["pp"] == 2 and e["dp"] == 1 and e["mbs"] == args.mbs),
               key=lambda e: e["predicted"]["iteration_s"])
    base_plan = out / "unfrozen.json"
    write_json_atomic(base_plan, {**doc, "strategies": [{**base, "rank": 1}]})
    frozen_plan = out / "frozen.json"
    cli("replan", "--plan", plan, "--rank", base["rank"], "--frozen-layers", args.frozen_layers, "--out", frozen_plan)
    fdoc = read_json(frozen_plan)
    names = {1: "re-partitioned", 2: "old partition"}
    predicted = {"unfrozen": base["predicted"]["iteration_s"]}
    for e in fdoc["strategies"]:
        predicted[names[e["rank"]]] = e["predicted"]["iteration_s"]
    partitions = {"unfrozen": base["partition"], **{names[e["rank"]]: e["partition"] for e in fdoc["strategies"]}}
    measured: dict[str, list[float]] = {k: [] for k in predicted}
    loads: dict[str, list[float]] = {k: [] for k in predicted}
    for rnd in range(args.rounds):
        order = [("unfrozen", base_plan), ("frozen", frozen_plan)]
        if rnd % 2:
            order.reverse()  # alternate, so a drift of the machine's speed hits both sides alike
        for what, p in order:
            opts = TrialOptions(out_dir=out / f"round{rnd + 1}-{what}", top_k=2, warmup_iters=args.warmup,
                                timed_iters=args.iters, timeout_s=300.0, freq_backend="none")
            for r in run_gated(p, opts, gate, log=print):
                name = "unfrozen" if what == "unfrozen" else names[r.plan_rank]
                if r.status == "ok":
                    measured[name].append(statistics.median(r.iteration_s))
                    if other_cores(r) is not None:
                        loads[name].append(other_cores(r))
                else:
                    print(f"  {name}: {r.status} ({r.reason})")
    print(f"\nstrategy pp 2 · dp 1 · tp 1 · mbs {args.mbs}, gbs {args.global_batch}, first {args.frozen_layers} layers "
          "frozen (measured = median over rounds of each trial's median iteration)")
    print(f"  {'run':16s} {'partition':18s} {'pred s':>8s} {'meas s':>8s}  per round")
    med = {}
    for k in predicted:
        if measured[k]:
            med[k] = statistics.median(measured[k])
            print(f"  {k:16s} {partitions[k]!s:18s} {predicted[k]:8.4f} {med[k]:8.4f}  "
                  + " ".join(f"{x:.4f}" for x in measured[k]))
    ok = True
    for k in ("re-partitioned", "old partition"):
        if k in med and "unfrozen" in med:
            pg, mg = predicted["unfrozen"] / predicted[k], med["unfrozen"] / med[k]
            err = (mg - pg) / pg * 100
            verdict = "within" if abs(err) <= 10 else "NOT within"
            if k == "re-partitioned":
                ok = abs(err) <= 10
            print(f"  gain of freezing, {k:14s}: predicted {pg:.3f}×, measured {mg:.3f}× ({err:+.1f} %, {verdict} "
                  "10 %)")
    if "re-partitioned" in med and "old partition" in med:
        gain = predicted['old partition'] / predicted['re-partitioned']
        print(f"  gain of re-partitioning alone: predicted {gain:.3f}×,"
              f" measured {med['old partition'] / med['re-partitioned']:.3f}×")
    all_loads = [x for v in loads.values() for x in v]
    probes = [r.probe_s * 1e3 for r in gate.readings]
    print(f"machine: other processes during the kept trials {min(all_loads, default=0):.2f}–"
          f"{max(all_loads, default=0):.2f} cores; speed probe {min(probes):.2f}–{max(probes):.2f} ms; load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; wall {time.monotonic() - t0:.0f} s")
    print("acceptance (re-planned gain within 10 % of the prediction):", "met" if ok else "NOT met")
    return 0


if __name__ == "__main__":
    sys.exit(main())
