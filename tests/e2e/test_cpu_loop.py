"""The whole loop on this machine's CPUs, through the CLI: ``ampe profile`` a tiny GPT-2 → ``ampe search --profile``
→ ``ampe trial`` the top 3 strategies (torchrun + DeepSpeed, world size 2) → ``ampe report`` (figures, plot).

Asserts that what each step produced is valid and meaningful, never how accurate the timings are (a shared 2-core
machine is too noisy for that; ``benchmarks/fidelity_cpu.py`` measures fidelity). Budget: about a minute with
DeepSpeed's JIT-built op cached (``make test`` builds it first), two more on a cold machine, where ``ampe trial``
builds it once before its first trial (not within any trial's timeout).
"""

from __future__ import annotations

import json
import math
import os
import time

import pytest
from scipy.stats import spearmanr

from ampe.costmodel.profile import load_profile
from ampe.io import read_json
from tests.support.plans import validate_plan

pytest.importorskip("deepspeed")

MODEL = "gpt2-tiny"
TOP_K = 3
WARMUP, ITERS = 1, 3


@pytest.mark.trial
def test_profile_search_trial_report_on_local_cpu(tmp_path, run_cli):
    from conftest import SPECS  # tests/conftest.py

    t0 = time.monotonic()
    spec = SPECS / "local-cpu.yaml"
    profile = tmp_path / "profile.csv"
    code, _, err = run_cli("profile", "--model", MODEL, "--device", "cpu", "--tp", "1,2", "--mbs", "1,2,4",
                           "--warmup", "1", "--repeats", "3", "--out", profile)
    assert code == 0, err
    prof = load_profile(profile)
    layers = 10  # gpt2-tiny: embedding, noop, 4 blocks, noop, norm, logits, noop
    assert all(prof.covers(MODEL, "cpu", tp, layers) for tp in (1, 2))
    for tp in (1, 2):
        for layer in range(layers):
            f, b = prof.layer_time(MODEL, "cpu", tp, layer, 2)
            assert f > 0 and b > 0
    # A transformer block keeps activations; the noops keep none.
    assert prof.layer_memory(MODEL, "cpu", 1, 2, 1) > 0 and prof.layer_memory(MODEL, "cpu", 1, 1, 1) == 0

    # Global batch 8 on 2 devices: pp 2, dp 2 and tp 2 at micro-batches 1..8 compete.
    plan = tmp_path / "plan.json"
    code, out, err = run_cli("search", "--cluster", spec, "--model", MODEL, "--profile", profile,
                             "--global-batch", "8", "--top-k", "8", "--out", plan)
    assert code == 0, err
    doc = validate_plan(read_json(plan), str(plan))
    top = doc["strategies"][:TOP_K]
    assert len(top) == TOP_K
    assert all("profile" in e["predicted"]["compute_source"] for e in top)
    shapes = {(e["pp"], e["dp"], e["tp"], e["mbs"]) for e in top}
    assert len(shapes) == TOP_K  # three different strategies (degrees or micro-batch size)
    times = [e["predicted"]["iteration_s"] for e in doc["strategies"]]
    assert times == sorted(times)

    results = tmp_path / "trials"
    code, out, err = run_cli("trial", "--plan", plan, "--top-k", str(TOP_K), "--warmup", str(WARMUP), "--iters",
                             str(ITERS), "--timeout", "300", "--out", results, "--progress", "none",
                             "--freq-backend", "none")  # the plan's frequency schedules are not what this tests
    assert code == 0, err
    lines = [json.loads(line) for line in (results / "results.jsonl").read_text().splitlines()]
    assert len(lines) == TOP_K
    for line in lines:
        assert line["schema"] == "ampe.trial/1" and line["status"] == "ok", line["reason"]
        s = line["strategy"]
        world = s["pp"] * s["dp"] * s["tp"]
        assert world == 2 and s["gas"] * s["mbs"] * s["dp"] == 8
        assert len(line["iteration_s"]) == ITERS and all(t > 0 for t in line["iteration_s"])
        assert line["iteration_s_mean"] == pytest.approx(sum(line["iteration_s"]) / ITERS)
        peaks = line["peak_memory_bytes_per_rank"]
        assert len(peaks) == world and all(isinstance(p, int) and p > 1_000_000 for p in peaks)
        assert line["memory_source"] == "cpu_alloc_trace"
        assert line["predicted_iteration_s"] > 0 and line["predicted_max_memory_bytes"] > max(peaks)
        assert line["energy_source"].startswith("modelled")  # no energy counter on a CPU
        worker = line["worker"]
        # it trained (a few steps over different batches need not lower the loss yet; tests/launch checks that)
        assert math.isfinite(worker["loss_first"]) and math.isfinite(worker["loss_last"])
        # how busy other processes kept the machine: read on Linux (one host), a share of this machine's cores
        other = worker.get("host_other_cores")
        assert other is not None and 0 <= other <= (os.cpu_count() or 1), other
    assert {(l["strategy"]["pp"], l["strategy"]["dp"], l["strategy"]["tp"], l["strategy"]["mbs"])
            for l in lines} == shapes

    png, report_json = tmp_path / "report.png", tmp_path / "report.json"
    code, out, err = run_cli("report", results, "--plot", png, "--json", report_json)
    assert code == 0, err
    assert "Spearman" in out and "MAPE" in out and "best measured" in out
    rep = read_json(report_json)
    assert rep["counts"] == {"ok": TOP_K}
    assert rep["mape_pct"] is not None and math.isfinite(rep["mape_pct"]) and rep["mape_pct"] >= 0
    # The figures are those of the trials' own records: Spearman of predicted against measured time, the best
    # measured, and the measured time of the predicted best (plan rank 1) over it
    predicted = [l["predicted_iteration_s"] for l in lines]
    measured = [l["iteration_s_mean"] for l in lines]
    rho = spearmanr(predicted, measured).statistic
    assert rep["spearman"] == pytest.approx(rho, abs=1e-12), (rep["spearman"], predicted, measured)
    assert rep["best_measured"]["measured_s"] == min(measured)
    first = next(l for l in lines if l["plan_rank"] == 1)
    assert rep["best_predicted"]["plan_rank"] == 1
    assert rep["best_ratio"] == pytest.approx(first["iteration_s_mean"] / min(measured), rel=1e-12)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    print(f"e2e CPU loop: {time.monotonic() - t0:.0f} s")  # shown with pytest -s; the report lists it
