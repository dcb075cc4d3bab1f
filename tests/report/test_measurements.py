"""`ampe report --measurements`: measurements from any source, bad lines by line and field, and a structural
calibration that a later `--profile` applies whole (CSV rows plus the sidecar)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy, complete
from ampe.costmodel.zoo import load_model
from ampe.formats.calibration import SIDECAR_SUFFIX, CalibrationFile, CalibrationParams
from ampe.formats.measurement import Measurement, measurement_line, read_measurements
from ampe.report.calibration.measured import CalibrationInputs, measured_set, predict
from ampe.report.measurements import report_from_measurements
from tests.conftest import AMP_PROFILE, SPECS

HOM = SPECS / "amp-homogeneous.yaml"
# (mbs, partition, tp, pp) of AMP's Tables 6-7 on 16 T4s, gbs 32
STRATEGIES = [(1, [0, 30], 1, 1), (2, [0, 14, 30], 1, 2), (2, [0, 30], 2, 1), (4, [0, 14, 30], 1, 2),
              (4, [0, 30], 2, 1), (1, [0, 15, 30], 1, 2), (1, [0, 9, 15, 21, 30], 1, 4),
              (1, [0, 6, 9, 12, 15, 18, 21, 24, 30], 1, 8), (2, [0, 15, 30], 1, 2)]


def _strategies(model):
    return [complete(Strategy(pp, 16 // (tp * pp), tp, mbs, 32, tuple(part)), model.num_layers)
            for mbs, part, tp, pp in STRATEGIES]


def _line(s: Strategy, iteration_s, status="ok", **extra) -> str:
    d = {"strategy": {"pp": s.pp, "dp": s.dp, "tp": s.tp, "mbs": s.mbs, "gbs": s.gbs,
                      "partition": list(s.partition or ())}, "iteration_s": iteration_s, "status": status, **extra}
    return json.dumps(d)


def test_a_measurement_line_round_trips_and_ok_needs_a_time():
    m = Measurement.parse({"strategy": {"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "gbs": 4, "partition": [0, 10]},
                           "iteration_s": 0.5, "status": "ok", "energy_j": 10.0}, "f")
    assert Measurement.parse(json.loads(measurement_line(m)), "f") == m
    from ampe.errors import InputError

    with pytest.raises(InputError, match="iteration_s"):
        Measurement.parse({**m.to_json(), "iteration_s": None}, "f")
    with pytest.raises(InputError, match="iteration_s"):
        Measurement.parse({**m.to_json(), "status": "oom"}, "f")


def test_bad_lines_are_named_by_line_and_field_and_the_good_ones_are_used(tmp_path, run_cli):
    model = load_model("gpt2-amp")
    strategies = _strategies(model)
    lines = [_line(s, 1.0 + 0.1 * i) for i, s in enumerate(strategies[:4])]
    lines.insert(1, "{not json")  # line 2
    lines.insert(3, _line(strategies[4], -1.0))  # line 4: negative time
    lines.append(json.dumps({"strategy": {"pp": 3, "dp": 1, "tp": 1, "mbs": 1, "gbs": 32, "partition": [0, 10, 20, 30]},
                             "iteration_s": 1.0, "status": "ok"}))  # line 7: 3 ranks on 16 devices
    lines.append(_line(strategies[5], None, "oom", peak_memory_bytes=17 << 30))  # line 8
    lines.append(_line(strategies[0], 1.2))  # line 9: a repeat of line 1's strategy
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(lines) + "\n# a comment\n\n")
    code, out, err = run_cli("report", "--measurements", f, "--cluster", HOM, "--model", "gpt2-amp", "--profile",
                             AMP_PROFILE, "--json", tmp_path / "r.json")
    assert code == 2
    errors = [ln for ln in err.splitlines() if ln.startswith("ampe report: error:")]
    assert len(errors) == 3
    assert f"{f}:2" in errors[0] and f"{f}:4: iteration_s" in errors[1] and f"{f}:7: strategy.pp·dp·tp" in errors[2]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["counts"] == {"ok": 4, "oom": 1}
    by_line = {t["trial_id"]: t for t in rep["trials"]}
    assert by_line["line 1,9"]["measured_s"] == pytest.approx(1.1)  # mean of the repeated strategy
    assert by_line["line 1,9"]["measured_std_s"] == pytest.approx(0.1)  # and its spread
    assert by_line["line 3"]["measured_std_s"] is None
    assert "6 good lines, 5 distinct strategies" in out and "lines 1,9" in out
    assert by_line["line 8"]["status"] == "oom" and by_line["line 8"]["measured_memory_bytes"] == 17 << 30
    assert "Spearman" in out


def test_unit_mistakes_nan_and_encoding_cost_only_their_own_line(tmp_path):
    """A byte-order mark is ignored; a line holding bytes that are not UTF-8, a NaN, or a time of 1e300 s (a unit
    mistake) is one error naming its line (and field); every other line is kept."""
    strategies = _strategies(load_model("gpt2-amp"))
    good = [_line(s, 1.0 + 0.1 * i) for i, s in enumerate(strategies[:3])]
    f = tmp_path / "m.jsonl"
    f.write_bytes(b"\xef\xbb\xbf" + "\n".join([
        good[0],
        _line(strategies[3], 1e300),  # line 2
        good[1],
        _line(strategies[4], 1.0).replace("1.0", "NaN"),  # line 4
        good[2],
    ]).encode() + b"\n" + _line(strategies[5], 1.0).encode().replace(b"ok", b"o\xff") + b"\n")  # line 6
    got = read_measurements(f)
    assert [g.line for g in got.lines] == [1, 3, 5]
    assert [str(e) for e in got.errors] == [
        f"{f}:2: iteration_s: 1e+300 s is outside 1e-09 to 1,000,000 s (iteration time)",
        f"{f}:4: iteration_s: NaN is not a number ampe accepts (JSON has no NaN or Infinity)",
        f"{f}:6: not UTF-8 text"]


def test_a_sidecar_refuses_booleans_for_numbers():
    from ampe.errors import InputError

    for params in ({"compute_factor": {"cpu": True}}, {"mbs_exponent": False}, {"pipeline_op_s": {"cpu": True}},
                   {"link_efficiency": {"inter": True}}):
        with pytest.raises(InputError, match="params"):
            CalibrationFile.parse({"schema": "ampe.calibration/1", "params": params}, "side")
    assert CalibrationFile.parse({"schema": "ampe.calibration/1", "params": {"compute_factor": {"cpu": 2}}},
                                 "side").params.compute_factor["cpu"] == 2.0  # an integer is a number


def test_report_predictions_are_the_cost_models_and_ranks_follow_them(tmp_path):
    cluster, model, profile = load_cluster(HOM), load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    strategies = _strategies(model)
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(_line(s, 1.0 + i) for i, s in enumerate(strategies)))
    got = report_from_measurements(read_measurements(f), cluster, model, profile)
    cm = CostModel(cluster, model, profile)
    pred = {r.trial_id: r.predicted_s for r in got.report.rows}
    assert pred == {f"line {i + 1}": pytest.approx(cm.estimate(s).iteration_s) for i, s in enumerate(strategies)}
    ranked = sorted(got.report.rows, key=lambda r: r.plan_rank)
    assert [r.predicted_s for r in ranked] == sorted(pred.values())


def test_report_needs_a_source_and_refuses_mixed_ones(tmp_path, run_cli):
    code, _, err = run_cli("report")
    assert code == 2 and "--measurements" in err
    code, _, err = run_cli("report", "--measurements", tmp_path / "none.jsonl", "--model", "gpt2-amp")
    assert code == 2 and "--cluster" in err
    code, _, err = run_cli("report", tmp_path, "--cluster", HOM)
    assert code == 2 and "--cluster" in err and err.count("\n") == 1


def test_structural_calibration_recovers_known_hardware_and_a_profile_applies_it_whole(tmp_path, run_cli):
    """Measurements made by a "hardware" that is the cost model with known structural errors: T4 compute 1.4×
    slower, per-sample time falling as mbs^-0.2, inter-node links at 40 % of the spec. The calibrated CSV and its
    sidecar, read back as an ordinary --profile, predict every measurement."""
    cluster, model, profile = load_cluster(HOM), load_model("gpt2-amp"), load_profile(AMP_PROFILE)
    strategies = _strategies(model)
    truth = CalibrationParams(compute_factor={"T4": 1.4}, mbs_exponent=0.2, link_efficiency={"inter": 0.4})
    data = measured_set(CalibrationInputs(cluster, model, profile, str(AMP_PROFILE), 32), strategies,
                        np.ones(len(strategies)))
    measured = predict(data, truth)
    before = np.array([CostModel(cluster, model, profile).estimate(s).iteration_s for s in strategies])
    assert np.max(np.abs(before - measured) / measured) > 0.15  # the structural errors matter
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(_line(s, float(t)) for s, t in zip(strategies, measured, strict=True)))
    out_csv = tmp_path / "cal.csv"
    code, out, err = run_cli("report", "--measurements", f, "--cluster", HOM, "--model", "gpt2-amp", "--profile",
                             AMP_PROFILE, "--calibrate", out_csv)
    assert code == 0, err
    assert "mbs_exponent" in out and "leave-one-out" in out
    assert "link_efficiency[inter]" in out  # printed whole (a table cell is never rich markup)
    side = CalibrationFile.parse(json.loads((tmp_path / ("cal.csv" + SIDECAR_SUFFIX)).read_text()), "side")
    # Intra- and inter-node efficiency trade off on these strategies (every ring crosses nodes), so only the
    # compute side is checked parameter by parameter; the links by the predictions below.
    assert side.params.compute_factor["T4"] == pytest.approx(1.4, rel=0.1)
    assert side.params.mbs_exponent == pytest.approx(0.2, abs=0.05)
    assert side.fit is not None and side.fit.strategies == len(strategies)
    assert side.fit.mape_after_pct < 2.0 < side.fit.mape_before_pct
    # every candidate structure's leave-one-out is recorded and printed; the one taken is allowed and, the data being
    # the model with structural errors, orders at least as well as the one time factor
    names = [c.structure for c in side.fit.candidates]
    assert names == ["scale", "scale+mbs", "compute+mbs+ops", "full"] and "candidate structures" in out
    taken = next(c for c in side.fit.candidates if c.structure == side.fit.structure)
    assert taken.allowed and side.fit.candidates[0].allowed and taken.structure != "scale"
    assert taken.plain_discordance <= side.fit.candidates[0].plain_discordance
    again = CostModel(cluster, model, load_profile(out_csv))  # finds the sidecar itself
    after = np.array([again.estimate(s).iteration_s for s in strategies])
    assert np.max(np.abs(after - measured) / measured) < 0.03
    # and the commands that read it say so
    one = tmp_path / "s.json"
    one.write_text(json.dumps(json.loads(_line(strategies[0], 1.0))["strategy"]))
    code, out, err = run_cli("evaluate", "--cluster", HOM, "--model", "gpt2-amp", "--profile", out_csv,
                             "--strategy", one)
    assert code == 0, err
    assert f"calibration: {out_csv}{SIDECAR_SUFFIX} applied" in out
    assert f"{after[0]:.4f}" in out
    # a plan records the calibration it was made with; a replan records the one found now
    plan, again_plan = tmp_path / "p.json", tmp_path / "r.json"
    code, out, err = run_cli("search", "--cluster", HOM, "--model", "gpt2-amp", "--profile", out_csv, "--global-batch",
                             "32", "--top-k", "2", "--energy-planner", "none", "--out", plan)
    assert code == 0, err
    assert json.loads(plan.read_text())["inputs"]["calibration"] == f"{out_csv}{SIDECAR_SUFFIX}"
    (tmp_path / ("cal.csv" + SIDECAR_SUFFIX)).rename(tmp_path / "moved.json")
    code, out, err = run_cli("replan", "--plan", plan, "--frozen-layers", "2", "--out", again_plan)
    assert code == 0, err
    assert json.loads(again_plan.read_text())["inputs"]["calibration"] is None


def test_each_energy_is_labelled_with_its_own_source(tmp_path, run_cli, monkeypatch):
    """A line's `energy_source` reaches its row: nvml, modelled, measured (a line without it), mixed across lines;
    the summary warns about modelled figures only when one is there."""
    monkeypatch.setenv("COLUMNS", "200")  # the table's cells on one line each
    model = load_model("gpt2-amp")
    s = _strategies(model)
    lines = [_line(s[0], 1.0, energy_j=2000.0, energy_source="nvml"),
             _line(s[1], 1.1, energy_j=2100.0, energy_source="modelled"),
             _line(s[2], 1.2, energy_j=2200.0),
             _line(s[3], 1.3, energy_j=2300.0, energy_source="nvml"),
             _line(s[3], 1.3, energy_j=2400.0, energy_source="modelled")]
    f = tmp_path / "m.jsonl"
    f.write_text("\n".join(lines) + "\n")
    got = report_from_measurements(read_measurements(f), load_cluster(HOM), model, load_profile(AMP_PROFILE))
    by_mbs_tp = {(r.strategy.mbs, r.strategy.tp, r.strategy.pp): r for r in got.runs}
    sources = [by_mbs_tp[(mbs, tp, pp)].energy_source for mbs, _, tp, pp in STRATEGIES[:4]]
    assert sources == ["nvml", "modelled", "measured", "mixed (modelled, nvml)"]
    code, out, err = run_cli("report", "--measurements", f, "--cluster", HOM, "--model", "gpt2-amp", "--profile",
                             AMP_PROFILE)
    assert code == 0, err
    for text in ("2 kJ (nvml)", "2.1 kJ (modelled)", "2.2 kJ (measured)", "2.35 kJ (mixed)"):
        assert text in out, text
    assert "modelled figures are not measurements" in out
    f.write_text("\n".join(lines[:1] + lines[2:3]) + "\n")
    code, out, err = run_cli("report", "--measurements", f, "--cluster", HOM, "--model", "gpt2-amp", "--profile",
                             AMP_PROFILE)
    assert code == 0, err
    assert "(modelled)" not in out and "not measurements" not in out
