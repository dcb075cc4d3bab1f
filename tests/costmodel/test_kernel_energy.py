"""Power at f_max from the kernels' bounds (``ampe.costmodel.kernel_energy``; docs/energy.md §1): the charge of one
computation, where it applies, what the energy planner says of it, and a variant's watts."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.compute import busy_seconds, gemm_seconds, memory_seconds, roofline_times
from ampe.costmodel.dvfs_params import KernelPower
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.kernel_energy import cumulative_busy, energy_at_fmax
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy.strategy import plan_clocks

POWER = KernelPower(100.0, 700.0, 500.0, 400.0)


def _one(gpu: str, **extra) -> dict:
    return {"name": "one", "nodes": [{"name": "n", "gpu": gpu, "count": 1, "intra_gbps": 3600, "inter_gbps": 100}],
            **extra}


def test_each_bound_at_its_power_and_the_rest_of_the_time_idle():
    busy = np.array([0.2, 0.1, 0.3])  # tensor, simt, memory seconds
    assert energy_at_fmax(POWER, busy, 1.0) == pytest.approx(700 * 0.2 + 500 * 0.1 + 400 * 0.3 + 100 * 0.4)
    # a roofline slower than the time used: its busy seconds shrink to that time, none idle
    assert energy_at_fmax(POWER, busy, 0.3) == pytest.approx(0.5 * (700 * 0.2 + 500 * 0.1 + 400 * 0.3))
    assert energy_at_fmax(POWER, np.zeros(3), 0.5) == pytest.approx(50.0)


def test_busy_seconds_are_the_roofline_less_its_fixed_costs():
    """By bound, the roofline's seconds without the layer's, the compute-bound GEMM calls' and the passes' fixed
    costs; full recomputation adds the forward's busy seconds to the backward."""
    model, gpu = load_model("gpt2-medium"), CATALOG["H100-80GB"]
    f, b = busy_seconds(model, gpu, 1, 8)
    rf, _ = roofline_times(model, gpu, 1, 8)
    block = 2
    layer = model.layers[block]
    compute_bound = sum(1 for g in layer.gemms
                        if gemm_seconds(g.call_flops(1, 8), g.call_bytes(1, 8, 2), gpu, "fp16", g.aligned(1, 2))
                        > memory_seconds(g.call_bytes(1, 8, 2), gpu))
    fixed = gpu.layer_overhead_s + len(layer.elementwise) * gpu.pass_overhead_s + compute_bound * gpu.gemm_overhead_s
    assert compute_bound == 4  # QKV, projection, MLP; the two attention bmm are memory-bound
    assert f[block].sum() == pytest.approx(rf[block] - fixed, rel=1e-12)
    assert f[block][2] > f[block][0]  # eager gpt2-medium blocks are memory-bound on an H100
    assert f[-2][1] > 0 and f[-2][0] == 0  # the LM head (vocabulary 50,257) runs on the SIMT cores
    _, cb = cumulative_busy(model, gpu, 1, 8, "full")
    recomputed = sum(f[i] for i, layer in enumerate(model.layers) if layer.checkpointed and not layer.frozen)
    assert cb[-1] == pytest.approx(b.sum(axis=0) + recomputed)


def test_an_h100_without_measured_energy_draws_what_its_kernels_do_and_says_so():
    cluster = cluster_from_dict(_one("H100-80GB"))
    est = CostModel(cluster, load_model("gpt2-medium")).estimate(Strategy(1, 1, 1, 8, 32))
    [[(joules, seconds)]] = est.kernel_energy
    assert seconds == pytest.approx(est.fwd_s[0][0] + est.bwd_s[0][0])
    assert 400 < joules / seconds < 600  # memory-bound eager blocks and a SIMT LM head: well under the 700 W limit
    se = plan_clocks(est, cluster, fastest_only=True)
    assert "power at f_max from the kernels' bounds, fitted at f_max only" in se.source
    # a type without a fitted power keeps the DVFS model's busy power for every computation
    a100 = cluster_from_dict(_one("A100-80GB"))
    est = CostModel(a100, load_model("gpt2-medium")).estimate(Strategy(1, 1, 1, 8, 32))
    assert est.kernel_energy == () and plan_clocks(est, a100, fastest_only=True).source == \
        "modelled (analytic DVFS model)"


def test_a_variant_with_another_tdp_scales_the_fitted_watts():
    spec = _one("H100-PCIe", gpu_types={"H100-PCIe": {"base": "H100-80GB", "tdp_w": 350}})
    gpu = cluster_from_dict(spec).devices[0].gpu
    base = CATALOG["H100-80GB"].kernel_power
    assert gpu.kernel_power is not None and base is not None
    assert gpu.kernel_power.watts() == pytest.approx(tuple(w / 2 for w in base.watts()))
    assert gpu.kernel_power.idle_w == pytest.approx(base.idle_w / 2)
    assert gpu.kernel_power.source.startswith("derived from H100-80GB")
    same = cluster_from_dict(_one("H100-big", gpu_types={"H100-big": {"base": "H100-80GB", "memory_gb": 94}}))
    assert same.devices[0].gpu.kernel_power == base
