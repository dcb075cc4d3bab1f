"""Calibration held to data it was not designed on (issue 27): the Llama CPU trials of ``tests/data/cpu_llama``.

The selection rule (``ampe.report.calibration``: structures, leave-one-out discordances, the two-count rule) was last
changed on 2026-11-25 (commit b6d68d1, 23:16 UTC) and designed on AMP's Tables 6–9 and the GPT-2 CPU trials. These
24 trials were measured on 2026-11-26, 16:57–17:34 UTC, for the cost model's fidelity (issue 24), with another
model family (Llama: RMSNorm, SwiGLU, GQA), both attention kernels and three recomputation modes; no calibration
code or constant was changed after they were recorded. Calibration takes one kernel per set, so each kernel's 12
trials (3 recomputation modes × mbs 1, 2, 4, 8; pp 2, one CPU type) are one set.

The protocol is the AMP test's, unchanged: nested leave-one-out, each trial predicted by the calibration ``ampe
report --calibrate`` would fit on the other 11, its structure selected on those 11 alone. The AMP acceptance
criterion (held-out Spearman ≥ uncalibrated and held-out MAPE < uncalibrated) does **not** hold here: recorded
2026-11-26 (docs/calibration.md), eager ρ 0.972 → 0.965 with MAPE 10.2 → 5.0 % (one pair the uncalibrated model
ordered right is swapped: no recomputation at mbs 4, 9.93 s, against selective at mbs 1, 11.09 s, neighbours in
measured order; their held-out predictions come from two folds' fits, whose time factors differ); flash ρ 0.986 →
1.000 with MAPE 3.28 → 3.37 %. What the test asserts instead — thresholds set after seeing these figures, so they
guard against regressions and do not validate the rule a second time:

* eager, where the uncalibrated model is biased (it over-predicts all 12 trials, by 1.8–18.8 %): the held-out
  error at most 0.6 × the uncalibrated (0.49 recorded);
* flash, already within 3.3 %: the held-out error at most 1 point above the uncalibrated;
* both: the held-out ranking at least 0.95 and at most 0.02 below the uncalibrated (one adjacent swap of 12 costs
  0.007).

On these sets the four structures order the held-out trials alike (equal weighted and plain discordance: one CPU
type, one pipeline depth), so the selection falls to held-out MAPE and the simplest structure; the test holds fit
and selection together to unseen data, not the rule's power to tell order-moving structures apart.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.formats.measurement import read_measurements
from ampe.report.calibration.measured import CalibrationInputs, as_ran, measured_set, uncalibrated_estimates
from ampe.report.calibration.selection import Folds
from ampe.report.compare import mape, spearman
from ampe.report.measurements import report_from_measurements

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "cpu_llama" / "llama-small"


@cache
def _folds(kernel: str) -> Folds:
    cluster = load_cluster(ROOT / "cluster_specs" / "local-cpu.yaml")
    model = load_model("llama-small")
    profile = load_profile(DATA / "profile.csv", known_devices=["cpu"])
    got = report_from_measurements(read_measurements(DATA / "measurements.jsonl"), cluster, model, profile)
    rows = [r for r in got.report.measured if r.strategy["attention"] == kernel]
    strategies = [strategy_from_dict(r.strategy, str(DATA)) for r in rows]
    inputs = as_ran(CalibrationInputs(cluster, model, profile, str(DATA / "profile.csv"), 8, where=str(DATA)),
                    strategies, str(DATA))
    return Folds([measured_set(inputs, strategies, [float(r.measured_s or 0.0) for r in rows])])


def _figures(kernel: str) -> tuple[float, float, float, float]:
    folds = _folds(kernel)
    data = folds.sets[0]
    before, after = uncalibrated_estimates(data), folds.held_out("select")[0]
    rho_before, rho_after = (spearman(list(p), list(data.measured_s))[0] for p in (before, after))
    assert rho_before is not None and rho_after is not None
    return rho_before, mape(before, data.measured_s), rho_after, mape(after, data.measured_s)


@pytest.mark.parametrize("kernel", ["eager", "flash"])
def test_unseen_trials_every_recomputation_and_micro_batch_of_one_kernel(kernel):
    data = _folds(kernel).sets[0]
    assert len(data.strategies) == 12
    assert {(s.recompute, s.mbs) for s in data.strategies} == {(r, m) for r in ("none", "selective", "full")
                                                                for m in (1, 2, 4, 8)}


def test_held_out_error_halves_where_the_uncalibrated_model_is_biased():
    rho_before, mape_before, rho_after, mape_after = _figures("eager")
    assert mape_before > 8.0  # the premise: a bias to remove (10.2 % recorded)
    assert mape_after <= 0.6 * mape_before, (mape_after, mape_before)
    assert rho_after >= 0.95 and rho_after >= rho_before - 0.02, (rho_after, rho_before)


def test_held_out_error_stays_where_the_uncalibrated_model_is_already_close():
    rho_before, mape_before, rho_after, mape_after = _figures("flash")
    assert mape_before < 5.0  # the premise: little to fix (3.3 % recorded)
    assert mape_after <= mape_before + 1.0, (mape_after, mape_before)
    assert rho_after >= 0.95 and rho_after >= rho_before - 0.02, (rho_after, rho_before)
