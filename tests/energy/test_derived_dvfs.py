"""Derived GPU types (a cluster spec's ``base:``) carry their base's fitted DVFS model, scaled to their own TDP.

Expected figures are computed here by hand from the base's fitted parameters (the model's formula written out again,
docs/energy.md §1), not by calling the model's own functions.
"""

from __future__ import annotations

import json
import math

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import cluster_from_dict
from ampe.energy import dvfs
from ampe.energy.model_options import model_options

PCIE = {"A100-80GB-PCIe": {"base": "A100-80GB", "tdp_w": 300}}


def _gpu(types: dict, name: str):
    spec = {"name": "x", "gpu_types": types,
            "nodes": [{"name": "n", "gpu": name, "count": 2, "intra_gbps": 200, "inter_gbps": 100}]}
    return cluster_from_dict(spec).devices[0].gpu


def _t(p, x: float) -> float:
    """T(x) = ((α/x)^n + (1 − α)^n)^(1/n), a = 1."""
    a, n = p.compute_share, p.sharpness
    return ((a / x) ** n + (1 - a) ** n) ** (1 / n)


def _p(p, x: float) -> float:
    """p(x) = s·(1 − σ + σ·v) + m·T(1)/T(x) + (1 − s − m)·x·v², v = max(x_v, x), a = 1."""
    v = max(p.voltage_knee, x)
    s, sig, m = p.static_share, p.static_voltage_share, p.memory_share
    return s * (1 - sig + sig * v) + m * _t(p, 1.0) / _t(p, x) + (1 - s - m) * x * v * v


def _cap_x(p, busy_w: float, cap_w: float) -> float:
    """The relative clock where busy_w·p(x) meets cap_w (bisection; p rises with x)."""
    lo, hi = 1e-3, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if busy_w * _p(p, mid) < cap_w else (lo, mid)
    return lo


def test_a100_pcie_variant_gets_a100s_fitted_shape_capped_at_its_own_300_w():
    gpu = _gpu(PCIE, "A100-80GB-PCIe")
    base = dvfs.PARAMS["A100-80GB"]  # fitted: busy 495.5 W, cap 471.5 W on a 400 W datasheet card
    p = dvfs.params_for(gpu)
    assert p.source.startswith("derived from A100-80GB") and p.assumed
    k = 300 / 400
    busy = base.busy_w * k  # 371.6 W
    assert p.busy_w == pytest.approx(371.625) and p.blocking_w == pytest.approx(83.64 * k)
    assert p.power_cap_w == pytest.approx(300.0)  # A100's 471.5 W × 0.75 = 353.6 W would exceed the card's 300 W
    for name in ("compute_share", "sharpness", "static_share", "static_voltage_share", "voltage_knee",
                 "memory_share", "activity_slope", "activity_memory_slope"):
        assert getattr(p, name) == getattr(base, name), name
    # At f_max the card draws its cap; below the cap's clock, the base's curve × 0.75.
    assert dvfs.power_w(gpu, 1410) == pytest.approx(300.0)
    xc = _cap_x(base, busy, 300.0)
    assert 1280 < xc * 1410 < 1300  # it throttles from ~1290 MHz, earlier than the 471.5 W SXM board (~1380 MHz)
    t_max = 0.2  # s at all-max clocks (the cap's clock)
    for mhz in (1000, 1200):
        x = mhz / 1410
        watts = busy * _p(base, x)
        ratio = _t(base, x) / _t(base, xc)
        assert dvfs.power_w(gpu, mhz) == pytest.approx(watts, rel=1e-9)
        assert dvfs.time_ratio(gpu, mhz) == pytest.approx(ratio, rel=1e-6)
        opt = next(o for o in model_options(gpu, t_max, 1, clocks_mhz=(1000, 1200, 1410)).options if o.mhz == mhz)
        assert opt.time_s == pytest.approx(t_max * ratio, rel=1e-6)
        assert opt.energy_j == pytest.approx(t_max * ratio * watts, rel=1e-6)
    # hand figures, written out: 1000 MHz draws 195.87 W, 1.2487× slower; 1200 MHz 254.47 W, 1.0583×
    assert dvfs.power_w(gpu, 1000) == pytest.approx(195.87, abs=0.01)
    assert dvfs.time_ratio(gpu, 1200) == pytest.approx(1.0583, abs=1e-4)
    # not the generic defaults it got before (busy 0.9·TDP = 270 W, α 0.5, no cap)
    assert dvfs.power_w(gpu, 1410) != pytest.approx(270.0)


def test_a_variant_with_the_bases_tdp_has_the_bases_numbers():
    for base in ("A100-80GB", "A40", "V100-16GB", "H100-80GB", "T4"):
        gpu = _gpu({"Mine": {"base": base, "memory_gb": 20}}, "Mine")
        p, q = dvfs.params_for(gpu), dvfs.params_for(CATALOG[base])
        assert p == q and p.source.startswith(f"derived from {base}")  # equal numbers (source is not compared)
        for mhz in (900, 1200):
            assert dvfs.power_w(gpu, mhz) == dvfs.power_w(CATALOG[base], mhz)


def test_a40_variant_keeps_its_cap_just_under_its_own_limit():
    p = dvfs.params_for(_gpu({"A40-250": {"base": "A40", "tdp_w": 250}}, "A40-250"))
    a40 = dvfs.PARAMS["A40"]
    assert p.power_cap_w == pytest.approx(293.2 * 250 / 300)  # 244.3 W: the fit's 2.3 % under the limit, kept
    assert p.busy_w == pytest.approx(371.7 * 250 / 300) and p.blocking_w == pytest.approx(70.38 * 250 / 300)
    assert (p.activity_slope, p.activity_memory_slope) == (a40.activity_slope, a40.activity_memory_slope)


def test_an_override_of_a_catalog_type_with_another_tdp_is_derived_too():
    gpu = _gpu({"A100-80GB": {"tdp_w": 300}}, "A100-80GB")
    assert dvfs.params_for(gpu).power_cap_w == pytest.approx(300.0)
    same = _gpu({"A100-80GB": {"memory_gb": 70}}, "A100-80GB")  # TDP kept: the catalog's model itself
    assert dvfs.params_for(same) is dvfs.PARAMS["A100-80GB"]


def test_a_variant_with_other_clocks_keeps_the_shape_on_its_own_range():
    """Decision (docs/energy.md §1): the shape is a function of f / f_max, as the catalog's H100 carries A100's."""
    gpu = _gpu({"A40-slow": {"base": "A40", "sm_clock_max_mhz": 1600}}, "A40-slow")
    a40 = CATALOG["A40"]
    for share in (0.5, 0.7, 0.9):
        assert dvfs.time_ratio(gpu, share * 1600) == pytest.approx(dvfs.time_ratio(a40, share * 1740))
        assert dvfs.power_w(gpu, share * 1600) == pytest.approx(dvfs.power_w(a40, share * 1740))
    assert dvfs.energy_valley_mhz(gpu) < dvfs.energy_valley_mhz(a40)


def test_a_new_type_without_base_still_gets_generic_defaults():
    spec = {"New": {"memory_gb": 16, "peak_tflops_fp16": 100, "peak_tflops_fp32": 20, "memory_bandwidth_gbs": 900,
                    "tdp_w": 250, "idle_w": 30, "sm_clock_min_mhz": 300, "sm_clock_max_mhz": 1500,
                    "sm_clock_step_mhz": 15}}
    assert dvfs.params_for(_gpu(spec, "New")).source == "generic assumed defaults"


def test_derived_variants_have_interior_valleys_and_blocking_below_busy():
    for types, name in ((PCIE, "A100-80GB-PCIe"), ({"L4": {"base": "T4", "tdp_w": 72}}, "L4"),
                        ({"V": {"base": "V100-32GB", "tdp_w": 250}}, "V")):
        gpu = _gpu(types, name)
        clocks = gpu.sm_clocks_mhz()
        energy = [dvfs.power_w(gpu, f) * dvfs.time_ratio(gpu, f) for f in clocks]
        assert min(energy) < energy[0] and min(energy) < energy[-1]
        assert 0 < dvfs.blocking_power_w(gpu) < min(dvfs.power_w(gpu, f) for f in clocks)
        assert dvfs.power_w(gpu, clocks[-1]) <= gpu.tdp_w + 1e-9


def test_the_plan_says_the_energy_was_derived(tmp_path, run_cli):
    spec = tmp_path / "pcie.yaml"
    spec.write_text(json.dumps({"name": "pcie", "gpu_types": PCIE, "nodes": [
        {"name": "n", "gpu": "A100-80GB-PCIe", "count": 2, "intra_gbps": 200, "inter_gbps": 100}]}))
    out = tmp_path / "plan.json"
    code, stdout, _ = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8", "--top-k",
                              "2", "--pp", "2", "--out", out)
    assert code == 0
    assert "A100-80GB-PCIe: derived from A100-80GB" in stdout
    entry = json.loads(out.read_text())["strategies"][0]
    src = entry["predicted"]["energy_source"]
    assert src.startswith("modelled (analytic DVFS model; A100-80GB-PCIe: derived from A100-80GB")
    assert "cap 300 W" in src
    # the plan's energy is the derived model's: the stages draw at most the 300 W cap, not A100's 471.5 W
    assert entry["predicted"]["average_power_w"] <= 2 * 300 + 1e-6
    assert not math.isnan(entry["predicted"]["energy_j"])
