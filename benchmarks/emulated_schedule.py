"""Emulated frequency schedule on real CPU trials: a T_min frequency plan must not slow training down (≤ 2% on the
mean over repeats, the issue's acceptance) while the modelled energy drops as planned.

Loop (this machine: 2 cores, DeepSpeed over gloo, world size 2):

1. ``ampe profile`` gpt2-tiny on one core (tp 1; mbs 1, 2, 4), unless ``--profile`` is given;
2. for each ``--margins`` value G: ``ampe search --pp 2 --objective energy --max-slowdown 0 --slack-margin G`` on
   ``cluster_specs/local-cpu.yaml``: the fastest 2-stage pipeline (stages are imbalanced: the LM head sits on stage
   1) at its T_min point, i.e. the least energy without slowing the iteration, with its frequency plan; G = 0 is
   Perseus as published, G > 0 keeps that fraction of every slowed computation as slack (docs/energy.md §10.4);
3. ``--repeats`` rounds; in each, per plan, one trial whose timed iterations **alternate** without and with the plan
   (job ``alternate_schedule``; backend ``emulate``: every planned forward/backward is stretched by the DVFS
   model's time ratio of its clock). Neighbouring iterations see the same machine, so the machine's drift and
   other users' load (this 2-core VM is shared and its speed swings by tens of percent within a minute) cancel out
   of the comparison. Each trial starts behind a quiet-machine gate (:class:`benchmarks.support.quiet.QuietGate`);
4. ``--separate`` also runs the runner's own pair per plan and round (``ampe trial``: the strategy without a
   schedule and, as a second trial, with it; :func:`benchmarks.support.gated.run_gated`), which the machine's drift
   between the two trials disturbs more;
5. prints, per plan: time without and with the schedule (mean ± std over repeats of the per-trial means), the
   slowdown of the mean and paired per repeat, modelled energy without and with against the planned saving, and per
   stage the busy time and the emulated stretch (diagnostics).

Energy is *modelled* everywhere here (no RAPL/cpufreq; the ``cpu`` type's DVFS parameters are assumptions).

Run: ``.venv/bin/python benchmarks/emulated_schedule.py [--repeats 5] [--iters 40] [--margins 0,0.05]
[--separate] [--out runs/emulated-schedule]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from ampe.cli import main as ampe
from ampe.io import read_json, write_json_atomic
from ampe.trials.launch import build_launch, job_dict
from ampe.trials.prepare import TrialOptions, prepare
from benchmarks.support.quiet import QuietGate

MODEL = "gpt2-tiny"
SPEC = ROOT / "cluster_specs" / "local-cpu.yaml"


def _ms(xs: list[float], digits: int = 4) -> str:
    m = statistics.fmean(xs)
    s = statistics.stdev(xs) if len(xs) > 1 else 0.0
    return f"{m:.{digits}f} ± {s:.{digits}f}"


def plan(out: Path, profile: str, cluster: str, gbs: int, margin: float) -> tuple[Path, dict]:
    """Search the T_min plan with a slack margin; returns the plan path and its rank-1 strategy."""
    path = out / f"plan-margin{margin:g}.json"
    code = ampe(["search", "--cluster", cluster, "--model", MODEL, "--profile", profile, "--global-batch", str(gbs),
                 "--pp", "2", "--objective", "energy", "--max-slowdown", "0", "--slack-margin", str(margin),
                 "--top-k", "1", "--out", str(path), "--timeline", str(out / f"timeline-margin{margin:g}.png")])
    if code:
        sys.exit(f"ampe search failed ({code})")
    entry = read_json(path)["strategies"][0]
    if entry.get("frequency_plan") is None:
        sys.exit("the T_min plan keeps every clock at its maximum: nothing to emulate (balanced stages?)")
    return path, entry


def interleaved(plan_path: Path, job_dir: Path, warmup: int, iters: int, seed: int) -> dict:
    """One trial whose timed iterations alternate without / with the plan; returns per-iteration figures."""
    opts = TrialOptions(out_dir=job_dir.parent, top_k=1, freq_backend="emulate", baseline=False, warmup_iters=warmup,
                        timed_iters=iters, seed=seed)
    ctx, trials, _ = prepare(plan_path, opts)
    t = trials[0]
    job_dir.mkdir(parents=True, exist_ok=True)
    job = job_dict(ctx, t, job_dir)
    job["alternate_schedule"] = True
    job_path = job_dir / "job.json"
    write_json_atomic(job_path, job)
    launch = build_launch(ctx, t, str(job_path))
    with open(job_dir / "launcher.log", "w") as log:
        proc = subprocess.run(list(launch.argv), env={**os.environ, **launch.env}, stdout=log,
                              stderr=subprocess.STDOUT, timeout=600)
    if proc.returncode or not (job_dir / "result.json").exists():
        return {"ok": False, "reason": f"exit {proc.returncode}, see {job_dir / 'launcher.log'}"}
    res = read_json(job_dir / "result.json")
    ranks = sorted(res["ranks"], key=lambda r: r["rank"])
    flags = ranks[0]["scheduled_per_iter"]
    energy = [sum(r["energy_j_per_iter"][i] for r in ranks) for i in range(len(flags))]
    times = res["iteration_s"]
    pick = lambda xs, want: [x for x, f in zip(xs, flags, strict=False) if f == want]  # noqa: E731
    pairs = [(times[i], times[i + 1]) for i in range(0, len(flags) - 1, 2) if not flags[i] and flags[i + 1]]
    busy = {r["stage"]: {w: statistics.fmean(pick(r["compute_s_per_iter"], w)) for w in (False, True)}
            for r in ranks}
    stretch = {r["stage"]: statistics.fmean(pick(r["emulated"]["stretch_s_per_iter"], True)) for r in ranks}
    return {"ok": res.get("plan_applied") and res.get("instructions_ok"), "without_s": statistics.fmean(pick(times,
            False)), "with_s": statistics.fmean(pick(times, True)),
            "paired_pct": statistics.fmean(100.0 * (b / a - 1.0) for a, b in pairs),
            "energy_without_j": statistics.fmean(pick(energy, False)),
            "energy_with_j": statistics.fmean(pick(energy, True)), "busy_s": busy, "stretch_s": stretch,
            "other_cores": res.get("host_other_cores"), "reason": ";".join(res.get("instruction_mismatches", []))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="rounds (default 5)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=40, help="timed iterations per trial, alternating (default 40)")
    ap.add_argument("--global-batch", type=int, default=8)
    ap.add_argument("--profile", help="per-layer profile CSV (default: measure one)")
    ap.add_argument("--cluster", default=str(SPEC), help="cluster spec (default cluster_specs/local-cpu.yaml)")
    ap.add_argument("--margins", default="0,0.05",
                    help="slack margins to plan with (ampe search --slack-margin), comma-separated (default 0,0.05)")
    ap.add_argument("--separate", action="store_true",
                    help="also run the runner's separate trials without / with the schedule (ampe trial)")
    ap.add_argument("--max-wait", type=float, default=90.0, help="longest wait for a quiet machine, s (90)")
    ap.add_argument("--out", default=str(ROOT / "runs" / "emulated-schedule"))
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    profile = args.profile
    if profile is None:
        profile = str(out / "profile.csv")
        if ampe(["profile", "--model", MODEL, "--device", "cpu", "--tp", "1", "--mbs", "1,2,4", "--warmup", "3",
                 "--repeats", "10", "--out", profile]):
            sys.exit("ampe profile failed")
    margins = [float(x) for x in args.margins.split(",")]
    plans = {m: plan(out, profile, args.cluster, args.global_batch, m) for m in margins}
    entry = plans[margins[0]][1]
    pred = entry["predicted"]
    print(f"\nstrategy: pp{entry['pp']}·dp{entry['dp']}·tp{entry['tp']}·mbs{entry['mbs']} partition "
          f"{entry['partition']}, predicted stage times (fwd+bwd per micro-batch) "
          f"{[round(x * 1e3, 2) for x in pred['stage_times_s']]} ms, {pred['iteration_s']:.4f} s/iter")
    for m, (_, e) in plans.items():
        p, fp = e["predicted"], e["frequency_plan"]
        print(f"  margin {m:g}: T_min plan {fp['time_s']:.4f} s/iter, energy {p['energy_max_clock_j']:.3f} J → "
              f"{p['energy_j']:.3f} J ({p['energy_savings_pct']:.1f}% saved; modelled); stage-0 clocks "
              f"{[f for _, _, f in fp['stages'][0]]}")

    gate = QuietGate(max_wait_s=args.max_wait)
    runs: dict[float, list[dict]] = {m: [] for m in margins}
    separate: dict[float, list] = {m: [] for m in margins}
    for rep in range(args.repeats):
        for k in range(len(margins)):
            m = margins[(k + rep) % len(margins)]  # rotate the order every round
            reading = gate.wait()
            r = interleaved(plans[m][0], out / "interleaved" / f"margin{m:g}-rep{rep}", args.warmup, args.iters, rep)
            r["gate_other_cores"] = reading.other_cores
            runs[m].append(r)
            print(f"  round {rep} margin {m:g}: " + (f"without {r['without_s']:.4f} s, with {r['with_s']:.4f} s "
                  f"({r['paired_pct']:+.2f}% paired), other load {r['other_cores']}" if r["ok"] else
                  f"FAILED {r['reason']}"), flush=True)
            if args.separate:
                from benchmarks.support.gated import run_gated

                common = dict(out_dir=out / "separate", top_k=1, warmup_iters=args.warmup,
                              timed_iters=args.iters // 2, seed=rep)
                base = run_gated(plans[m][0], TrialOptions(freq_backend="none", **common), gate, retries=1)[0]
                sched = run_gated(plans[m][0], TrialOptions(freq_backend="emulate", baseline=False, **common), gate,
                                  retries=1)[0]
                separate[m].append((base, sched))
    report(runs, separate, plans, margins, out, time.monotonic() - t0)


def report(runs: dict[float, list[dict]], separate: dict[float, list], plans: dict, margins: list[float],
           out: Path, seconds: float) -> None:
    print("\n=== gpt2-tiny, pp 2 on local-cpu (2 cores), emulate backend; energy modelled ===")
    summary: dict = {}
    for m in margins:
        ok = [r for r in runs[m] if r["ok"]]
        entry = plans[m][1]
        planned = entry["predicted"]["energy_savings_pct"]
        print(f"\n-- T_min plan, slack margin {m:g} ({len(ok)} of {len(runs[m])} interleaved trials ok) --")
        if not ok:
            continue
        without, with_ = [r["without_s"] for r in ok], [r["with_s"] for r in ok]
        slow = 100.0 * (statistics.fmean(with_) / statistics.fmean(without) - 1.0)
        paired = [r["paired_pct"] for r in ok]
        e0, e1 = [r["energy_without_j"] for r in ok], [r["energy_with_j"] for r in ok]
        saving = 100.0 * (1.0 - statistics.fmean(e1) / statistics.fmean(e0))
        print(f"time without schedule: {_ms(without)} s/iter (predicted {entry['predicted']['iteration_s']:.4f})")
        print(f"time with schedule:    {_ms(with_)} s/iter (predicted {entry['frequency_plan']['time_s']:.4f})")
        print(f"slowdown of the mean over repeats: {slow:+.2f}%; paired (neighbouring iterations) per repeat: "
              f"{_ms(paired, 2)} % → {'meets' if slow <= 2.0 else 'MISSES'} the ≤ 2% target")
        print(f"modelled energy without: {_ms(e0, 3)} J/iter, with: {_ms(e1, 3)} J/iter → {saving:.1f}% saved "
              f"(planned {planned:.1f}%)")
        for stage in sorted(ok[0]["busy_s"]):
            b0 = statistics.fmean(r["busy_s"][stage][False] for r in ok)
            b1 = statistics.fmean(r["busy_s"][stage][True] for r in ok)
            st = statistics.fmean(r["stretch_s"][stage] for r in ok)
            print(f"  stage {stage}: busy {1e3 * b0:.1f} ms/iter without, {1e3 * b1:.1f} with (emulated stretch "
                  f"{1e3 * st:.1f})")
        loads = [r["other_cores"] for r in ok if isinstance(r["other_cores"], (int, float))]
        if loads:
            print(f"  other processes kept {statistics.fmean(loads):.2f} cores busy on average (max {max(loads):.2f})")
        summary[f"{m:g}"] = {"without_s": without, "with_s": with_, "slowdown_pct": slow, "paired_pct": paired,
                             "energy_without_j": e0, "energy_with_j": e1, "saving_pct": saving,
                             "planned_saving_pct": planned}
        pairs = [(a, b) for a, b in separate[m] if a.status == "ok" and b.status == "ok"]
        if pairs:
            a_s, b_s = [a.iteration_s_mean for a, _ in pairs], [b.iteration_s_mean for _, b in pairs]
            sep = 100.0 * (statistics.fmean(b_s) / statistics.fmean(a_s) - 1.0)
            print(f"  separate trials (ampe trial's pair, {len(pairs)} rounds): without {_ms(a_s)}, with {_ms(b_s)} "
                  f"s/iter → {sep:+.2f}%")
            summary[f"{m:g}"]["separate_pct"] = sep
    print(f"\nresults: {out}; {seconds:.0f} s")
    (out / "summary.json").write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
