"""Issue 32's acceptance on every GPU record in tests/data (``benchmarks/gpu_records.py`` prints the table):

* H200 (tests/data/h200/gpu_check: Llama-3.2-1B, seq 4096, bf16): time MAPE ≤ 3 % with the profile, every run
  within 10 % without it; energy per iteration within 10 % of NVML with the profile, with its energy columns left
  out, and without a profile;
* H100 (tests/data/h100: gpt2-medium, fp16): energy the same, time within 10 % without a profile. With the profile the
  time MAPE is 8.0 %, not ≤ 3 %: the record's profile was taken at mbs 1, 4 and 8 and its trials ran at 2, 4, 8 and
  16, and its optimizer is no longer ampe's (docs/cost_model.md, *What the H100 record cannot show*). It is held
  here where it stands, not hidden.

And the power by kernel bound in the catalog is the one ``benchmarks/power_fit.py`` fits to these records.
"""

from __future__ import annotations

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.energy import dvfs
from ampe.report.compare import mape
from benchmarks.power_fit import all_points, fit
from benchmarks.support.gpu_records import PATHS, Prediction, predictions, records


@pytest.fixture(scope="module")
def predicted() -> dict[str, list[Prediction]]:
    return {r.name: predictions(r) for r in records()}


def _along(preds: list[Prediction], path: str) -> list[Prediction]:
    return [p for p in preds if p.path == path]


def test_every_gpu_record_is_here_with_nvml_energy():
    names = [r.name for r in records()]
    assert names == ["H200 Llama-3.2-1B bf16", "H100 gpt2-medium fp16"]
    assert [len(r.trials) for r in records()] == [4, 4]  # the H200's OOM trial has no time or energy


def test_h200_time_with_and_without_the_profile(predicted):
    preds = predicted["H200 Llama-3.2-1B bf16"]
    with_profile = _along(preds, "profile")
    assert mape([p.seconds for p in with_profile], [p.trial.measured_s for p in with_profile]) <= 3.0  # 1.6 %
    assert all(abs(p.time_err_pct) <= 10.0 for p in _along(preds, "no profile")), \
        [(p.trial.label, round(p.time_err_pct, 1)) for p in _along(preds, "no profile")]  # −0.3 … +5.8 %
    eager = next(p for p in _along(preds, "no profile") if p.trial.label.startswith("eager"))
    assert abs(eager.time_err_pct) <= 10.0  # was −23 % before the mask fill and the H200's own efficiency


@pytest.mark.parametrize("name", ["H200 Llama-3.2-1B bf16", "H100 gpt2-medium fp16"])
@pytest.mark.parametrize("path", PATHS)
def test_energy_per_iteration_within_ten_percent_of_nvml(predicted, name, path):
    """With the profile's measured energy, without it (power from the kernels' bounds), without a profile."""
    errors = {p.trial.label: round(p.energy_err_pct, 1) for p in _along(predicted[name], path)}
    assert all(abs(e) <= 10.0 for e in errors.values()), errors


def test_h100_time_without_a_profile_within_ten_percent(predicted):
    preds = _along(predicted["H100 gpt2-medium fp16"], "no profile")
    assert all(abs(p.time_err_pct) <= 10.0 for p in preds), [(p.trial.label, p.time_err_pct) for p in preds]


def test_h100_time_with_its_profile_where_it_stands(predicted):
    """Not the ≤ 3 % target: 8.0 % (mbs 2 +20.8 %, interpolated from a host-bound mbs-1 row; mbs 4 +6.1 %; mbs 8
    −3.7 %; mbs 16 −1.4 %). Held so it cannot get worse unnoticed."""
    preds = _along(predicted["H100 gpt2-medium fp16"], "profile")
    assert mape([p.seconds for p in preds], [p.trial.measured_s for p in preds]) <= 8.5


def test_the_catalog_power_by_kernel_bound_is_the_fit_to_the_records():
    idle, tensor, simt, memory = fit(all_points())
    for name in ("H100-80GB", "H200"):
        kp = CATALOG[name].kernel_power
        assert kp is not None and "fitted at f_max only" in kp.source
        assert (kp.idle_w, kp.tensor_w, kp.simt_w, kp.memory_w) == pytest.approx((idle, tensor, simt, memory),
                                                                                  abs=1.0)
        # ordering a physicist expects: tensor-core work draws most, then memory traffic or SIMT work, idle least
        assert kp.tensor_w > max(kp.memory_w, kp.simt_w) > min(kp.memory_w, kp.simt_w) > kp.idle_w
        # the DVFS model's watts at f_max are these (its shape below f_max stays A100's, labelled assumed)
        p = dvfs.params_for(CATALOG[name])
        assert p.busy_w == min(kp.tensor_w, CATALOG[name].tdp_w) and p.blocking_w == kp.idle_w and p.assumed
