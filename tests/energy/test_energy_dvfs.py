"""The analytic DVFS model: time ratios, power, valleys and blocking power of every catalog GPU type."""

from __future__ import annotations

import itertools

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.energy import dvfs
from ampe.energy.options import model_options


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_catalog_type_has_an_interior_energy_valley(name):
    gpu = CATALOG[name]
    clocks = gpu.sm_clocks_mhz()
    ratios = [dvfs.time_ratio(gpu, f) for f in clocks]
    powers = [dvfs.power_w(gpu, f) for f in clocks]
    assert ratios[-1] == pytest.approx(1.0) and all(r >= 1.0 for r in ratios)
    assert all(a > b for a, b in itertools.pairwise(ratios))  # faster clock, shorter time
    assert all(a < b for a, b in itertools.pairwise(powers))  # and more power
    energy = [p * r for p, r in zip(powers, ratios, strict=False)]
    valley = dvfs.energy_valley_mhz(gpu)
    assert clocks[0] < valley < clocks[-1]  # neither end: a real valley
    assert min(energy) < energy[0] and min(energy) < energy[-1]
    assert 0 < dvfs.blocking_power_w(gpu) < powers[0]  # waiting costs less than computing at any clock
    assert powers[-1] <= gpu.tdp_w


def test_power_rises_superlinearly_with_clock():
    gpu = CATALOG["A100-80GB"]
    base = dvfs.power_w(gpu, gpu.sm_clock_min_mhz)
    dyn = [dvfs.power_w(gpu, f) - base for f in (400, 800, 1200)]
    assert dyn[2] - dyn[1] > dyn[1] - dyn[0] > 0  # convex in f


@pytest.mark.parametrize("name,valley", [("V100-16GB", 1020), ("RTX3090", 1350)])
def test_valley_matches_envpipe_measurements(name, valley):
    """EnvPipe §2.2: V100 ≈ 1020 MHz, RTX3090 ≈ 1350 MHz; 20–25% longer at the valley (§4.2)."""
    gpu = CATALOG[name]
    assert dvfs.energy_valley_mhz(gpu) == pytest.approx(valley, abs=gpu.sm_clock_step_mhz)
    assert 1.20 <= dvfs.time_ratio(gpu, valley) <= 1.25


def test_perseus_blocking_power_default_for_a100():
    assert dvfs.blocking_power_w(CATALOG["A100-40GB"]) == 70.0


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
