"""Calibration on real measurements: held-out Spearman ρ and MAPE, uncalibrated vs calibrated (ampe report
--calibrate's structural fit, ampe/report/calibrate.py).

Data sets:
* AMP's Tables 6-9 (the AMP paper's measured iteration times; homogeneous 4×g4dn and het-cluster 3×p3 + 1×g4dn,
  GPT-2 from AMP's own per-layer profile): leave-one-out per cluster (k = n − 1), and pooled over both clusters with
  k = 8 random strategies fitted and the other 12 predicted (several random draws);
* the H100 trials in tests/data/h100 (gpt2-medium, one GPU, micro-batch 2..16): leave-one-out.

The uncalibrated figures are the cost model's zero-shot predictions. Note that ampe's catalog was tuned while
looking at AMP's tables, so its zero-shot ranking there is an in-sample figure. CPU trials across world sizes are in
benchmarks/fidelity_cpu.py (they need DeepSpeed runs).

Run: python benchmarks/calibration.py [--draws N]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.model import load_model
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy, complete, strategy_from_dict
from ampe.report.calibrate import (
    CalibrationInputs,
    MeasuredSet,
    fit_calibration,
    leave_one_out,
    measured_set,
    predict,
    uncalibrated_estimates,
)
from ampe.report.compare import mape, spearman
from tests.costmodel.test_fidelity_amp_measurements import MEASURED

AMP_PROFILE = ROOT / "ampe" / "data" / "amp_layer_profiles.csv"
H100 = ROOT / "tests" / "data" / "h100"


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


def figures(pred: np.ndarray, meas: np.ndarray) -> str:
    rho = spearman(list(pred), list(meas))[0]
    return f"ρ {'n/a' if rho is None else f'{rho:+.3f}'}  MAPE {mape(pred, meas):5.1f} %"


def loo_row(name: str, data: MeasuredSet) -> None:
    t = time.perf_counter()
    fit = fit_calibration([data])
    held = leave_one_out([data], fit.free)[0]
    before = uncalibrated_estimates(data)
    ids = [p for p, ok in zip(fit.space.names, fit.identified, strict=True) if ok]
    print(f"{name:22s} n={len(data.strategies):2d}  uncalibrated {figures(before, data.measured_s)}  |  "
          f"leave-one-out {figures(held, data.measured_s)}  ({time.perf_counter() - t:.0f} s; identified: "
          f"{', '.join(ids) or 'none'})")


def subset(data: MeasuredSet, idx: list[int]) -> MeasuredSet:
    return MeasuredSet(data.inputs, data.table, tuple(data.strategies[i] for i in idx), data.measured_s[idx])


def pooled_k(sets: list[MeasuredSet], k: int, draws: int) -> None:
    pairs = [(s, i) for s, d in enumerate(sets) for i in range(len(d.strategies))]
    meas = np.concatenate([d.measured_s for d in sets])
    before = np.concatenate([uncalibrated_estimates(d) for d in sets])
    rng = random.Random(0)
    rows = []
    for _ in range(draws):
        train = set(rng.sample(range(len(pairs)), k))
        fit_sets = [subset(d, [i for i in range(len(d.strategies)) if pairs.index((s, i)) in train])
                    for s, d in enumerate(sets)]
        fit = fit_calibration([d for d in fit_sets if d.strategies], uncertainty=False)
        after = np.concatenate([predict(d, fit.params) for d in sets])
        test = [j for j in range(len(pairs)) if j not in train]
        rows.append((spearman(list(before[test]), list(meas[test]))[0], spearman(list(after[test]),
                                                                                 list(meas[test]))[0],
                     mape(before[test], meas[test]), mape(after[test], meas[test])))
    a = np.array(rows, dtype=float)
    wins = int(np.sum(a[:, 1] > a[:, 0]))
    print(f"AMP pooled, k={k} fitted, {len(pairs) - k} held out, {draws} draws: Spearman uncalibrated "
          f"{a[:, 0].mean():+.3f} → calibrated {a[:, 1].mean():+.3f} (better in {wins} of {draws}); MAPE "
          f"{a[:, 2].mean():.1f} % → {a[:, 3].mean():.1f} %")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--draws", type=int, default=6, help="random k=8 draws for the pooled AMP figure")
    args = ap.parse_args()
    sets = amp_sets()
    print("held-out prediction of measured iteration times, uncalibrated vs calibrated")
    for d in sets:
        loo_row(f"AMP {d.inputs.where}", d)
    loo_row("H100 gpt2-medium", h100_set())
    pooled_k(sets, 8, args.draws)
    return 0


if __name__ == "__main__":
    sys.exit(main())
