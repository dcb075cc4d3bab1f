"""Search scaling (issue: strategy search) and the gain of heterogeneity-aware search.

Part 1 — search time on N×N clusters (N nodes × N GPUs), GPT-2 24×1024 (gpt2-amp), gbs 32, exact DP, beside AMP's
Table 2 (58.0 / 325.6 / 890.3 / 1627.4 s for 2×2 … 16×16). Homogeneous = T4 nodes (AMP's g4dn); mixed = half p3
(V100) nodes, half g4dn (T4) nodes with AMP's het-cluster bandwidths.

Part 2 — predicted iteration time, under ampe's own cost model, of ampe's best, the Megatron heuristic's best and
AMP-compat's best, on the bundled specs.

Part 3 — scale (issue 16): ``make_plan`` (search, then energy planning or none) for GPT-3 175B at global batch 1024
on 64 / 256 / 1,024 / 4,096 GPUs of three types (8-GPU nodes: H100-80GB, A100-80GB and A100-40GB in equal thirds),
with ``--energy-planner none`` and the default (perseus), and at 4,096 with ``--allow-cross-node-tp``. Each run is a
fresh process so its peak RSS is its own; wall seconds, CPU seconds (user + system: what a loaded machine does not
inflate) and peak RSS are printed with their ratios to the targets (1,024 GPUs ≤ 10 s, 4,096 ≤ 60 s, ≤ 2 GB); the
time ratio is of CPU seconds (the development machine is shared: wall seconds there are 2-4× CPU seconds).

Last measured (2026-11-25 21:33 UTC, 2-core machine, load average 0.2-0.9; CPU s / peak RSS): 1,024 GPUs 6.4 s /
230 MB with ``--energy-planner none``, 9.2 s / 258 MB with perseus (search 6.1 s, energy 2.9 s); 4,096 GPUs 13.9 s /
432 MB, 15.7 s / 461 MB with perseus, 23.2 s / 660 MB with ``--allow-cross-node-tp``. docs/cost_model.md ("Costing at
scale") and docs/energy.md ("Energy side at 1,024 GPUs") have the history.

Part 4 — the whole ``ampe search`` command (issue 28): Llama-3.1-405B on 1,024 / 4,096 / 16,384 GPUs of the same
three types (``benchmarks/support/scale_specs.py``), default global batch, default energy planning (perseus), one
fresh process per size, ``--out`` a plan file. CPU seconds (user + system of that process, from ``wait4``) and its
peak RSS, with the growth from one size to the next and the ratio to the 16,384-GPU target (≤ 60 s CPU, ≤ 4 GB);
then ``ampe evaluate`` of one strategy on the 16,384-GPU spec (target ≤ 2 GB).

Last measured, part 4 (2026-11-26 19:37 UTC, load average 2.5-3.6; CPU s / peak RSS): 1,024 GPUs 10.5 s / 461 MB,
4,096 GPUs 19.1 s / 551 MB, 16,384 GPUs 20.0 s / 583 MB; evaluate at 16,384 0.3 s / 57 MB (docs/cost_model.md).
Since the exact memory bounds (3c83294) and uneven shares, 16,384 GPUs: 107.9 s / 1459 MB on main 5f7129e and
104.3 s / 1598 MB with the perf pass (2026-11-28 15:38-15:46 UTC, load average 5.6-7; docs/shares.md has the
profile and the back-to-back figures): issue 28's 60 s and issue 34's 30 s are not met. Branch fast16k (exact cuts,
same plan; 2026-11-28 18:33-18:48 UTC): 103.7 s main 8b7f46f (load 4.3) against 98.5 s (load 7.3), and 99.3 against
87.3 s in a second pair (load 7.9-8.9); search alone (--energy-planner none) 53.3 against 42.5 s (docs/shares.md).

On the quiet VM (main 3a00f31, 2026-11-28 23:32 UTC, load average 1.1): 16,384 GPUs 81.3 s CPU / 1533 MB (2.71x
issue 34's 30 s, 1.36x issue 28's 60 s). With the replicas' inputs built once per distinct replica (2026-11-29
00:29 UTC, load average 1.5; the same command by /usr/bin/time): 67.9 s CPU / 1506 MB (73.0 s / 1467 MB at 00:56 on
2d0fa94), the plan identical to
2889dd1's, which took 90.2 s an hour before: the cut is about 3 s of that, the rest noise between runs (its search
phase, unchanged, took 48.7 s there and 34.8 s here; docs/shares.md has where the seconds go).

Run: .venv/bin/python benchmarks/search_scaling.py [--quick] [--part 1,2,3,4] [--sizes 64,256,1024,4096]
[--whole-sizes 1024,4096,16384]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.zoo import load_model
from ampe.search.baselines import megatron_candidates
from ampe.search.engine import SearchOptions, search
from benchmarks.support.scale_specs import three_types, three_types_yaml

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


SCALE_TARGET_S = {1024: 10.0, 4096: 60.0}
RSS_TARGET_BYTES = 2e9


def scale_one(n: int, planner: str, cross_node_tp: bool) -> dict:
    """One ``make_plan`` run in this process; returns its figures (seconds, bytes)."""
    from ampe.planning import PlanRequest, make_plan

    cluster, model = cluster_from_dict(three_types(n)), load_model("gpt3-175b")
    request = PlanRequest(SearchOptions(gbs=1024, allow_cross_node_tp=cross_node_tp), energy_planner=planner)
    before = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    res = make_plan(cluster, model, None, request)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_SELF)
    best = res.plan.strategies[0]
    return {"wall_s": wall, "cpu_s": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "search_s": res.search.seconds, "energy_s": res.energy.seconds if res.energy else 0.0,
            "rss_bytes": after.ru_maxrss * 1024, "candidates": res.search.candidates,
            "pruned": res.search.pruned_oom, "best_s": best.predicted.iteration_s}


def part3(sizes: list[int], timeout_s: float) -> None:
    print("\nPart 3: make_plan, GPT-3 175B, gbs 1024, three GPU types (H100-80GB / A100-80GB / A100-40GB), 1 job, "
          "one process per run")
    print(f"{'GPUs':>5} {'energy':>7} {'xtp':>3} | {'wall s':>7} {'cpu s':>7} {'search':>7} {'energy':>7} | "
          f"{'RSS MB':>7} | {'cands':>5} {'pruned':>6} {'best s/it':>9} | vs target (CPU s, RSS)")
    # energy planning off first (the search alone), then the cross-node-tp search, then with the energy planner
    runs = [(n, "none", False) for n in sizes] + [(4096, "none", True)] * (4096 in sizes)
    runs += [(n, "perseus", False) for n in sizes]
    for n, planner, xtp in runs:
        cmd = [sys.executable, __file__, "--one", f"{n},{planner},{int(xtp)}"]
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
        except subprocess.TimeoutExpired:
            print(f"{n:>5} {planner:>7} {'yes' if xtp else 'no':>3} | did not finish in {timeout_s:.0f} s")
            continue
        except subprocess.CalledProcessError as e:
            print(f"{n:>5} {planner:>7} {'yes' if xtp else 'no':>3} | failed after "
                  f"{time.perf_counter() - t0:.0f} s: {e.stderr.strip().splitlines()[-1:]}")
            continue
        r = json.loads(out.strip().splitlines()[-1])
        target = SCALE_TARGET_S.get(n)
        ratio = f"{r['cpu_s'] / target:5.2f}x of {target:.0f} s" if target else f"{'-':>14}"
        print(f"{n:>5} {planner:>7} {'yes' if xtp else 'no':>3} | {r['wall_s']:7.1f} {r['cpu_s']:7.1f} "
              f"{r['search_s']:7.1f} {r['energy_s']:7.1f} | {r['rss_bytes'] / 1e6:7.0f} | {r['candidates']:5d} "
              f"{r['pruned']:6d} {r['best_s']:9.3f} | {ratio}, {r['rss_bytes'] / RSS_TARGET_BYTES:4.2f}x of 2 GB")


WHOLE_MODEL = "llama-3.1-405b"
WHOLE_TARGET = (60.0, 4e9)  # 16,384 GPUs: CPU seconds, peak RSS bytes (issue 28)
WHOLE_CPU_TARGET_34 = 30.0  # 16,384 GPUs: the stricter CPU seconds of issue 34 (uneven shares: "stays ≤ 30 s")
EVALUATE_TARGET_BYTES = 2e9  # ampe evaluate at 16,384 devices (issue 26)


def _measured(cmd: list[str], timeout_s: float) -> tuple[int, float, float, float, str]:
    """Run ``cmd`` as its own process: (exit code, CPU s (user + system), wall s, peak RSS bytes, last stderr line),
    from ``wait4`` on that process alone (killed after ``timeout_s``)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        timer = threading.Timer(timeout_s, proc.kill)
        timer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        timer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
        wall = time.perf_counter() - t0
        err.seek(0)
        tail = " ".join(err.read().decode(errors="replace").strip().splitlines()[-1:])
    return proc.returncode, usage.ru_utime + usage.ru_stime, wall, usage.ru_maxrss * 1024, tail


def part4(sizes: list[int], timeout_s: float) -> None:
    print(f"\nPart 4: the whole `ampe search` process, {WHOLE_MODEL}, default global batch and energy planning "
          f"(perseus), --out PLAN; one process per size; load average {os.getloadavg()[0]:.1f} at the start")
    print(f"{'GPUs':>6} | {'cpu s':>7} {'wall s':>7} {'RSS MB':>7} | {'x cpu':>6} {'x RSS':>6} (vs previous size) | "
          f"vs 16,384 target ({WHOLE_TARGET[0]:.0f} s CPU, {WHOLE_TARGET[1] / 1e9:.0f} GB; issue 34: "
          f"{WHOLE_CPU_TARGET_34:.0f} s CPU)")
    prev = None
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            spec = Path(tmp) / f"three-types-{n}.yaml"
            spec.write_text(three_types_yaml(n))
            cmd = [sys.executable, "-m", "ampe", "search", "--cluster", str(spec), "--model", WHOLE_MODEL,
                   "--out", str(Path(tmp) / f"plan-{n}.json")]
            code, cpu, wall, rss, tail = _measured(cmd, timeout_s)
            if code != 0:
                print(f"{n:>6} | exit {code} after {wall:.0f} s: {tail}")
                prev = None
                continue
            growth = (f"{cpu / prev[0]:6.2f} {rss / prev[1]:6.2f}" if prev else f"{'-':>6} {'-':>6}")
            plan_mb = (Path(tmp) / f"plan-{n}.json").stat().st_size / 1e6
            print(f"{n:>6} | {cpu:7.1f} {wall:7.1f} {rss / 1e6:7.0f} | {growth} {'':>19} | "
                  f"{cpu / WHOLE_TARGET[0]:4.2f}x, {rss / WHOLE_TARGET[1]:4.2f}x; {cpu / WHOLE_CPU_TARGET_34:4.2f}x "
                  f"(plan {plan_mb:.1f} MB)")
            prev = (cpu, rss)
        n = max(sizes)
        spec, strat = Path(tmp) / f"three-types-{n}.yaml", Path(tmp) / "strategy.json"
        spec.write_text(three_types_yaml(n))
        strat.write_text(json.dumps({"pp": 16, "dp": n // 128, "tp": 8, "mbs": 1, "gbs": n}))
        code, cpu, wall, rss, tail = _measured([sys.executable, "-m", "ampe", "evaluate", "--cluster", str(spec),
                                                "--model", WHOLE_MODEL, "--strategy", str(strat)], timeout_s)
        print(f"ampe evaluate, {n} GPUs (pp 16 × dp {n // 128} × tp 8): exit {code}, {cpu:.1f} s CPU, "
              f"{rss / 1e6:.0f} MB peak RSS ({rss / EVALUATE_TARGET_BYTES:.2f}x of 2 GB)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only 2x2 … 16x16 (part 1), and up to 1,024 GPUs (part 3)")
    ap.add_argument("--part", default="1,2,3,4", help="which parts to run (default 1,2,3,4)")
    ap.add_argument("--whole-sizes", default="1024,4096,16384", help="part 4 cluster sizes (default 1024,4096,16384)")
    ap.add_argument("--sizes", default=None, help="part 3 cluster sizes (default 64,256,1024,4096)")
    ap.add_argument("--timeout", type=float, default=600.0, help="part 3: seconds allowed per run (default 600)")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # N,PLANNER,XTP: one part-3 run, JSON out
    args = ap.parse_args()
    if args.one:
        n, planner, xtp = args.one.split(",")
        print(json.dumps(scale_one(int(n), planner, xtp == "1")))
        return
    parts = {int(p) for p in args.part.split(",")}
    if 1 in parts:
        part1([2, 4, 8, 16] if args.quick else [2, 4, 8, 16, 32])
    if 2 in parts:
        part2()
    if 3 in parts:
        default = "64,256,1024" if args.quick else "64,256,1024,4096"
        part3([int(x) for x in (args.sizes or default).split(",")], args.timeout)
    if 4 in parts:
        part4([int(x) for x in args.whole_sizes.split(",")], args.timeout)


if __name__ == "__main__":
    main()
