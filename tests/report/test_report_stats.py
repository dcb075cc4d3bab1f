"""`ampe report`: statistics against hand-computed values, OOM accounting, the plot, and calibration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import spearmanr

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import strategy_from_dict
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.formats.plan import Caveat
from ampe.formats.trial import TrialResult
from ampe.report.calibrate import calibrate
from ampe.report.calibration.table import base_layer_table, scaled_profile
from ampe.report.compare import build_report, plot_report, report_from_results
from ampe.trials.results import ResultsStore
from tests.support.trial_fixtures import four_strategies, write_plan

STRATS = {s["rank"]: s for s in four_strategies()}


def result(rank: int, pred: float, meas: float | None, status: str = "ok", *, fits: bool = True,
           schedule: bool = False, baseline_key: str | None = None, energy: float | None = None,
           strategy: dict | None = None) -> TrialResult:
    s = strategy or {k: STRATS.get(rank, STRATS[1])[k] for k in ("pp", "dp", "tp", "mbs", "gbs", "gas", "partition",
                                                                  "placement", "schedule")}
    key = f"k{rank}{'s' if schedule else ''}"
    return TrialResult(key=key, trial_id=f"r{rank:03d}-{key}", plan_rank=rank, strategy=s, model="gpt2-tiny",
                       cluster="cpu2", freq_backend="emulate" if schedule else "none", schedule_applied=schedule,
                       warmup_iters=1, timed_iters=3, status=status, predicted_iteration_s=pred, predicted_fits=fits,
                       iteration_s_mean=meas if status == "ok" else None, iteration_s_std=0.0 if meas else None,
                       energy_j_per_iter=energy, energy_source="modelled (test)" if energy is not None else None,
                       baseline_key=baseline_key, reason=None if status == "ok" else "test")


def test_spearman_mape_and_best_against_hand_computed_values():
    pred, meas = [1.0, 2.0, 3.0, 4.0], [1.5, 1.2, 4.0, 3.5]
    rep = report_from_results([result(i + 1, p, m) for i, (p, m) in enumerate(zip(pred, meas, strict=False))])
    # measured ranks 2,1,4,3 vs predicted 1,2,3,4: Σd² = 4, ρ = 1 − 6·4 / (4·(16 − 1)) = 0.6
    assert rep.spearman == pytest.approx(0.6)
    assert rep.spearman == pytest.approx(spearmanr(pred, meas).statistic)
    # (0.5/1.5 + 0.8/1.2 + 1/4 + 0.5/3.5) / 4
    assert rep.mape_pct == pytest.approx((1 / 3 + 2 / 3 + 0.25 + 1 / 7) / 4 * 100)
    assert rep.median_ratio == pytest.approx(np.median([1.5, 0.6, 4 / 3, 0.875]))
    assert rep.best_predicted.plan_rank == 1 and rep.best_measured.plan_rank == 2
    assert rep.best_measured_position == 1 and rep.best_ratio == pytest.approx(1.5 / 1.2)
    assert rep.top10_mean_s == pytest.approx(2.55)
    assert rep.top10_std_s == pytest.approx(math.sqrt((1.05**2 + 1.35**2 + 1.45**2 + 0.95**2) / 4))
    assert rep.top10_min_s == 1.2


def test_spearman_needs_three_points_and_variation():
    assert report_from_results([result(1, 1.0, 1.0), result(2, 2.0, 3.0)]).spearman is None
    flat = report_from_results([result(i, 1.0, 1.0 + i) for i in (1, 2, 3)])
    assert flat.spearman is None and flat.mape_pct is not None


def test_oom_accounting_predicted_vs_observed(tmp_path):
    plan_path = write_plan(tmp_path, [*four_strategies(), {**four_strategies()[0], "rank": 6, "mbs": 8, "gas": 1,
                                                           "predicted": {"iteration_s": 1.0, "fits": False}}])
    from ampe.trials.planfile import load_plan

    rows = [result(1, 1.0, 1.1), result(2, 2.0, None, "oom"), result(3, 3.0, 3.3, fits=False),
            result(4, 4.0, None, "oom", fits=False),
            result(5, 5.0, None, "crash", strategy={**STRATS[1], "mbs": 4, "gas": 2}),
            result(7, 1.0, None, "skipped", strategy={**STRATS[1], "mbs": 4, "gas": 2})]
    rep = report_from_results(rows, load_plan(plan_path))
    o = rep.oom
    assert (o.fit_ran, o.fit_oom, o.unfit_ran, o.unfit_oom, o.other_failures) == (1, 1, 1, 1, 1)
    assert o.unfit_not_run == 1  # plan rank 6, predicted not to fit, never run
    assert rep.counts == {"ok": 2, "oom": 2, "crash": 1}  # skipped trials are not trials
    assert [r.plan_rank for r in rep.measured] == [1, 3]


def test_schedule_rows_compare_with_and_without():
    base = result(1, 1.0, 1.0, energy=10.0)
    sched = result(1, 1.05, 1.1, schedule=True, baseline_key=base.key, energy=8.0)
    rep = report_from_results([base, sched, result(2, 2.0, 2.0)])
    assert [r.plan_rank for r in rep.fidelity] == [1, 2] and not rep.fidelity[0].schedule_applied
    (s,) = rep.schedules
    assert s.measured_slowdown == pytest.approx(1.1) and s.predicted_slowdown == pytest.approx(1.05)
    assert s.energy_saving_pct == pytest.approx(20.0) and s.energy_source == "modelled (test)"


def test_plot_is_a_png_of_the_right_size(tmp_path):
    import matplotlib.image as mpimg

    rep = report_from_results([result(i, p, m) for i, p, m in ((1, 0.1, 0.12), (2, 0.2, 0.18), (3, 0.3, 0.4))])
    path = tmp_path / "sub" / "scatter.png"
    plot_report(rep, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
    assert mpimg.imread(path).shape[:2] == (640, 640)
    empty = tmp_path / "empty.png"
    plot_report(report_from_results([result(1, 0.1, None, "oom")]), empty)
    assert mpimg.imread(empty).shape[:2] == (640, 640)


def _results_dir(tmp_path: Path, results: list[TrialResult], plan_path: Path | None = None) -> Path:
    out = tmp_path / "out"
    store = ResultsStore(out)
    for r in results:
        store.append(r)
    if plan_path is not None:
        (out / "plan.json").write_text(plan_path.read_text())
    return out


def test_report_cli_prints_writes_json_and_plot(tmp_path, run_cli):
    out = _results_dir(tmp_path, [result(1, 1.0, 1.5), result(2, 2.0, 1.2), result(3, 3.0, 4.0),
                                  result(4, 4.0, None, "oom")])
    code, stdout, err = run_cli("report", out, "--plot", tmp_path / "p.png", "--json", tmp_path / "r.json")
    assert code == 0, err
    assert "Spearman ρ (predicted vs measured iteration time): 0.500" in stdout
    assert "predicted fit but OOM: 1" in stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["spearman"] == pytest.approx(0.5) and data["best_measured"]["plan_rank"] == 2
    assert (tmp_path / "p.png").exists()


def test_report_of_a_folder_without_results_is_exit_2(tmp_path, run_cli):
    code, _, err = run_cli("report", tmp_path)
    assert code == 2 and "results.jsonl" in err and err.count("\n") == 1


def test_current_plan_predictions_override_stored_ones(tmp_path):
    plan = write_plan(tmp_path, four_strategies())
    raw = json.loads(plan.read_text())
    raw["strategies"][1]["predicted"]["iteration_s"] = 0.5  # a recalibrated search re-predicted rank 2
    raw["strategies"][1]["rank"], raw["strategies"][0]["rank"] = 1, 2  # ... and now ranks it first
    plan.write_text(json.dumps(raw))
    out = _results_dir(tmp_path, [result(1, 0.02, 0.4), result(2, 0.03, 0.6)], plan)
    rep = build_report(out)
    by_label = {r.label: r for r in rep.rows}
    assert by_label["pp2·dp1·tp1·mbs2"].predicted_s == 0.5 and by_label["pp2·dp1·tp1·mbs2"].plan_rank == 1
    assert by_label["pp2·dp1·tp1·mbs1"].predicted_s == 0.02 and by_label["pp2·dp1·tp1·mbs1"].plan_rank == 2


def test_calibration_recovers_a_known_factor_and_search_reads_the_profile(tmp_path, run_cli):
    plan_path = write_plan(tmp_path, four_strategies())
    raw = json.loads(plan_path.read_text())
    cluster, model = load_cluster(raw["inputs"]["cluster_spec"]), load_model("gpt2-tiny")
    table = base_layer_table(model, cluster, None, 8)
    truth = CostModel(cluster, model, scaled_profile(table, model.name, 3.0))  # "the hardware" = model × 3
    plain = CostModel(cluster, model)
    results = []
    for s in four_strategies():
        strat = strategy_from_dict(s)
        results.append(result(s["rank"], plain.estimate(strat).iteration_s, truth.estimate(strat).iteration_s,
                               strategy={k: s[k] for k in ("pp", "dp", "tp", "mbs", "gbs", "gas", "partition",
                                                           "placement", "schedule")}))
    out = _results_dir(tmp_path, results, plan_path)
    cal = calibrate(build_report(out), tmp_path / "cal.csv")
    # Noise-free: only the priors (MAP) hold the fit back from the planted 3.0 (0.3 % when written: the other
    # parameters' priors absorb a little of the factor), so 1 % is tight and a mis-scaled fit fails.
    assert cal.params.compute_factor["cpu"] == pytest.approx(3.0, rel=0.01)
    assert cal.fit.mape_after_pct < 0.5 and cal.fit.mape_before_pct > 50.0  # 0.08 % after; 67 % before (× 3)
    profile = load_profile(tmp_path / "cal.csv")
    again = CostModel(cluster, model, profile)
    for r in results:
        assert again.estimate(strategy_from_dict(r.strategy)).iteration_s == pytest.approx(r.iteration_s_mean,
                                                                                           rel=0.005)
    code, _stdout, err = run_cli("search", "--cluster", raw["inputs"]["cluster_spec"], "--model", "gpt2-tiny",
                                "--global-batch", "8", "--profile", tmp_path / "cal.csv", "--top-k", "3")
    assert code == 0, err


def test_calibration_needs_measured_trials(tmp_path):
    out = _results_dir(tmp_path, [result(1, 1.0, None, "oom")], write_plan(tmp_path, four_strategies()))
    with pytest.raises(InputError, match="no strategy measured ok"):
        calibrate(build_report(out), tmp_path / "cal.csv")


def test_report_shows_the_footprint_and_the_at_risk_caveat(tmp_path, run_cli):
    """A record's reserved and device-used peaks get their own columns (labelled by how they were read), an at-risk
    plan entry reads `at risk` with its note, and the OOM accounting counts it apart from fit and unfit."""
    risky = Caveat(kind="memory_at_risk", note="stage 0 on device 0 (n-0): footprint within the reserve")
    rows = [result(1, 1.0, 1.5).model_copy(update={
                "peak_memory_bytes_per_rank": (3 << 30,), "memory_source": "cuda_max_allocated",
                "peak_reserved_bytes_per_rank": (4 << 30,), "peak_device_used_bytes_per_rank": (5 << 30,),
                "device_used_source": "cuda_mem_get_info (test)"}),
            result(2, 2.0, None, "oom", fits=False).model_copy(update={"predicted_caveats": (risky,)}),
            result(3, 3.0, 4.0)]
    rep = report_from_results(rows)
    assert [r.fits_label for r in rep.rows] == ["yes", "at risk", "yes"]
    assert (rep.oom.at_risk_oom, rep.oom.unfit_oom, rep.oom.fit_ran) == (1, 0, 2)
    assert (rep.rows[0].measured_reserved_bytes, rep.rows[0].measured_device_used_bytes) == (4 << 30, 5 << 30)
    code, stdout, err = run_cli("report", _results_dir(tmp_path, rows))
    assert code == 0, err
    assert "meas reserved GiB" in stdout and "4.00" in stdout and "5.00" in stdout
    assert "cuda_mem_get_info (test)" in stdout and "predicted at risk & OOM: 1" in stdout
    assert "rank 2 " in stdout and "at risk: stage 0 on device 0 (n-0)" in stdout
