"""DVFS fit table: the model fitted to the shipped clock sweeps, per catalog GPU type (docs/energy.md §1).

Prints, per type and data source: points, mean |relative error| of time and energy ratios, and the mean best
per-computation saving measured vs predicted, for (a) a fresh fit (`ampe.energy.dvfs_fit.fit`) and (b) the catalog's
parameters (`ampe.energy.dvfs.PARAMS`), plus the earlier model for comparison. Run: `.venv/bin/python
benchmarks/dvfs_fit.py`. Then a held-out check of the activity slopes (A40, leave one network's traces out) and the
whole-pipeline savings.
"""

from __future__ import annotations

import time
from pathlib import Path

from ampe.costmodel.catalog import CATALOG
from ampe.energy import dvfs
from ampe.energy.dvfs_fit import fit, fit_error, read_clock_profile, read_power_limit_trace

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
PERSEUS = DATA / "perseus" / "stage_profile"
ZEUS = DATA / "zeus_power_limit"
EARLIER = {  # the model before the fit (α, valley clock; s derived), for the "earlier" column
    "A100-80GB": dvfs._old(0.5, 990 / 1410, 360.0, 70.0, "earlier"),
    "A40": dvfs._old(0.5, 1130 / 1740, 270.0, 70.0, "earlier"),
    "V100-16GB": dvfs._old(0.45, 1020 / 1530, 270.0, 60.0, "earlier"),
}

# type → (source label, clock-sweep files, power-limit files, used for the fit)
SOURCES = {
    "A100-80GB": [("Perseus A100 SXM profiles", sorted(PERSEUS.glob("*a100*.csv")), [], True)],
    "A40": [("Perseus A40 profiles", sorted(PERSEUS.glob("*a40*.csv")), [], True),
            ("Zeus A40 power limits", [], [ZEUS / "summary_power_a40.csv"], True)],
    "V100-16GB": [("Zeus V100 power limits", [], [ZEUS / "summary_power_v100.csv"], True)],
}


def main() -> None:
    print("catalog = ampe.energy.dvfs.PARAMS (the fit, rounded); refit = fit() run now on the same data; "
          "earlier = the model before the fit")
    print(f"{'type':10} {'source':26} {'n':>5} {'used':>4} | {'time err':>8} {'energy err':>10} | "
          f"{'best saving: measured':>21} {'catalog':>7} {'refit':>6} {'earlier':>7} | refit err t/e | fit s")
    for name, sources in SOURCES.items():
        gpu = CATALOG[name]
        loaded = [(label, [s for f in c for s in read_clock_profile(str(f))],
                   [s for f in z for s in read_power_limit_trace(str(f))], used) for label, c, z, used in sources]
        t0 = time.perf_counter()
        fitted = fit(gpu, [s for _, c, _, u in loaded if u for s in c], [s for _, _, z, u in loaded if u for s in z],
                     source="fitted")
        took = time.perf_counter() - t0
        for label, c, z, used in loaded:
            sweeps = [*c, *z]
            e = fit_error(fitted, gpu, sweeps)
            cat = fit_error(dvfs.params_for(gpu), gpu, sweeps)
            old = fit_error(EARLIER[name], gpu, sweeps)
            print(f"{name:10} {label:26} {cat.points:5d} {'yes' if used else 'no':>4} | {100 * cat.time_err:7.1f}% "
                  f"{100 * cat.energy_err:9.1f}% | {100 * cat.measured_saving:20.1f}% "
                  f"{100 * cat.predicted_saving:6.1f}% {100 * e.predicted_saving:5.1f}% "
                  f"{100 * old.predicted_saving:6.1f}% | {100 * e.time_err:5.1f}%/{100 * e.energy_err:.1f}% "
                  f"| {took:.1f}")
        print(f"  {name} refit: {fitted}")
    for name in ("H100-80GB", "RTX3090", "T4", "cpu"):
        p = dvfs.params_for(CATALOG[name])
        print(f"{name:10} {p.source}")


def _network(label: str) -> str:
    return "/".join(label.split(":")[-1].split("/")[:2])


def held_out() -> None:
    """Held-out check of the activity slopes (docs/energy.md §1): the A40 model fitted on the Perseus profiles and the
    traces of every network but one, its error on the left-out network's traces (none of its points seen), with
    the slopes and without (β = γ = 0); pooled over the five networks."""
    import numpy as np

    from ampe.energy.dvfs_fit import predict_limit_sweep

    gpu = CATALOG["A40"]
    clock = [s for f in sorted(PERSEUS.glob("*a40*.csv")) for s in read_clock_profile(str(f))]
    traces = read_power_limit_trace(str(ZEUS / "summary_power_a40.csv"))

    def errors(p: dvfs.DvfsParams, sweeps: list) -> np.ndarray:
        out = []
        for s in sweeps:
            pt, _ = predict_limit_sweep(p, gpu, s)
            out.append(np.abs(pt[:-1] / (s.time_s[:-1] / s.time_s[-1]) - 1.0))
        return np.concatenate(out)

    print("\nHeld out (A40): fitted on the Perseus profiles + the traces of the other networks; mean |error| of the "
          "left-out network's trace points")
    print(f"{'left out':32} {'workloads':>9} | {'slopes':>7} {'none':>7} | profile saving gap (slopes)")
    pooled: dict[bool, list[np.ndarray]] = {True: [], False: []}
    t0 = time.process_time()
    for net in sorted({_network(s.label) for s in traces}):
        train = [s for s in traces if _network(s.label) != net]
        test = [s for s in traces if _network(s.label) == net]
        row = {}
        for slopes in (True, False):
            p = fit(gpu, clock, train, source="fitted", activity_slope=slopes)
            pooled[slopes].append(e := errors(p, test))
            row[slopes] = (float(e.mean()), fit_error(p, gpu, clock))
        gap = row[True][1].measured_saving - row[True][1].predicted_saving
        print(f"{net:32} {len(test):9d} | {100 * row[True][0]:6.1f}% {100 * row[False][0]:6.1f}% | {100 * gap:.1f} pts")
    print(f"{'pooled':32} {len(traces):9d} | {100 * np.concatenate(pooled[True]).mean():6.1f}% "
          f"{100 * np.concatenate(pooled[False]).mean():6.1f}% | ({time.process_time() - t0:.0f} s CPU for 10 fits)")


def _modelled(measured: list, gpu: object, model_options: object) -> list:
    """Stage specs with the model's options: each computation's measured top-clock time, the profile's clocks."""
    return [{k: model_options(gpu, max(ops.options, key=lambda o: o.mhz).time_s,  # type: ignore[operator]
                              clocks_mhz=[o.mhz for o in ops.options]) for k, ops in st.items()} for st in measured]


PIPELINES = [("gpt3-175b+a100_sxm_bf16.csv", "A100-80GB", 83.64), ("bloom+a100_sxm_bf16.csv", "A100-80GB", 83.64),
             ("gpt3-175b+a40_bf16.csv", "A40", 70.38), ("bloom+a40_bf16.csv", "A40", 70.38)]


def pipelines(microbatches: int = 12, unit_s: float = 1e-3) -> None:
    """Whole pipelines: Perseus's 8-stage 1F1B on the measured profile vs the same stages on the model.

    The model gets each computation's measured time at the top clock and the profile's clocks; energy saved is
    against all clocks at maximum, at T_min (no slowdown) and at T* (least energy), each on its own curve.
    """
    from ampe.energy.bloat import PipelineFrontier
    from ampe.energy.model_options import model_options
    from ampe.energy.pipeline_dag import build_dag
    from ampe.energy.profile_csv import load_instruction_profile
    from ampe.tradeoff.evaluate import evaluate_choice, fastest_choice
    from ampe.tradeoff.frontier import trace_frontier

    def savings(specs: list, watts: float) -> tuple[float, float]:
        dag = build_dag(specs, microbatches, schedule="1f1b", blocking_w=[watts] * len(specs))
        traced = trace_frontier(dag, unit_s)
        pf = PipelineFrontier(tuple(traced.points()), traced.table.total_blocking_w,
                              evaluate_choice(dag, fastest_choice(dag), traced.table))
        base = pf.all_max.energy_j
        return 100 * (1 - pf.points[0].energy_j / base), 100 * (1 - min(p.energy_j for p in pf.points) / base)

    print(f"\nPipelines, 8 stages × {microbatches} micro-batches, 1F1B, τ {unit_s:g} s: energy saved vs all-max (%)")
    print(f"{'profile':30} {'at T_min: measured':>18} {'model':>6} {'earlier':>7} | "
          f"{'least energy: measured':>22} {'model':>6} {'earlier':>7}")
    for name, gpu_name, watts in PIPELINES:
        gpu = CATALOG[gpu_name]
        prof = load_instruction_profile(PERSEUS / name, 8)
        measured = prof.stage_specs()

        m = savings(measured, watts)
        f = savings(_modelled(measured, gpu.with_overrides(dvfs=dvfs.params_for(gpu)), model_options), watts)
        e = savings(_modelled(measured, gpu.with_overrides(dvfs=EARLIER[gpu_name]), model_options), watts)
        print(f"{name:30} {m[0]:17.1f}% {f[0]:5.1f}% {e[0]:6.1f}% | {m[1]:21.1f}% {f[1]:5.1f}% {e[1]:6.1f}%")


if __name__ == "__main__":
    main()
    held_out()
    pipelines()
