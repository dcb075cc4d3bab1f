"""TF32 as a plan property (issue 32 item 4): the catalog's TF32 peaks, the roofline's rate for fp32 products, a
profile of fp32 layers scaled for a TF32 plan, and the field from ``ampe search --tf32`` through the plan to the
trial's job file."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.compute import gemm_seconds, layer_times, roofline_times
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy, strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.trials.launch import job_dict
from ampe.trials.prepare import prepare
from tests.support.trial_fixtures import options


def _one(gpu: str) -> dict:
    return {"name": f"one-{gpu}", "nodes": [{"name": "n", "gpu": gpu, "count": 1, "intra_gbps": 3600,
                                             "inter_gbps": 100}]}


@pytest.mark.parametrize("name,tflops", [("A100-40GB", 156), ("A100-80GB", 156), ("A40", 74.8),
                                         ("H100-80GB", 494.7), ("H200", 494.7)])
def test_the_catalog_prices_tf32_where_the_gpu_has_it_with_a_source(name, tflops):
    gpu = CATALOG[name]
    assert gpu.peak_flops("tf32") == pytest.approx(tflops * 1e12)
    assert gpu.peak_flops_fp32 < gpu.peak_flops("tf32") < gpu.peak_flops("bf16")
    assert any("TF32" in s and f"{tflops:g}" in s for s in gpu.sources)


@pytest.mark.parametrize("name", ["V100-16GB", "T4", "RTX3090", "cpu"])
def test_without_tf32_tensor_cores_fp32_runs_at_the_simt_rate(name):
    gpu = CATALOG[name]
    assert gpu.peak_flops_tf32 is None and gpu.peak_flops("tf32") == gpu.peak_flops("fp32")
    assert not gpu.tensor_cores("tf32")


def test_tf32_speeds_up_fp32_products_only_where_it_runs():
    """gpt2-medium fp32, mbs 8: TF32 allowed makes the A100's layers faster, not the V100's; a bf16 model is the same
    with or without it."""
    fp32 = load_model("gpt2-medium").variant(dtype="fp32")
    a100, v100 = CATALOG["A100-80GB"], CATALOG["V100-32GB"]
    off, on = (roofline_times(fp32.with_tf32(t), a100, 1, 8)[0].sum() for t in (False, True))
    assert on < off / 2  # GEMM-bound at the SIMT rate: the tensor cores are 8× faster
    assert roofline_times(fp32.with_tf32(True), v100, 1, 8)[0].sum() == roofline_times(fp32, v100, 1, 8)[0].sum()
    bf16 = load_model("gpt2-medium").variant(dtype="bf16")
    assert np.array_equal(roofline_times(bf16.with_tf32(True), a100, 1, 8)[0], roofline_times(bf16, a100, 1, 8)[0])


def test_a_large_tf32_gemm_runs_at_the_tf32_rate_and_an_unaligned_one_at_the_fp32_rate():
    gpu = CATALOG["H100-80GB"]
    flops, moved = 2.0 * 8192**3, 3 * 4.0 * 8192**2
    eff = gpu.matmul_efficiency
    assert gemm_seconds(flops, moved, gpu, "tf32") == pytest.approx(flops / (494.7e12 * eff) + gpu.gemm_overhead_s)
    assert gemm_seconds(flops, moved, gpu, "tf32", aligned=False) == pytest.approx(
        flops / (67e12 * eff) + gpu.gemm_overhead_s)
    assert gemm_seconds(flops, moved, gpu, "fp32") == gemm_seconds(flops, moved, gpu, "tf32", aligned=False)


def test_a_profile_of_fp32_layers_is_scaled_by_the_roofline_for_a_tf32_plan(tmp_path):
    """The profiler measures fp32 with TF32 off; a TF32 plan takes each profiled layer × roofline(TF32) /
    roofline(fp32). The rows here are the roofline's own fp32 figures × 1.3 (a profile 30 % slower than the
    roofline), so the TF32 figures must be the TF32 roofline × 1.3."""
    model = load_model("gpt2-tiny").variant(dtype="fp32")
    gpu = CATALOG["A100-80GB"]
    f, b = roofline_times(model, gpu, 1, 2)
    csv = tmp_path / "fp32.csv"
    lines = (f"{model.name},{gpu.name},1,2,{i},{float(1.3 * f[i])!r},{float(1.3 * b[i])!r}\n"
             for i in range(model.num_layers))
    csv.write_text("model,device,tp,mbs,layer,forward_s,backward_s\n" + "".join(lines))
    profile = load_profile(csv)
    plain = layer_times(model, gpu, 1, 2, profile)
    tf32 = layer_times(model.with_tf32(True), gpu, 1, 2, profile)
    tf_f, tf_b = roofline_times(model.with_tf32(True), gpu, 1, 2)
    assert plain.source == "profile" and tf32.source == "profile+roofline(tf32)"
    assert np.allclose(tf32.forward_s, 1.3 * tf_f) and np.allclose(tf32.backward_s, 1.3 * tf_b)
    assert tf32.total_s.sum() < plain.total_s.sum()


def test_a_strategy_names_tf32_and_is_costed_on_that_variant():
    cm = CostModel(cluster_from_dict(_one("A100-80GB")), load_model("gpt2-medium").variant(dtype="fp32"))
    s = strategy_from_dict({"pp": 1, "dp": 1, "tp": 1, "mbs": 4, "gbs": 16, "tf32": True})
    assert s.tf32 is True and s.to_dict()["tf32"] is True
    assert "tf32" not in Strategy(1, 1, 1, 4, 16).to_dict()  # an older record: the model's own
    assert cm.estimate(s).iteration_s < cm.estimate(Strategy(1, 1, 1, 4, 16)).iteration_s
    assert cm.for_strategy(s).model.tf32 and cm.for_strategy(s) is cm.for_strategy(s)
    with pytest.raises(InputError, match="tf32"):
        strategy_from_dict({"pp": 1, "dp": 1, "tp": 1, "mbs": 4, "gbs": 16, "tf32": "yes"})


def test_search_tf32_travels_from_the_plan_to_the_job_file(tmp_path, run_cli):
    """``ampe search --tf32 on`` on a CPU cluster (no TF32 there: the same times) records it in the plan's inputs
    and every entry; the trial's job file hands it to the worker, which sets torch's flags."""
    spec = tmp_path / "cpu.yaml"
    spec.write_text("name: cpu2\nnodes:\n  - {name: n, gpu: cpu, count: 2, intra_gbps: 100, inter_gbps: 10}\n")
    plans = {}
    for flag in ("on", "off"):
        out = tmp_path / f"plan_{flag}.json"
        code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8",
                               "--top-k", "2", "--energy-planner", "none", "--tf32", flag, "--out", out)
        assert code == 0, err
        plans[flag] = json.loads(out.read_text())
    on, off = plans["on"], plans["off"]
    assert on["inputs"]["tf32"] is True and off["inputs"]["tf32"] is False
    assert all(e["tf32"] is True for e in on["strategies"]) and all(e["tf32"] is False for e in off["strategies"])
    assert [e["predicted"]["iteration_s"] for e in on["strategies"]] == \
        [e["predicted"]["iteration_s"] for e in off["strategies"]]  # a CPU core has no TF32
    ctx, trials, _ = prepare(tmp_path / "plan_on.json", options(tmp_path / "out"))
    job = job_dict(ctx, trials[0], tmp_path / "job")
    assert job["tf32"] is True and job["strategy"]["tf32"] is True
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--tf32", "maybe")
    assert code == 2 and "--tf32" in err


def test_a_measurement_that_ran_fp32_on_a_tf32_gpu_without_naming_tf32_is_said_to_be_assumed(tmp_path):
    from ampe.formats.measurement import read_measurements
    from ampe.report.measurements import report_from_measurements

    line = {"pp": 1, "dp": 1, "tp": 1, "mbs": 4, "gbs": 16, "partition": [0, 30], "recompute": "none", "zero": 0,
            "attention": "eager"}
    path = tmp_path / "m.jsonl"
    path.write_text("\n".join(json.dumps({"strategy": {**line, **extra}, "iteration_s": 1.0, "status": "ok"})
                              for extra in ({"dtype": "fp32"}, {"dtype": "fp32", "tf32": True},
                                            {"dtype": "bf16"})) + "\n")
    model = load_model("gpt2-medium")
    got = report_from_measurements(read_measurements(path), cluster_from_dict(_one("A100-80GB")), model)
    assert got.assumed == ("1 line(s) do not name tf32 (line 1): assumed off (the model's; PyTorch's default is "
                           "off)",)
    by_line = {r.trial_id: r.predicted_s for r in got.report.rows}
    assert by_line["line 2"] < by_line["line 1"] / 2  # the TF32 line is costed as TF32, the other as fp32
