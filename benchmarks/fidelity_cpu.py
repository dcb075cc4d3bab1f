"""Cost-model fidelity against real CPU DeepSpeed trials on this machine (2 cores): predicted vs measured iteration
time and memory for ~28 strategies of gpt2-tiny at world sizes 2 and 4.

Self-contained loop, repeated for ``--rounds`` rounds (the machine's speed drifts; each round has its own profile):

1. ``ampe profile`` gpt2-tiny on one core (tp 1, 2; mbs 1, 2, 4, 8), and the cores' time-sharing efficiency
   (``ampe profile --sharing``: the throughput a core keeps running two ranks), written into the round's copy of
   ``local-cpu-4.yaml`` as ``sharing_efficiency``;
2. ``ampe search --profile`` on ``cluster_specs/local-cpu.yaml`` (2 devices = 2 cores) and the round's
   ``local-cpu-4.yaml`` (4 devices time-sharing the 2 cores); the strategies are picked in round 1 (every pp/dp/tp
   shape and several micro-batch sizes, DP-optimal partitions plus the uniform partition of some pipelines, and for
   pp 2 × dp 2 both a placement that mixes stages on a core and one that puts a stage's two replicas on one core)
   and re-costed with each round's profile;
3. the trials, one at a time behind a quiet-machine gate (``benchmarks.support.gated``; a trial disturbed by other
   processes runs again);
4. the comparison: Spearman ρ and MAPE of predicted vs measured iteration time (per world size and pooled), whether
   the predicted best is within 5 % of the measured best, DP-optimal vs uniform partitions, per-rank memory
   (the predicted allocated peak vs the worker's tensor-byte peak; docs/fidelity.md explains why), and
   the same time figures after ``ampe report --calibrate`` cross-fitted between the world sizes (the factor fitted
   on one world size predicts the other).

Measured time of a trial = median of its timed iterations (the report's mean is printed beside it). tp = 4 is left
out: it cannot be profiled on 2 cores without the time-sharing the cost model adds itself.

Run: .venv/bin/python benchmarks/fidelity_cpu.py [--rounds 3] [--quick] [--out runs/fidelity-cpu]
     (more rounds into the same --out add to it; --analyze-only re-costs stored rounds with the current model)
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
from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import strategy_from_dict, uniform_partition
from ampe.costmodel.zoo import load_model
from ampe.formats.plan import PlanInputs, SearchStats
from ampe.io import read_json, write_json_atomic
from ampe.planning import plan_for_estimates
from ampe.profiling.sharing import measure_sharing_efficiency
from ampe.report.calibrate import calibrate
from ampe.report.compare import build_report, mape, spearman
from ampe.trials.prepare import TrialOptions
from ampe.trials.results import ResultsStore
from benchmarks.support.gated import other_cores, run_gated
from benchmarks.support.quiet import QuietGate

MODEL = "gpt2-tiny"
GBS = 8
SPECS = {2: ROOT / "cluster_specs" / "local-cpu.yaml", 4: ROOT / "cluster_specs" / "local-cpu-4.yaml"}
# (pp, dp, tp, mbs, placement or None for the search's best) picked per world size; "uniform" adds the uniform
# partition of that strategy as a second entry.
PICKS = {
    2: [(2, 1, 1, m, None) for m in (1, 2, 4, 8)] + [(1, 2, 1, m, None) for m in (1, 2, 4)]
       + [(1, 1, 2, m, None) for m in (1, 2, 4, 8)],
    4: [(2, 2, 1, m, (0, 1, 2, 3)) for m in (1, 2, 4)] + [(2, 2, 1, 4, (0, 2, 1, 3))]
       + [(4, 1, 1, m, None) for m in (1, 2, 4, 8)] + [(1, 4, 1, m, None) for m in (1, 2)]
       + [(2, 1, 2, 4, None), (1, 2, 2, 4, None)],
}
UNIFORM_NAME = "uniform partition"  # the placement_name of the uniform-partition twins in the bench plans
UNIFORM = {2: [(2, 1, 1, 1), (2, 1, 1, 4)], 4: [(4, 1, 1, 1), (2, 2, 1, 1)]}
QUICK_PICKS = {2: [(2, 1, 1, 1, None), (2, 1, 1, 4, None), (1, 2, 1, 2, None), (1, 1, 2, 4, None)],
               4: [(2, 2, 1, 1, (0, 1, 2, 3)), (4, 1, 1, 1, None), (1, 4, 1, 2, None)]}
QUICK_UNIFORM = {2: [(2, 1, 1, 1)], 4: [(4, 1, 1, 1)]}


def cli(*argv: object) -> None:
    code = ampe([str(a) for a in argv])
    if code != 0:
        raise SystemExit(f"ampe {argv[0]} failed with exit code {code}")


def round_spec(rdir: Path, ws: int) -> Path:
    """The cluster spec of world size ``ws`` in round ``rdir``: its copy with the measured sharing efficiency when
    the round has one (rounds stored before the efficiency was measured use the bundled spec)."""
    own = rdir / SPECS[ws].name
    return own if own.exists() else SPECS[ws]


def write_sharing_spec(rdir: Path, log=print) -> None:
    """Measure the time-sharing efficiency and write the round's copy of the time-shared spec with it."""
    import yaml

    m = measure_sharing_efficiency(MODEL, mbs=1)
    log(f"   sharing efficiency: {m.describe()}")
    raw = yaml.safe_load(SPECS[4].read_text())
    for node in raw["nodes"]:
        if node.get("processors"):
            node["sharing_efficiency"] = round(min(m.efficiency, 1.0), 4)
    (rdir / SPECS[4].name).write_text(yaml.safe_dump(raw, sort_keys=False))


def shape(e: dict) -> tuple:
    return (e["pp"], e["dp"], e["tp"], e["mbs"])


def pick(search_doc: dict, picks: list, uniform: list, n_layers: int) -> list[dict]:
    """Strategy dicts (pp, dp, tp, mbs, gbs, partition, placement) chosen from a search plan."""
    chosen = []
    for pp, dp, tp, mbs, placement in picks:
        cands = [e for e in search_doc["strategies"] if shape(e) == (pp, dp, tp, mbs)
                 and (placement is None or tuple(e["placement"]) == placement)]
        if not cands:
            print(f"  (no {pp}/{dp}/{tp} mbs {mbs} placement {placement} in the search; skipped)")
            continue
        e = min(cands, key=lambda e: e["predicted"]["iteration_s"])
        chosen.append({k: e[k] for k in ("pp", "dp", "tp", "mbs", "gbs", "partition", "placement")})
        if (pp, dp, tp, mbs) in uniform:
            uni = list(uniform_partition(n_layers, pp))
            if uni != e["partition"]:
                chosen.append({**chosen[-1], "partition": uni, "uniform": True})
    return chosen


def bench_plan(search_doc: dict, strategies: list[dict], cm: CostModel, path: Path) -> None:
    """A plan file with exactly ``strategies``, costed by ``cm`` and ranked by predicted time."""
    cluster = cm.cluster
    ests = []
    for d in strategies:
        s = strategy_from_dict({k: v for k, v in d.items() if k != "uniform"}, "bench")
        ests.append((cm.estimate(s), d.get("uniform", False)))
    ests.sort(key=lambda x: x[0].iteration_s)
    plan = plan_for_estimates(cluster, cm.model, [e for e, _ in ests], search_doc["global_batch"],
                              SearchStats.model_validate(search_doc["search"]),
                              PlanInputs.model_validate(search_doc["inputs"]),
                              [UNIFORM_NAME if uni else "dp-optimal" for _, uni in ests])
    write_json_atomic(path, plan.to_json())


def median_s(r) -> float:
    return statistics.median(r.iteration_s) if r.iteration_s else float("nan")


def key(d: dict) -> tuple:
    return (d["pp"], d["dp"], d["tp"], d["mbs"], tuple(d["partition"]), tuple(d["placement"]))


def label(k: tuple) -> str:
    pp, dp, tp, mbs, part, place = k
    return f"pp{pp}·dp{dp}·tp{tp}·mbs{mbs} {list(part)} on {list(place)}"


def figures(rows: list[tuple[float, float]]) -> dict:
    """Spearman, MAPE, and the predicted best against the measured best, over (predicted, measured) pairs."""
    pred = [p for p, _ in rows]
    meas = [m for _, m in rows]
    rho, _ = spearman(pred, meas)
    best_pred = min(range(len(rows)), key=lambda i: pred[i])
    best_meas = min(meas)
    return {"n": len(rows), "spearman": rho, "mape": mape(pred, meas), "best_ratio": meas[best_pred] / best_meas,
            "ratio_median": statistics.median(m / p for p, m in rows)}


def fmt(f: dict) -> str:
    rho = "n/a" if f["spearman"] is None else f"{f['spearman']:.3f}"
    return (f"n={f['n']:2d}  Spearman {rho}  MAPE {f['mape']:5.1f} %  predicted best measured at "
            f"{f['best_ratio']:.3f}× the measured best ({'within' if f['best_ratio'] <= 1.05 else 'NOT within'} 5 %)"
            f"  median measured/predicted {f['ratio_median']:.3f}")


def run_round(rdir: Path, args: argparse.Namespace, gate: QuietGate, model, picks: dict, uniform: dict,
              chosen: dict[int, list[dict]]) -> None:
    """One round: profile, search, plan the chosen strategies (picked in the first round), run them gated."""
    rdir.mkdir(parents=True, exist_ok=True)
    reading = gate.wait()
    print(f"\n== {rdir.name}: profile (machine: other processes {reading.other_cores} cores, speed probe "
          f"{reading.probe_s * 1e3:.2f} ms)")
    profile = rdir / "profile.csv"
    cli("profile", "--model", MODEL, "--device", "cpu", "--tp", "1,2", "--mbs", "1,2,4,8", "--warmup", "5",
        "--repeats", "15", "--out", profile)
    write_sharing_spec(rdir)
    for ws in SPECS:
        spec = round_spec(rdir, ws)
        search_plan = rdir / f"search{ws}.json"
        cli("search", "--cluster", spec, "--model", MODEL, "--profile", profile, "--global-batch", GBS,
            "--top-k", 60, "--out", search_plan)
        doc = read_json(search_plan)
        if ws not in chosen:
            chosen[ws] = pick(doc, picks[ws], uniform[ws], model.num_layers)
        cm = CostModel(load_cluster(spec), model, load_profile(profile))
        plan = rdir / f"plan{ws}.json"
        bench_plan(doc, chosen[ws], cm, plan)
        print(f"-- world size {ws}: {len(chosen[ws])} trials ({spec.name})")
        opts = TrialOptions(out_dir=rdir / f"trials{ws}", top_k=len(chosen[ws]), warmup_iters=args.warmup,
                            timed_iters=args.iters, timeout_s=300.0, freq_backend="none")
        run_gated(plan, opts, gate, args.max_other_cores, retries=args.retries, log=print)


def collect(out: Path, model) -> list[dict[int, dict[tuple, dict]]]:
    """Every round's kept trials, re-costed with the current cost model and that round's profile."""
    per_round = []
    for rdir in sorted(out.glob("round*"), key=lambda p: int(p.name[5:])):
        profile = rdir / "profile.csv"
        if not profile.exists():
            continue
        results: dict[int, dict[tuple, dict]] = {}
        for ws in SPECS:
            folder = rdir / f"trials{ws}"
            if not (folder / "results.jsonl").exists():
                continue
            cm = CostModel(load_cluster(round_spec(rdir, ws)), model, load_profile(profile))
            plan = read_json(folder / "plan.json")
            uniform_flags = {key(e): e.get("placement_name") == UNIFORM_NAME for e in plan["strategies"]}
            for r in ResultsStore(folder).latest().values():
                k = key(r.strategy)
                est = cm.estimate(strategy_from_dict(r.strategy, "bench"))
                results.setdefault(ws, {})[k] = {
                    "predicted": est.iteration_s, "measured": median_s(r), "mean": r.iteration_s_mean,
                    "status": r.status, "other": other_cores(r), "uniform": uniform_flags.get(k, False),
                    "pred_mem": [est.memory_breakdown[rank // (est.strategy.dp * est.strategy.tp)].allocated
                                 for rank in range(len(r.strategy["placement"]))],
                    "meas_mem": list(r.peak_memory_bytes_per_rank)}
        per_round.append(results)
    return per_round


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(ROOT / "runs" / "fidelity-cpu"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="7 strategies, 1 round, short trials")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--max-wait", type=float, default=20.0, help="longest wait for a quiet machine per trial (s)")
    ap.add_argument("--max-other-cores", type=float, default=0.2,
                    help="rerun a trial when other processes used more cores than this during it")
    ap.add_argument("--retries", type=int, default=1, help="reruns of a disturbed trial (default 1)")
    ap.add_argument("--analyze-only", action="store_true",
                    help="no new trials: re-cost the rounds already in --out with the current cost model")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.iters, args.warmup = 1, 4, 2
    picks, uniform = (QUICK_PICKS, QUICK_UNIFORM) if args.quick else (PICKS, UNIFORM)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.monotonic()
    print(f"fidelity_cpu: {MODEL}, gbs {GBS}; machine: {os.cpu_count()} cores, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    model = load_model(MODEL)
    gate = QuietGate(max_wait_s=args.max_wait, max_slowdown=1.5)
    if not args.analyze_only:
        chosen: dict[int, list[dict]] = {}
        first = 1 + len(list(out.glob("round*")))
        for rnd in range(first, first + args.rounds):
            run_round(out / f"round{rnd}", args, gate, model, picks, uniform, chosen)
    analyze(out, model, gate)
    print(f"wall {time.monotonic() - t_start:.0f} s")
    return 0


def framework_overhead(out: Path, model) -> None:
    """Where ``cpu.iteration_overhead_s`` comes from: per rank of the world-size-2 trials without tensor parallelism
    (one rank per core), the CPU seconds of an iteration spent outside forward/backward instructions (the worker's
    ``cpu_s_per_iter`` minus ``compute_s_per_iter``), minus the cost model's optimizer arithmetic for that stage."""
    cm = CostModel(load_cluster(SPECS[2]), model)
    spp = cm.optimizer_seconds_per_param(cm.cluster.devices[0].gpu)
    outside, beyond = [], []
    for rdir in sorted(out.glob("round*")):
        for folder in (rdir / "trials2").glob("trials/*"):
            ranks = [read_json(f) for f in sorted(folder.glob("rank*.json"))]
            job = read_json(folder / "job.json") if (folder / "job.json").exists() else None
            if not ranks or job is None or job["strategy"]["tp"] != 1:
                continue
            part = job["strategy"]["partition"]
            for r in ranks:
                if not r.get("cpu_s_per_iter") or not r.get("compute_s_per_iter"):
                    continue
                extra = statistics.median(c - k for c, k in zip(r["cpu_s_per_iter"], r["compute_s_per_iter"],
                                                                  strict=True))
                params = model.stage_params(range(part[r["stage"]], part[r["stage"] + 1]), 1, trainable_only=True)
                outside.append(extra)
                beyond.append(extra - params * spp)
    if outside:
        print(f"\nframework work per rank and iteration (world size 2, tp 1, {len(outside)} ranks): CPU outside "
              f"forward/backward instructions median {statistics.median(outside) * 1e3:.1f} ms; minus the modelled "
              f"optimizer step {statistics.median(beyond) * 1e3:.1f} ms (catalog cpu.iteration_overhead_s "
              f"{cm.cluster.devices[0].gpu.iteration_overhead_s * 1e3:.1f} ms)")


def analyze(out: Path, model, gate: QuietGate) -> None:
    """Print every figure from the rounds in ``out`` (re-costed with the current model)."""
    per_round = collect(out, model)
    print(f"\n== results ({len(per_round)} round(s); measured = median iteration; pooled = per-strategy median over "
          "rounds)")
    pooled: dict[int, dict[tuple, tuple[float, float]]] = {}
    for ws in SPECS:
        rows = []
        print(f"\nworld size {ws}:")
        print(f"  {'strategy':58s} {'pred s':>8s} {'meas s':>8s} {'err %':>7s}  {'other load':>10s}  rounds")
        keys = sorted({k for rr in per_round for k in rr.get(ws, {})},
                      key=lambda k: statistics.median(rr[ws][k]["predicted"] for rr in per_round
                                                        if k in rr.get(ws, {})))
        for k in keys:
            vals = [rr[ws][k] for rr in per_round if k in rr.get(ws, {}) and rr[ws][k]["status"] == "ok"]
            if not vals:
                print(f"  {label(k):58s} failed: {[rr[ws][k]['status'] for rr in per_round if k in rr.get(ws, {})]}")
                continue
            p = statistics.median(v["predicted"] for v in vals)
            m = statistics.median(v["measured"] for v in vals)
            loads = [v["other"] for v in vals if v["other"] is not None]
            tag = " (uniform)" if vals[0]["uniform"] else ""
            print(f"  {label(k) + tag:58s} {p:8.4f} {m:8.4f} {(p - m) / m * 100:+7.1f}  "
                  f"{max(loads) if loads else float('nan'):10.2f}  " + " ".join(f"{v['measured']:.3f}" for v in vals))
            rows.append((p, m))
            pooled.setdefault(ws, {})[k] = (p, m)
        if len(rows) >= 3:
            print(f"  figures: {fmt(figures(rows))}")
    all_rows = [v for ws in pooled for v in pooled[ws].values()]
    print(f"\npooled (both world sizes): {fmt(figures(all_rows))}")
    for rnd, rr in enumerate(per_round):
        rows = [(v["predicted"], v["measured"]) for ws in rr for v in rr[ws].values() if v["status"] == "ok"]
        if len(rows) >= 3:
            print(f"round {rnd + 1} alone: {fmt(figures(rows))}")

    print("\nDP-optimal vs uniform partition (same degrees, mbs, placement):")
    for ws in pooled:
        for k, (p, m) in pooled[ws].items():
            uni = [(k2, v2) for k2, v2 in pooled[ws].items() if k2[:4] == k[:4] and k2[5] == k[5] and k2 != k
                   and any(rr.get(ws, {}).get(k2, {}).get("uniform") for rr in per_round)]
            if uni and not any(rr.get(ws, {}).get(k, {}).get("uniform") for rr in per_round):
                (k2, (p2, m2)), = uni
                print(f"  {label(k)} vs {list(k2[4])}: predicted uniform/DP {p2 / p:.3f}×, measured {m2 / m:.3f}×")

    framework_overhead(out, model)

    print("\nmemory per rank (predicted allocated peak vs measured tensor peak; each strategy's latest ok round):")
    errs = []
    latest: dict[int, dict[tuple, dict]] = {}
    for rr in per_round:  # later rounds overwrite earlier ones
        for ws, trials in rr.items():
            for k, v in trials.items():
                if v["status"] == "ok":
                    latest.setdefault(ws, {})[k] = v
    for rr in latest.values():
        for k, v in rr.items():
            e = [(p - q) / q * 100 for p, q in zip(v["pred_mem"], v["meas_mem"], strict=False) if q]
            errs += [(k, x) for x in e]
            print(f"  {label(k):58s} pred MB {[round(x / 1e6, 1) for x in v['pred_mem']]} meas MB "
                  f"{[round(x / 1e6, 1) for x in v['meas_mem']]} err % {[round(x, 1) for x in e]}")
    if errs:
        absval = [abs(x) for _, x in errs]
        notp = [abs(x) for k, x in errs if k[2] == 1]
        print(f"  memory error: mean |err| {statistics.fmean(absval):.1f} % over {len(absval)} ranks, max "
              f"{max(absval):.1f} %; without tensor parallelism {statistics.fmean(notp):.1f} % (max {max(notp):.1f} %)")

    print("\ncalibration (ampe report --calibrate), cross-fitted: the factor fitted on one world size's trials "
          "predicts the other's, per round:")
    for rnd, rr in enumerate(per_round):
        cal_rows = []
        for ws_fit, ws_eval in ((2, 4), (4, 2)):
            folder = out / f"round{rnd + 1}" / f"trials{ws_fit}"
            if not (folder / "results.jsonl").exists() or ws_eval not in rr:
                continue
            rep = build_report(folder)
            if len(rep.measured) < 2:
                continue
            csv = out / f"round{rnd + 1}" / f"calibrated-from-ws{ws_fit}.csv"
            cal = calibrate(rep, csv)
            cm = CostModel(load_cluster(round_spec(out / f"round{rnd + 1}", ws_eval)), model, load_profile(csv))
            for k, v in rr[ws_eval].items():
                if v["status"] == "ok":
                    s = strategy_from_dict({"pp": k[0], "dp": k[1], "tp": k[2], "mbs": k[3], "gbs": GBS,
                                            "partition": list(k[4]), "placement": list(k[5])}, "bench")
                    cal_rows.append((cm.estimate(s).iteration_s, v["measured"]))
            fitted = ", ".join(f"{p.name} {p.value:.3g}" for p in cal.fit.parameters if p.fitted) or "none identified"
            print(f"  round {rnd + 1}: from world size {ws_fit}: {fitted} (in-sample MAPE "
                  f"{cal.fit.mape_before_pct or 0:.1f} → {cal.fit.mape_after_pct or 0:.1f} %)")
        if len(cal_rows) >= 3:
            print(f"  round {rnd + 1} calibrated, out of sample: {fmt(figures(cal_rows))}")
    loads = [r.other_cores for r in gate.readings if r.other_cores is not None]
    probes = [r.probe_s * 1e3 for r in gate.readings]
    if probes:
        print(f"\nmachine during the run: other processes {min(loads, default=0):.2f}–{max(loads, default=0):.2f} "
              f"cores at the gate ({sum(not r.quiet for r in gate.readings)} of {len(gate.readings)} waits gave up); "
              f"speed probe {min(probes):.2f}–{max(probes):.2f} ms (gpt2-tiny block fwd+bwd, mbs 1)")
    print(f"load average now {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    write_json_atomic(out / "summary.json", {
        "rounds": [{str(ws): {label(k): v for k, v in rr[ws].items()} for ws in rr} for rr in per_round],
        "pooled": {str(ws): {label(k): {"predicted": p, "measured": m} for k, (p, m) in pooled[ws].items()}
                   for ws in pooled}})


if __name__ == "__main__":
    sys.exit(main())
