"""A calibration fitted from trials under host load, to an implausible compute factor or to a link efficiency above 1
says so where it is written (``ampe report --calibrate``, the sidecar) and wherever it is applied (the search's
``calibration:`` line)."""

from __future__ import annotations

from ampe.cli._common import calibration_note
from ampe.formats.calibration import SIDECAR_SUFFIX, CalibrationFile, CalibrationFit, CalibrationParams, FittedParameter
from ampe.report.calibrate import cautions
from ampe.report.compare import ReportRow


def _row(other_cores: float | None) -> ReportRow:
    return ReportRow(trial_id="t", key="k", plan_rank=1, label="pp1·dp2·tp1·mbs2", freq_backend="none",
                     schedule_applied=False, status="ok", reason=None, predicted_s=0.1, measured_s=0.2,
                     measured_std_s=0.01, predicted_fits=True, predicted_memory_bytes=None, measured_memory_bytes=None,
                     memory_source=None, predicted_energy_j=None, energy_j=None, energy_source=None, baseline_key=None,
                     host_other_cores=other_cores)


def _fit(factor: float) -> CalibrationFit:
    return CalibrationFit(strategies=3, parameters=(FittedParameter(name="compute_factor[cpu]", value=factor,
                                                                    prior=1.0, fitted=True, moved=True),))


def test_loaded_trials_and_an_implausible_factor_are_cautions():
    assert cautions([_row(0.02), _row(None), _row(0.1)], _fit(1.2)) == ()  # a quiet machine, a plausible factor
    said = cautions([_row(0.66), _row(0.72), _row(0.05)], _fit(1.93))
    assert len(said) == 1 and said[0].startswith("2 of 3 trials ran under host load") and "0.66–0.72" in said[0]
    said = cautions([_row(0.0)], _fit(2.6))
    assert len(said) == 1 and said[0].startswith("compute_factor[cpu] 2.6 is outside the plausible 0.5–2")


def test_the_search_says_the_cautions_of_the_calibration_it_applies(tmp_path):
    csv = tmp_path / "calibrated.csv"
    sidecar = tmp_path / f"calibrated.csv{SIDECAR_SUFFIX}"
    fit = _fit(1.93).model_copy(update={"cautions": cautions([_row(0.7)], _fit(1.93))})
    sidecar.write_text(__import__("json").dumps(CalibrationFile(params=CalibrationParams(), fit=fit).to_json()))

    class Loaded:  # a profile that came with this sidecar
        calibration = CalibrationParams()

    note = calibration_note(str(csv), Loaded())  # type: ignore[arg-type]
    assert note is not None and note.endswith("— caution: 1 of 1 trials ran under host load (other processes kept "
                                              "0.70–0.70 cores busy): the fit includes that load; measure on a quiet "
                                              "machine before trusting it")


def test_a_link_efficiency_above_one_is_a_caution():
    link = FittedParameter(name="link_efficiency[intra]", value=1.047, prior=1.0, fitted=True, moved=True)
    fit = CalibrationFit(strategies=3, parameters=(link,))
    (said,) = cautions([_row(0.0)], fit)
    assert said.startswith("link_efficiency[intra] 1.05 is above 1: the links carried more than the cluster spec's")
    held = link.model_copy(update={"moved": False, "value": 1.2})  # held by the structure: not the fit's figure
    assert cautions([_row(0.0)], CalibrationFit(strategies=3, parameters=(held,))) == ()


def test_the_report_of_loaded_trials_says_so():
    from ampe.report.calibrate import load_caution

    assert load_caution([_row(0.1), _row(None)]) is None
    assert load_caution([_row(0.1), _row(0.66), _row(0.72)]) == ("2 of 3 trials ran under host load (other "
                                                                 "processes kept 0.66–0.72 cores busy)")
