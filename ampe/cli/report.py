"""``ampe report``: predicted vs measured for a trial results folder or a measurements file; plot; calibrated
profile for the next search."""

from __future__ import annotations

import argparse
import sys

from ampe.cli._common import add_seq_len, gib, load_inputs, print_table
from ampe.errors import InputError
from ampe.io import write_json_atomic
from ampe.report.compare import Report, build_report, plot_report
from ampe.units import si


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="compare predicted and measured trials; plot; calibrate the cost model",
                       description="Read an `ampe trial --out DIR` folder and report how well the cost model "
                       "predicted the trials: Spearman rank correlation, MAPE, out-of-memory predicted vs observed, "
                       "the best measured strategy against the best predicted one, and frequency schedules' time "
                       "and energy with and without them.")
    p.add_argument("dir", metavar="DIR", nargs="?", help="results folder of `ampe trial` (or give --measurements)")
    p.add_argument("--measurements", metavar="FILE.jsonl",
                   help="measurements from any source, one JSON object per line (docs/reference/measurements.md); "
                   "needs --cluster and --model")
    p.add_argument("--cluster", metavar="SPEC.yaml", help="with --measurements: the cluster they were measured on")
    p.add_argument("--model", metavar="NAME|MODEL.yaml", help="with --measurements: the model trained")
    add_seq_len(p)
    p.add_argument("--profile", metavar="PROFILE.csv", help="with --measurements: the per-layer profile to predict "
                   "from (default: the analytic model)")
    p.add_argument("--method", choices=("eq5", "simulate"), default="eq5",
                   help="with --measurements: pipeline-time method of the predictions (default: eq5)")
    p.add_argument("--plot", metavar="OUT.png", help="scatter plot of predicted vs measured iteration time")
    p.add_argument("--calibrate", metavar="OUT.csv",
                   help="fit the cost model's structural parameters to the measurements and write a calibrated "
                   "profile (and OUT.csv.calibration.json beside it) for `ampe search --profile OUT.csv`")
    p.add_argument("--json", metavar="OUT.json", help="also write the report as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    inputs, bad_lines = None, 0
    if args.measurements is not None:
        if args.dir is not None:
            raise InputError("DIR", "", "give a trials folder or --measurements, not both")
        for flag in ("cluster", "model"):
            if getattr(args, flag) is None:
                raise InputError(f"--{flag}", "", "required with --measurements")
        report, inputs, bad_lines = _from_measurements(args)
    else:
        if args.dir is None:
            raise InputError("DIR", "", "give a trials folder (ampe trial --out DIR) or --measurements FILE.jsonl")
        for flag in ("cluster", "model", "profile", "seq_len"):
            if getattr(args, flag) is not None:
                raise InputError(f"--{flag.replace('_', '-')}", "", "only with --measurements (a trials folder names "
                                 "its own)")
        report = build_report(args.dir)
    _print(report)
    if args.plot:
        plot_report(report, args.plot)
        print(f"plot written to {args.plot}")
    if args.json:
        write_json_atomic(args.json, report.to_dict())
        print(f"report written to {args.json}")
    if args.calibrate:
        from ampe.cli._progress import PhaseProgress
        from ampe.report.calibrate import calibrate

        with PhaseProgress("ampe report", "calibrating", "leave-one-out fits") as progress:
            cal = calibrate(report, args.calibrate, inputs, progress.update)
        _print_calibration(cal, args.calibrate)
    if bad_lines:
        sys.stderr.write(f"ampe report: {bad_lines} bad measurement line(s) left out (listed above)\n")
        return 2
    return 0


def _from_measurements(args: argparse.Namespace):
    """The report of a measurements file; bad lines are printed to stderr, one each."""
    from ampe.formats.measurement import read_measurements
    from ampe.report.calibration.measured import CalibrationInputs
    from ampe.report.measurements import report_from_measurements

    cluster, model, profile = load_inputs(args)
    mfile = read_measurements(args.measurements)
    got = report_from_measurements(mfile, cluster, model, profile, args.method)
    for e in got.errors:
        sys.stderr.write(f"ampe report: error: {e}\n")
    repeated = [r for r in got.runs if len(r.lines) > 1]
    if repeated:
        print(f"{sum(len(r.lines) for r in got.runs)} good lines, {len(got.runs)} distinct strategies: "
              f"{len(repeated)} measured on several lines (for example lines {','.join(map(str, repeated[0].lines))}); "
              "their ok times are averaged, with the spread under std s")
    gbs = max((r.strategy.gbs for r in got.runs), default=1)
    inputs = CalibrationInputs(cluster, model, profile, args.profile, gbs, args.method, args.measurements)
    return got.report, inputs, len(got.errors)


def _print_calibration(cal, path: str) -> None:
    f = cal.fit
    if cal.selected_on < f.strategies:
        print(f"calibration: structure selected and leave-one-out figures on {cal.selected_on} of the {f.strategies} "
              "strategies, spread evenly over the measured times (bounded work); parameters fitted on all")
    held = f"no: held by {f.structure}"  # the selected structure does not move it: it stays uncalibrated
    rows = [[p.name, f"{p.value:.4g}" + (" (at its bound)" if p.at_bound else ""), f"{p.prior:.4g}",
             "yes" if p.fitted else held if p.moved is False else "no",
             "" if p.posterior_sd is None else f"{p.posterior_sd:.3g}"] for p in f.parameters]
    how = f"structure selected by leave-one-out ranking: {f.structure or 'full'}" if f.candidates else \
        f"structure {f.structure or 'scale'}: one time factor, as fewer than 4 strategies allow no selection"
    print_table(f"calibration: {f.strategies} measured strategies ({cal.method}; {how})",
                ["parameter", "value", "uncalibrated", "identified by the data?",
                 "posterior sd (factors: log; instruction s: ms)"], rows)
    loo = "n/a (needs ≥ 3 strategies)" if f.loo_mape_pct is None else \
        f"MAPE {f.loo_mape_pct:.1f} %, Spearman {_fmt(f.loo_spearman, '.3f') or 'n/a'}"
    if f.candidates:
        worse = " (not allowed: orders worse than scale)"
        print("candidate structures, leave-one-out on these strategies (pairs placed the wrong way, weighted / plain; "
              "MAPE): " + ", ".join(f"{c.structure} {c.discordance:.3f} / {c.plain_discordance:.3f} "
                                   f"{c.loo_mape_pct:.1f} %{'' if c.allowed else worse}" for c in f.candidates))
    print(f"in-sample MAPE {_fmt(f.mape_before_pct, '.1f')} % → {_fmt(f.mape_after_pct, '.1f')} %; uncalibrated "
          f"Spearman {_fmt(f.spearman_before, '.3f') or 'n/a'}; leave-one-out {loo}")
    for caution in f.cautions:
        print(f"caution: {caution}")
    print(f"calibrated profile written to {path} ({cal.rows} rows; base: {cal.base_source}) and {cal.sidecar}. "
          f"Next: ampe search --profile {path} ..." + (" (it carries the cautions above)" if f.cautions else ""))


def _short(source: str | None) -> str:
    """What a J/iter figure is, in one word — ``nvml``, ``measured``, ``modelled`` or ``mixed`` — from its record's
    label (the full labels are printed under the table)."""
    if source is None:
        return ""
    return source.split(" ")[0].rstrip(":;,") or source


def _gib(nbytes: int | None) -> str:
    return "" if nbytes is None else gib(nbytes)


def _energy(j: float | None) -> str:
    return "" if j is None else si(j, "J")


def _fmt(x: float | None, spec: str = ".4f") -> str:
    return "" if x is None else format(x, spec)


def _print(r: Report) -> None:
    rows = []
    footprint = any(t.measured_reserved_bytes is not None or t.measured_device_used_bytes is not None
                    for t in r.rows)  # the columns only where a record has them
    for t in r.rows:
        rows.append([t.plan_rank, t.label, t.freq_backend if t.schedule_applied else "-", t.status,
                     _fmt(t.predicted_s), _fmt(t.measured_s), _fmt(t.measured_std_s), _fmt(t.error_pct, "+.1f"),
                     t.fits_label, "" if t.predicted_memory_bytes is None else gib(t.predicted_memory_bytes),
                     "" if t.measured_memory_bytes is None else f"{gib(t.measured_memory_bytes)} ({t.memory_source})"]
                    + ([_gib(t.measured_reserved_bytes), _gib(t.measured_device_used_bytes)] if footprint else [])
                    + ["" if t.energy_j is None else f"{si(t.energy_j, 'J')} ({_short(t.energy_source)})",
                       "" if t.status == "ok" else (t.reason or "")])
    print_table(f"ampe report: {r.directory} ({_count(len(r.rows), 'trial')} of "
                f"{_count(len({t.plan_rank for t in r.rows}), 'strategy', 'strategies')})",
                ["rank", "strategy", "schedule", "status", "pred s", "meas s", "std s", "err %", "fits?",
                 "pred GiB (footprint)", "meas GiB (allocated, source)"]
                + (["meas reserved GiB", "meas device GiB"] if footprint else [])
                + ["energy/iter (source)", "reason"], rows)
    sources = sorted({t.device_used_source for t in r.rows if t.device_used_source})
    if footprint and sources:
        print("meas reserved GiB: the caching allocator's reserved peak (torch.cuda.max_memory_reserved); meas device "
              "GiB: " + "; ".join(sources))
    for t in r.rows:
        for c in t.caveats:
            print(f"rank {t.plan_rank} {t.label}: {c.label}: {c.note}")
    from ampe.report.calibrate import load_caution

    load = load_caution([t for t in r.rows if t.measured_s is not None])
    if load:
        print(f"caution: {load}: their times, slowdowns and energy savings include that load, not only the strategy")
    n = len(r.measured)
    rho = "n/a (needs ≥ 3 measured strategies)" if r.spearman is None else \
        f"{r.spearman:.3f} (p = {r.spearman_pvalue:.3g})"
    lines = [f"measured strategies: {n} of {len(r.fidelity)} run",
             f"Spearman ρ (predicted vs measured iteration time): {rho}",
             f"MAPE: {'n/a' if r.mape_pct is None else _fmt(r.mape_pct, '.1f') + ' %'}; median measured/predicted: "
             f"{_fmt(r.median_ratio, '.3f') or 'n/a'}"]
    o = r.oom
    lines.append(f"out of memory — predicted fit & ran: {o.fit_ran}, predicted fit but OOM: {o.fit_oom}, predicted "
                 f"at risk & ran: {o.at_risk_ran}, predicted at risk & OOM: {o.at_risk_oom}, predicted OOM but ran: "
                 f"{o.unfit_ran}, predicted OOM & OOM: {o.unfit_oom}, predicted OOM (not run): "
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
                     + (" — modelled figures are not measurements" if any("modelled" in s for s in r.energy_sources)
                        else ""))
    print("\n".join(lines))
    for note in r.notes:  # the plan and the run differ, or a record did not say how it ran
        print(f"note: {note}")
    if r.schedules:
        srows = [[s.plan_rank, s.label, s.freq_backend, f"{s.time_without_s:.4f}", f"{s.time_with_s:.4f}",
                  f"{s.measured_slowdown:.3f}", _fmt(s.predicted_slowdown, ".3f"), _energy(s.energy_without_j),
                  _energy(s.energy_with_j), _fmt(s.energy_saving_pct, "+.1f"),
                  _fmt(s.predicted_energy_saving_pct, "+.1f"), _short(s.energy_source)]
                 for s in r.schedules]
        print_table("frequency schedules: with vs without", ["rank", "strategy", "backend", "s without", "s with",
                    "slowdown", "pred slowdown", "energy without", "energy with", "saving %", "pred saving %",
                    "energy source"],
                    srows)


def _count(n: int, one: str, many: str | None = None) -> str:
    """``1 trial``, ``6 trials``: a count with its noun in agreement."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
