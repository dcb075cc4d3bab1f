"""``ampe report``: predicted vs measured for a trial results folder; plot; calibrated profile for the next search."""

from __future__ import annotations

import argparse

from ampe.cli._common import gib, print_table
from ampe.io import write_json_atomic
from ampe.report.compare import Report, build_report, plot_report


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="compare predicted and measured trials; plot; calibrate the cost model",
                       description="Read an `ampe trial --out DIR` folder and report how well the cost model "
                       "predicted the trials: Spearman rank correlation, MAPE, out-of-memory predicted vs observed, "
                       "the best measured strategy against the best predicted one, and frequency schedules' time "
                       "and energy with and without them.")
    p.add_argument("dir", metavar="DIR", help="results folder of `ampe trial`")
    p.add_argument("--plot", metavar="OUT.png", help="scatter plot of predicted vs measured iteration time")
    p.add_argument("--calibrate", metavar="OUT.csv",
                   help="write a calibrated per-layer profile for `ampe search --profile OUT.csv`")
    p.add_argument("--json", metavar="OUT.json", help="also write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    report = build_report(args.dir)
    _print(report)
    if args.plot:
        plot_report(report, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        write_json_atomic(args.json, report.to_dict())
        print(f"report written to {args.json}")
    if args.calibrate:
        from ampe.report.calibrate import calibrate

        cal = calibrate(report, args.calibrate)
        print(f"calibrated profile written to {args.calibrate}: {cal.rows} rows, compute × {cal.factor:.4g} "
              f"(fitted on {cal.strategies} measured strategies, {cal.method}; base: {cal.base_source}); "
              f"MAPE {cal.mape_before_pct:.1f} % → {cal.mape_after_pct:.1f} % on those strategies (in-sample). "
              f"Next: ampe search --profile {args.calibrate} ...")
    return 0


def _short(source: str | None) -> str:
    """``nvml`` or ``modelled``; the full labels are printed under the table."""
    return "" if source is None else ("nvml" if source == "nvml" else "modelled")


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "" if x is None else format(x, spec)


def _print(r: Report) -> None:
    rows = []
    for t in r.rows:
        rows.append([t.plan_rank, t.label, t.freq_backend if t.schedule_applied else "-", t.status,
                     _fmt(t.predicted_s), _fmt(t.measured_s), _fmt(t.measured_std_s), _fmt(t.error_pct, "+.1f"),
                     "" if t.predicted_fits is None else ("yes" if t.predicted_fits else "no"),
                     "" if t.predicted_memory_bytes is None else gib(t.predicted_memory_bytes),
                     "" if t.measured_memory_bytes is None else f"{gib(t.measured_memory_bytes)} ({t.memory_source})",
                     "" if t.energy_j is None else f"{t.energy_j:.3g} ({_short(t.energy_source)})",
                     "" if t.status == "ok" else (t.reason or "")])
    print_table(f"ampe report: {r.directory} ({len(r.rows)} trials)",
                ["rank", "strategy", "schedule", "status", "pred s", "meas s", "std s", "err %", "fits?",
                 "pred GiB", "meas GiB (source)", "J/iter", "reason"], rows)
    n = len(r.measured)
    rho = "n/a (needs ≥ 3 measured strategies)" if r.spearman is None else \
        f"{r.spearman:.3f} (p = {r.spearman_pvalue:.3g})"
    lines = [f"measured strategies: {n} of {len(r.fidelity)} run",
             f"Spearman ρ (predicted vs measured iteration time): {rho}",
             f"MAPE: {_fmt(r.mape_pct, '.1f') or 'n/a'} %; median measured/predicted: "
             f"{_fmt(r.median_ratio, '.3f') or 'n/a'}"]
    o = r.oom
    lines.append(f"out of memory — predicted fit & ran: {o.fit_ran}, predicted fit but OOM: {o.fit_oom}, predicted "
                 f"OOM but ran: {o.unfit_ran}, predicted OOM & OOM: {o.unfit_oom}, predicted OOM (not run): "
                 f"{o.unfit_not_run}, other failures: {o.other_failures}")
    bp, bm = r.best_predicted, r.best_measured
    if bp is not None:
        got = f"{bp.measured_s:.4f} s" if bp.measured_s is not None else bp.status
        lines.append(f"best predicted: rank {bp.plan_rank} {bp.label}, predicted {_fmt(bp.predicted_s)} s, "
                     f"measured {got}")
    if bm is not None:
        lines.append(f"best measured: rank {bm.plan_rank} {bm.label}, {bm.measured_s:.4f} s (predicted "
                     f"{_fmt(bm.predicted_s)} s; position {r.best_measured_position} (0-based) among measured "
                     f"strategies by prediction)")
    if r.best_ratio is not None:
        lines.append(f"predicted best / measured best: {r.best_ratio:.3f}×")
    if r.top10_mean_s is not None:
        lines.append(f"first {min(10, n)} measured in predicted order: mean {r.top10_mean_s:.4f} ± "
                     f"{r.top10_std_s:.4f} s (population std), min {r.top10_min_s:.4f} s")
    if r.energy_sources:
        lines.append("energy sources: " + "; ".join(r.energy_sources)
                     + ("" if all(s == "nvml" for s in r.energy_sources) else
                        " — modelled figures are not measurements"))
    print("\n".join(lines))
    if r.schedules:
        srows = [[s.plan_rank, s.label, s.freq_backend, f"{s.time_without_s:.4f}", f"{s.time_with_s:.4f}",
                  f"{s.measured_slowdown:.3f}", _fmt(s.predicted_slowdown, ".3f"), _fmt(s.energy_without_j, ".3g"),
                  _fmt(s.energy_with_j, ".3g"), _fmt(s.energy_saving_pct, "+.1f"),
                  _fmt(s.predicted_energy_saving_pct, "+.1f"), _short(s.energy_source)]
                 for s in r.schedules]
        print_table("frequency schedules: with vs without", ["rank", "strategy", "backend", "s without", "s with",
                    "slowdown", "pred slowdown", "J without", "J with", "saving %", "pred saving %", "energy"],
                    srows)
