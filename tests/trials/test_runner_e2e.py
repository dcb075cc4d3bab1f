"""End to end with the real worker on this machine's CPUs: search → trial (torchrun + DeepSpeed) → report →
calibrate → search again with the calibrated profile. One trial only (each takes 10-20 s here); the multi-trial CI
run is separate."""

from __future__ import annotations

import json

import pytest

from ampe.report.compare import build_report

pytest.importorskip("deepspeed")
pytest.importorskip("ampe.runtime.worker")


@pytest.mark.trial
def test_search_trial_report_calibrate_loop(tmp_path, run_cli):
    from conftest import SPECS  # tests/conftest.py

    spec = SPECS / "local-cpu.yaml"
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8",
                           "--top-k", "3", "--out", plan)
    assert code == 0, err
    out = tmp_path / "trials"
    code, stdout, err = run_cli("trial", "--plan", plan, "--top-k", "1", "--warmup", "1", "--iters", "2",
                                "--timeout", "240", "--out", out, "--progress", "none")
    assert code == 0, err
    (line,) = [json.loads(l) for l in (out / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "ok", line["reason"]
    assert len(line["iteration_s"]) == 2 and line["iteration_s_mean"] > 0
    assert len(line["peak_memory_bytes_per_rank"]) == 2 and line["memory_source"]
    assert line["energy_source"].startswith("modelled")  # no energy counter on a CPU
    job = json.loads((tmp_path / "trials" / "trials" / line["trial_id"] / "job.json").read_text())
    assert job["schema"] == "ampe.job/1" and job["device"] == "cpu"
    report = build_report(out)
    assert len(report.measured) == 1 and report.best_measured.plan_rank == 1

    code, stdout, err = run_cli("report", out, "--plot", tmp_path / "p.png", "--calibrate", tmp_path / "cal.csv")
    assert code == 0, err
    assert (tmp_path / "p.png").stat().st_size > 10_000
    assert "calibrated profile written" in stdout

    # The loop closes: the calibrated profile, fitted on this one strategy, predicts it at its measured time. The
    # exact strategy (its ZeRO level included) goes through `evaluate`: the next search keeps one ZeRO level per
    # layout, and with calibrated link speeds that may be another level than the one measured.
    measured = tmp_path / "measured.json"
    measured.write_text(json.dumps(line["strategy"]))
    code, _, err = run_cli("evaluate", "--cluster", spec, "--model", "gpt2-tiny", "--profile", tmp_path / "cal.csv",
                           "--strategy", measured, "--json", tmp_path / "eval.json")
    assert code == 0, err
    (again,) = json.loads((tmp_path / "eval.json").read_text())["results"]
    assert again["strategy"].get("zero", 0) == line["strategy"].get("zero", 0)
    assert again["iteration_s"] == pytest.approx(line["iteration_s_mean"], rel=0.01)

    # ... and the next search reads it: the measured strategy is one of its candidates, so its best is no slower.
    plan2 = tmp_path / "plan2.json"
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8",
                           "--top-k", "20", "--profile", tmp_path / "cal.csv", "--out", plan2)
    assert code == 0, err
    entries = json.loads(plan2.read_text())["strategies"]
    best = entries[0]
    assert best["predicted"]["compute_source"] == "profile"
    assert best["predicted"]["iteration_s"] <= again["iteration_s"] * (1 + 1e-9)
    keys, s = ("pp", "dp", "tp", "mbs", "partition", "placement"), line["strategy"]
    for e in entries:  # where the search kept the measured strategy itself, it costs it as evaluate does
        if [e[k] for k in keys] == [s[k] for k in keys] and all(e.get(k) == s.get(k) for k in (
                "zero", "recompute", "stage_recompute")):
            assert e["predicted"]["iteration_s"] == pytest.approx(again["iteration_s"], rel=1e-9)
