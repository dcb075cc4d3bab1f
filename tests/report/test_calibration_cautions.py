"""A calibration fitted from trials under host load, to an implausible compute factor or with a link efficiency held
at its bound 1 says so where it is written (``ampe report --calibrate``, the sidecar) and wherever it is applied (the
search's ``calibration:`` line); the bound is part of the fit."""

from __future__ import annotations

import pytest

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


def test_a_link_efficiency_held_at_its_bound_is_a_caution():
    link = FittedParameter(name="link_efficiency[intra]", value=1.0, prior=1.0, fitted=True, moved=True, at_bound=True)
    fit = CalibrationFit(strategies=3, parameters=(link,))
    (said,) = cautions([_row(0.0)], fit)
    assert said.startswith("link_efficiency[intra] is held at its bound 1 (the cluster spec's bandwidth) though the "
                           "measurements want faster links")
    free = link.model_copy(update={"at_bound": False, "value": 0.8})  # inside its bound: nothing to say
    assert cautions([_row(0.0)], CalibrationFit(strategies=3, parameters=(free,))) == ()
    old = link.model_copy(update={"at_bound": None, "value": 1.047})  # an older sidecar's unbounded figure
    assert cautions([_row(0.0)], CalibrationFit(strategies=3, parameters=(old,))) == ()


def _faster_links_than_the_spec(scale: float, links: dict[str, float]):
    """AMP's Tables 6-7 strategies on 16 T4s "measured" by the cost model with every time × ``scale`` where
    ``scale`` < 1 would need the links faster than their spec, or with ``links`` above 1."""
    import numpy as np

    from ampe.costmodel.cluster import load_cluster
    from ampe.costmodel.profile import load_profile
    from ampe.costmodel.zoo import load_model
    from ampe.report.calibration.measured import CalibrationInputs, measured_set, predict
    from tests.conftest import AMP_PROFILE, SPECS
    from tests.report.test_measurements import _strategies

    cluster, model, profile = load_cluster(SPECS / "amp-homogeneous.yaml"), load_model("gpt2-amp"), \
        load_profile(AMP_PROFILE)
    strategies = _strategies(model)
    data = measured_set(CalibrationInputs(cluster, model, profile, str(AMP_PROFILE), 32), strategies,
                        np.ones(len(strategies)))
    truth = CalibrationParams(compute_factor={"T4": scale}, link_efficiency=links)
    return measured_set(data.inputs, strategies, predict(data, truth))


def test_the_fit_keeps_link_efficiencies_at_most_one_and_moves_the_rest_with_them():
    """The bound is part of the fit, not a clip afterwards: measurements that want the links faster than the spec
    get links at 1 (said: at their bound) and the compute factor fitted with them, below the truth's 1."""
    from ampe.report.calibration.fit import fit_calibration, fitted_parameters

    data = _faster_links_than_the_spec(1.0, {"inter": 2.0, "intra": 1.5})
    for structure in ("full", "scale"):
        fit = fit_calibration([data], structure=structure)
        params = {p.name: p for p in fitted_parameters(fit)}
        links = [p for name, p in params.items() if name.startswith("link_efficiency")]
        assert links and all(p.value <= 1.0 for p in links), (structure, links)
        assert any(p.at_bound for p in links), (structure, links)
        # jointly: the compute took up the links' share (the truth's compute factor is 1)
        assert params["compute_factor[T4]"].value < 0.99, structure
    # all slower than the spec: the scale factor divides the links as before, inside their bound, nothing at it
    fit = fit_calibration([_faster_links_than_the_spec(1.3, {"inter": 1 / 1.3, "intra": 1 / 1.3})], structure="scale")
    params = {p.name: p for p in fitted_parameters(fit)}
    assert params["compute_factor[T4]"].value == pytest.approx(1.3, rel=0.05)
    assert all(p.value == pytest.approx(1 / 1.3, rel=0.05) and not p.at_bound for name, p in params.items()
               if name.startswith("link_efficiency"))


def test_the_report_of_loaded_trials_says_so():
    from ampe.report.calibrate import load_caution

    assert load_caution([_row(0.1), _row(None)]) is None
    assert load_caution([_row(0.1), _row(0.66), _row(0.72)]) == ("2 of 3 trials ran under host load (other "
                                                                 "processes kept 0.66–0.72 cores busy)")


def test_the_parameter_table_marks_a_link_at_its_bound(capsys):
    from types import SimpleNamespace

    from ampe.cli.report import _print_calibration

    link = FittedParameter(name="link_efficiency[inter]", value=1.0, prior=1.0, fitted=False, moved=True,
                           at_bound=True)
    free = link.model_copy(update={"name": "link_efficiency[intra]", "value": 0.8, "at_bound": False})
    fit = CalibrationFit(strategies=3, parameters=(link, free), cautions=cautions([_row(0.0)], CalibrationFit(
        strategies=3, parameters=(link, free))))
    _print_calibration(SimpleNamespace(fit=fit, selected_on=3, method="eq5", rows=1, base_source="roofline",
                                       sidecar="cal.csv.calibration.json"), "cal.csv")
    out = capsys.readouterr().out
    assert "1 (at its bound)" in out and "0.8 (at its bound)" not in out
    assert "caution: link_efficiency[inter] is held at its bound 1" in out and "[intra] is held" not in out
