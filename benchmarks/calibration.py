"""Calibration on real measurements: held-out Spearman ρ and MAPE, uncalibrated vs calibrated (ampe report
--calibrate's structural fit, ampe/report/calibrate.py), fitting every parameter or the structure selected on the
training strategies alone (nested: the held-out strategy never informs the selection).

Data sets:
* AMP's Tables 6-9 (the AMP paper's measured iteration times; homogeneous 4×g4dn and het-cluster 3×p3 + 1×g4dn,
  GPT-2 from AMP's own per-layer profile): leave-one-out per cluster (k = n − 1), leave-two-out pair concordance
  (k = n − 2: does one fit on the other eight order each pair as measured), and pooled over both clusters with
  k = 8 random strategies fitted and the other 12 predicted (several random draws);
* the H100 trials in tests/data/h100 (gpt2-medium, one GPU, micro-batch 2..16): leave-one-out, pairs;
* ampe's own CPU trials (gpt2-tiny, world size 2 and 4; the README in each folder): tests/data/cpu_trials_quiet,
  measured on an idle machine, and tests/data/cpu_trials, measured while other work held 1.1–1.7 of the 2 cores: fit
  on one world size, predict the other; and whether the ranks' CPU seconds (cpu_seconds.json) rank the strategies
  better than wall time.

Why the held-out ranking does not beat the uncalibrated one on AMP's het-cluster (docs/calibration.md): per table,
the in-sample ordering each structure reaches when it sees every strategy (a ceiling for held-out fits), the
Spearman that iid held-out errors of a given size allow on these measured times, and the pairs the leave-one-out
fits mis-order, with the parameter whose prior value would order each right.

The uncalibrated figures are the cost model's zero-shot predictions. Note that ampe's catalog was tuned while
looking at AMP's tables, so its zero-shot ranking there is an in-sample figure.

Run: python benchmarks/calibration.py [--draws N]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy, complete, strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.report.calibration.fit import FitResult, fit_calibration
from ampe.report.calibration.measured import (
    CalibrationInputs,
    MeasuredSet,
    measured_set,
    predict,
    uncalibrated_estimates,
)
from ampe.report.calibration.selection import Folds, fit_selected, held_out_discordance, pair_concordance
from ampe.report.calibration.structures import parameter_space, structures
from ampe.report.compare import mape, spearman
from tests.costmodel.test_fidelity_amp_measurements import MEASURED

AMP_PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"
H100 = ROOT / "tests" / "data" / "h100"
CPU_TRIALS = {"idle machine": ROOT / "tests" / "data" / "cpu_trials_quiet",
              "loaded machine": ROOT / "tests" / "data" / "cpu_trials"}


def amp_sets() -> list[MeasuredSet]:
    """AMP's measured strategies, one set per cluster."""
    model, profile = load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    out = []
    for spec, rows in sorted(MEASURED.items()):
        cluster = load_cluster(ROOT / "cluster_specs" / f"{spec}.yaml")
        strategies = [complete(Strategy(pp, 16 // (tp * pp), tp, mbs, 32, tuple(part)), model.num_layers)
                      for mbs, part, tp, pp, _ in rows]
        out.append(measured_set(CalibrationInputs(cluster, model, profile, str(AMP_PROFILE), 32, where=spec),
                                strategies, [r[-1] for r in rows]))
    return out


def h100_set() -> MeasuredSet:
    """The H100 trials (ok ones)."""
    doc = json.loads((H100 / "trials_gpt2m.json").read_text())
    ok = [t for t in doc["trials"] if t["status"] == "ok"]
    cluster = cluster_from_dict({"name": "one-h100", "nodes": [{"name": "gpu", "gpu": "H100-80GB", "count": 1,
                                                                "intra_gbps": 3600, "inter_gbps": 100}]})
    model = load_model("gpt2-medium")
    profile = load_profile(H100 / "profile_gpt2m_cuda.csv")
    strategies = [strategy_from_dict(t["strategy"], "h100") for t in ok]
    return measured_set(CalibrationInputs(cluster, model, profile, "h100 profile", 32, where="h100"), strategies,
                        [t["iteration_s_mean"] for t in ok])


def cpu_sets(folder: Path) -> dict[int, MeasuredSet]:
    """ampe's own CPU trials (gpt2-tiny, gbs 8) per world size, from one tests/data folder (ok runs)."""
    model, profile = load_model("gpt2-tiny"), load_profile(folder / "profile.csv")
    out = {}
    for ws, spec in ((2, "local-cpu.yaml"), (4, "local-cpu-4.yaml")):
        rows = [json.loads(line) for line in (folder / f"measurements_ws{ws}.jsonl").read_text().splitlines() if line]
        rows = [r for r in rows if r["status"] == "ok"]
        out[ws] = measured_set(CalibrationInputs(load_cluster(folder / spec), model, profile, "cpu profile", 8,
                                                 where=f"cpu-ws{ws}"),
                               [strategy_from_dict(r["strategy"], f"cpu ws{ws}") for r in rows],
                               [r["iteration_s"] for r in rows])
    return out


def cross_world(sets: dict[int, MeasuredSet], label: str) -> None:
    """Fit on one world size's trials, predict the other's."""
    for fit_ws, test_ws in ((2, 4), (4, 2)):
        test = sets[test_ws]
        print(f"CPU trials ({label}), fit on world size {fit_ws} (n = {len(sets[fit_ws].strategies)}), predict "
              f"world size {test_ws} (n = {len(test.strategies)})")
        print(f"  {'uncalibrated':34s} {figures(uncalibrated_estimates(test), test.measured_s)}")
        for st, row in (("full", "every parameter"), ("select", "selected structure")):
            fit = fit_named([sets[fit_ws]], st)
            print(f"  {row:34s} {figures(predict(test, fit.params), test.measured_s)}"
                  + (f"   ({fit.structure})" if st == "select" else ""))


def cpu_time_check(sets: dict[int, MeasuredSet], folder: Path) -> None:
    """Does CPU time rank the trials better than wall time? Zero-shot Spearman of the cost model against the wall
    median, the busiest rank's CPU seconds, all ranks' CPU seconds, and wall × the share of the two cores the trial
    had (2 − other processes' cores) / 2."""
    doc = json.loads((folder / "cpu_seconds.json").read_text())["trials"]
    for ws, data in sorted(sets.items()):
        rows = doc[str(ws)]
        wall = np.array([r["wall_s"] for r in rows])
        cpu = [np.array(r["cpu_s_per_rank"]) for r in rows]
        other = np.array([r["host_other_cores"] for r in rows])
        before = uncalibrated_estimates(data)
        print(f"CPU trials world size {ws}, zero-shot (other processes held {other.min():.2f}–{other.max():.2f} "
              "cores):")
        for label, y in (("wall (what the report uses)", wall),
                         ("CPU s, busiest rank", np.array([c.max() for c in cpu])),
                         ("CPU s, all ranks", np.array([c.sum() for c in cpu])),
                         ("wall × (2 − other cores) / 2", wall * (2 - other) / 2)):
            print(f"  {label:34s} {figures(before, y)}")


def figures(pred: np.ndarray, meas: np.ndarray) -> str:
    rho = spearman(list(pred), list(meas))[0]
    return f"ρ {'n/a' if rho is None else f'{rho:+.3f}'} MAPE {mape(pred, meas):5.1f} %"


def subset(data: MeasuredSet, idx: list[int]) -> MeasuredSet:
    return MeasuredSet(data.inputs, data.table, tuple(data.strategies[i] for i in idx), data.measured_s[idx])


def expected_rho(meas: np.ndarray, sd: float, draws: int = 2000) -> float:
    """Mean Spearman of ``meas`` × exp(N(0, sd²)) iid against ``meas``: the ranking that held-out errors of that
    size (log sd) allow on these measured times."""
    rng = np.random.default_rng(0)
    return float(np.mean([spearman(list(meas * np.exp(rng.normal(0.0, sd, len(meas)))), list(meas))[0]
                          for _ in range(draws)]))


def wrong_pairs(pred: np.ndarray, meas: np.ndarray) -> float:
    """Weighted fraction of pairs ordered the wrong way (weight |log measured ratio|; a predicted tie half)."""
    num = den = 0.0
    for i in range(len(meas)):
        n, d = held_out_discordance(pred, meas, i)
        num, den = num + n, den + d
    return num / den if den > 0 else 0.0


def fit_named(sets: list[MeasuredSet], structure: str, skip: tuple[int, int] | None = None) -> FitResult:
    """The fit of the structure named ``structure``, or of the one selected on the same data (``"select"``)."""
    if structure == "select":
        return fit_selected(sets, skip, uncertainty=False)
    return fit_calibration(sets, skip=skip, uncertainty=False, structure=structure)


def ceiling(data: MeasuredSet) -> None:
    """Each structure fitted on all n strategies and judged on the same n: the ordering it reaches when it has
    seen everything, a ceiling for its held-out figures."""
    parts = []
    for st in structures(parameter_space([data])):
        fit = fit_calibration([data], uncertainty=False, structure=st)
        parts.append(f"{st.name} {figures(predict(data, fit.params), data.measured_s)}")
    print("  in-sample (fit on all n, judged on them): " + ", ".join(parts))


def error_allows(data: MeasuredSet, held: np.ndarray) -> None:
    """The Spearman iid held-out errors allow on these measured times, beside the measured held-out error."""
    meas = data.measured_s
    sd = float(np.std(np.log(held / meas)))
    print("  iid log errors of sd σ allow ρ: " + ", ".join(f"σ {s:.2f} → {expected_rho(meas, s):.3f}"
                                                         for s in (0.02, 0.03, 0.05, 0.10))
          + f"; held-out σ (every parameter) {sd:.3f} → {expected_rho(meas, sd):.3f}")


def misordered(data: MeasuredSet, structure: str = "full") -> None:
    """The pairs the leave-one-out predictions order the wrong way (or the uncalibrated model does), and for those
    one fold's fit also mis-orders, the parameters whose prior value (one at a time) orders the pair right."""
    m, n = data.measured_s, len(data.strategies)
    before = uncalibrated_estimates(data)
    fits = [fit_named([data], structure, skip=(0, i)) for i in range(n)]
    held = np.array([predict(subset(data, [i]), fits[i].params)[0] for i in range(n)])
    space = fits[0].space
    print(f"  pairs mis-ordered (leave-one-out, {structure}; weight |log ratio|), weighted wrong fraction: "
          f"uncalibrated {wrong_pairs(before, m):.3f}, held-out {wrong_pairs(held, m):.3f}")

    def name(i: int) -> str:
        s = data.strategies[i]
        return f"pp{s.pp} tp{s.tp} mbs{s.mbs} ({m[i]:.2f} s)"

    for i, j in itertools.combinations(range(n), 2):
        sign = np.sign(m[i] - m[j])
        loo_wrong, uncal_wrong = (held[i] - held[j]) * sign <= 0, (before[i] - before[j]) * sign <= 0
        if not loo_wrong and not uncal_wrong:
            continue
        one = predict(subset(data, [i, j]), fits[i].params)  # fold i's fit predicts both (j was in its training)
        cause = "held-out wrong" if (one[0] - one[1]) * sign <= 0 else "fold-to-fold (fold i's fit orders it right)"
        if (one[0] - one[1]) * sign <= 0:
            fixes = []
            for k in range(len(space.names)):
                theta = fits[i].theta.copy()
                theta[k] = space.prior[k]
                p = predict(subset(data, [i, j]), space.decode(theta))
                if (p[0] - p[1]) * sign > 0:
                    fixes.append(space.names[k])
            cause += "; prior value fixes: " + (", ".join(fixes) or "none alone")
        print(f"    {name(i)} vs {name(j)}, w {abs(math.log(m[i] / m[j])):.3f}: uncalibrated "
              f"{'WRONG' if uncal_wrong else 'right'}, held-out {'WRONG' if loo_wrong else 'right'} "
              f"({held[i]:.2f} vs {held[j]:.2f}){'' if not loo_wrong else ' — ' + cause}")


def loo_rows(name: str, data: MeasuredSet, pair_structures: tuple[str, ...], diagnose: bool = False) -> None:
    before = uncalibrated_estimates(data)
    print(f"{name} (n = {len(data.strategies)})")
    print(f"  {'uncalibrated':34s} {figures(before, data.measured_s)}")
    folds = Folds([data])  # the nested selection, leave-one-out and leave-two-out share their fits
    t = time.process_time()
    every = folds.held_out("full")[0]
    print(f"  {'leave-one-out, every parameter':34s} {figures(every, data.measured_s)}")
    selected = folds.held_out("select")[0]
    chosen = [folds.select(frozenset({(0, i)}))[0].name for i in range(len(data.strategies))]
    print(f"  {'leave-one-out, selected structure':34s} {figures(selected, data.measured_s)}   (each fold's: "
          f"{', '.join(chosen)}; {time.process_time() - t:.0f} CPU s)")
    if diagnose:
        ceiling(data)
        error_allows(data, every)
        misordered(data)
    best, scores = folds.select()
    print(f"  structure selected on all {len(data.strategies)}: {best.name}  (held-out discordance weighted / plain, "
          "MAPE: " + ", ".join(f"{k} {s.discordance:.3f} / {s.plain_discordance:.3f} {s.mape_pct:.1f} %"
                               for k, s in scores.items()) + ")")
    t = time.process_time()
    pairs = pair_concordance(data, pair_structures, folds)
    print(f"  leave-two-out pairs ordered right (weighted, k = {len(data.strategies) - 2}): "
          + ", ".join(f"{k} {v:.3f}" for k, v in pairs.items()) + f"   ({time.process_time() - t:.0f} CPU s)")


def pooled_k(sets: list[MeasuredSet], k: int, draws: int) -> None:
    pairs = [(s, i) for s, d in enumerate(sets) for i in range(len(d.strategies))]
    meas = np.concatenate([d.measured_s for d in sets])
    before = np.concatenate([uncalibrated_estimates(d) for d in sets])
    rng = random.Random(0)
    rows = []
    chosen = []
    for _ in range(draws):
        train = set(rng.sample(range(len(pairs)), k))
        fit_sets = [subset(d, [i for i in range(len(d.strategies)) if pairs.index((s, i)) in train])
                    for s, d in enumerate(sets)]
        test = [j for j in range(len(pairs)) if j not in train]
        row = [spearman(list(before[test]), list(meas[test]))[0], mape(before[test], meas[test])]
        for st in ("full", "select"):
            fit = fit_named([d for d in fit_sets if d.strategies], st)
            after = np.concatenate([predict(d, fit.params) for d in sets])
            row += [spearman(list(after[test]), list(meas[test]))[0], mape(after[test], meas[test])]
            if st == "select":
                chosen.append(fit.structure)
        rows.append(row)
    a = np.array(rows, dtype=float)
    print(f"AMP pooled, k = {k} fitted, {len(pairs) - k} held out, {draws} draws (mean; Spearman over the held-out):")
    print(f"  {'uncalibrated':34s} ρ {a[:, 0].mean():+.3f} MAPE {a[:, 1].mean():5.1f} %")
    for c, label in ((2, "every parameter"), (4, "selected structure")):
        print(f"  {label:34s} ρ {a[:, c].mean():+.3f} MAPE {a[:, c + 1].mean():5.1f} %   (ρ better in "
              f"{int(np.sum(a[:, c] > a[:, 0]))}, equal in {int(np.sum(a[:, c] == a[:, 0]))} of {draws})")
    print(f"  selected: {', '.join(chosen)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=6, help="random k=8 draws for the pooled AMP figure")
    args = ap.parse_args()
    sets = amp_sets()
    print("held-out prediction of measured iteration times, uncalibrated vs calibrated")
    for d in sets:
        loo_rows(f"AMP {d.inputs.where}", d, ("full", "select"), diagnose=True)
    loo_rows("H100 gpt2-medium", h100_set(), ("scale", "full", "select"))
    pooled_k(sets, 8, args.draws)
    for label, folder in CPU_TRIALS.items():
        cpu = cpu_sets(folder)
        cross_world(cpu, label)
        cpu_time_check(cpu, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
