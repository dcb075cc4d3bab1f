"""The analytic DVFS model: time ratios, power, valleys and blocking power of every catalog GPU type."""

from __future__ import annotations

import itertools

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.energy import dvfs
from ampe.energy.model_options import model_options


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_catalog_type_has_an_interior_energy_valley(name):
    gpu = CATALOG[name]
    clocks = gpu.sm_clocks_mhz()
    ratios = [dvfs.time_ratio(gpu, f) for f in clocks]
    powers = [dvfs.power_w(gpu, f) for f in clocks]
    assert ratios[-1] == pytest.approx(1.0) and all(r >= 1.0 for r in ratios)
    assert all(a >= b for a, b in itertools.pairwise(ratios))  # faster clock, never longer
    assert all(a <= b for a, b in itertools.pairwise(powers))  # and never less power
    below_cap = [i for i, p in enumerate(powers) if p < powers[-1] - 1e-9]  # a capped card throttles above
    assert all(ratios[i] > ratios[i + 1] for i in below_cap[:-1]) and all(powers[i] < powers[i + 1] for i in below_cap)
    energy = [p * r for p, r in zip(powers, ratios, strict=False)]
    valley = dvfs.energy_valley_mhz(gpu)
    assert clocks[0] < valley < clocks[-1]  # neither end: a real valley
    assert min(energy) < energy[0] and min(energy) < energy[-1]
    assert 0 < dvfs.blocking_power_w(gpu) < powers[0]  # waiting costs less than computing at any clock
    cap = dvfs.params_for(gpu).power_cap_w
    assert powers[-1] <= (gpu.tdp_w if cap is None else cap) + 1e-9


def test_power_rises_superlinearly_with_clock():
    gpu = CATALOG["A100-80GB"]
    base = dvfs.power_w(gpu, gpu.sm_clock_min_mhz)
    dyn = [dvfs.power_w(gpu, f) - base for f in (400, 800, 1200)]
    assert dyn[2] - dyn[1] > dyn[1] - dyn[0] > 0  # convex in f


def test_a40_clocks_above_the_cap_change_nothing():
    """Perseus's A40 profiles: under the 300 W cap, clocks above ~1500 MHz give the same time and power."""
    gpu = CATALOG["A40"]
    for f in (1530, 1620, 1740):
        assert dvfs.time_ratio(gpu, f) == pytest.approx(1.0)
        assert dvfs.power_w(gpu, f) == pytest.approx(dvfs.power_w(gpu, 1740))
    assert dvfs.time_ratio(gpu, 1200) > 1.05


def test_measured_types_are_fitted_and_the_rest_say_assumed():
    for name in ("A100-40GB", "A100-80GB", "A40", "V100-16GB", "V100-32GB"):
        assert not dvfs.params_for(CATALOG[name]).assumed, name
    for name in ("H100-80GB", "RTX3090", "T4", "cpu"):
        assert dvfs.params_for(CATALOG[name]).assumed, name


def test_gh100_busy_and_blocking_power_are_the_fitted_ones_at_f_max():
    """H100 and H200: busy power is the fitted power of tensor-core-bound kernels at f_max, at most the 700 W limit
    (the fit gives more; the H200's GEMM-bound blocks measured 704 W), blocking power the fitted idle power; a
    computation's own power comes from its kernels (ampe.costmodel.kernel_energy)."""
    for name in ("H100-80GB", "H200"):
        gpu = CATALOG[name]
        assert gpu.kernel_power is not None and gpu.kernel_power.tensor_w > 700.0
        assert dvfs.power_w(gpu, gpu.sm_clock_max_mhz) == pytest.approx(700.0)
        assert dvfs.blocking_power_w(gpu) == gpu.kernel_power.idle_w
        assert "fitted at f_max only" in dvfs.params_for(gpu).source


def test_the_earlier_model_is_the_special_case_n1_no_knee_constant_static():
    p = dvfs._old(0.5, 0.7, 300.0, 60.0, "x")
    x = 0.6
    s = p.static_share
    assert dvfs.relative_time(p, x) == pytest.approx(0.5 / x + 0.5)
    assert dvfs.relative_power(p, x) == pytest.approx(s + (1 - s) * x**3)


def test_perseus_measured_blocking_power_for_a100_and_a40():
    assert dvfs.blocking_power_w(CATALOG["A100-40GB"]) == 83.64
    assert dvfs.blocking_power_w(CATALOG["A40"]) == 70.38


def test_unknown_types_get_generic_defaults_and_clocks_above_max_count_as_max():
    gpu = CATALOG["A100-80GB"].with_overrides(name="custom", sm_clock_max_mhz=1000.0, tdp_w=250.0)
    assert dvfs.params_for(gpu).source == "generic assumed defaults"
    assert dvfs.time_ratio(gpu, 5000) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        dvfs.time_ratio(gpu, 0)


def test_model_options_scale_with_gpus_per_stage():
    gpu = CATALOG["H100-80GB"]
    one, eight = model_options(gpu, 0.05, 1), model_options(gpu, 0.05, 8)
    assert [o.mhz for o in one.options] == list(gpu.sm_clocks_mhz())
    for a, b in zip(one.options, eight.options, strict=False):
        assert b.time_s == a.time_s and b.energy_j == pytest.approx(8 * a.energy_j)
    assert one.fastest.mhz == gpu.sm_clock_max_mhz and one.fastest.time_s == pytest.approx(0.05)
