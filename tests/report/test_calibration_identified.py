""""Identified" means moved by the selected structure and pinned by the data: a parameter the structure holds at
its uncalibrated value (η under `scale`) is never shown as identified, however well the data would pin it."""

from __future__ import annotations

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy, complete
from ampe.costmodel.zoo import load_model
from ampe.report.calibration.fit import fit_calibration, fitted_parameters
from ampe.report.calibration.measured import CalibrationInputs, measured_set
from tests.conftest import AMP_PROFILE, SPECS
from tests.costmodel.test_fidelity_amp_measurements import MEASURED


def _het():
    model = load_model("gpt2-amp")
    rows = MEASURED["amp-het-cluster"]
    strategies = [complete(Strategy(pp, 16 // (tp * pp), tp, mbs, 32, tuple(part)), model.num_layers)
                  for mbs, part, tp, pp, _ in rows]
    inputs = CalibrationInputs(load_cluster(SPECS / "amp-het-cluster.yaml"), model, load_profile(AMP_PROFILE),
                               str(AMP_PROFILE), 32, where="amp-het-cluster")
    return measured_set(inputs, strategies, [r[-1] for r in rows])


def test_a_parameter_the_structure_holds_is_not_identified():
    data = _het()
    scale = fit_calibration([data], structure="scale")
    names = scale.space.names
    eta = names.index("mbs_exponent")
    # The data pin η (its posterior sd, every parameter free, is below half its prior's) ...
    assert scale.posterior_sd[eta] < 0.5 * scale.space.prior_sd[eta]
    # ... but `scale` keeps it at 0, so it is neither moved nor identified
    assert scale.theta[eta] == 0.0 and not scale.free[eta] and not scale.identified[eta]
    shown = {p.name: p for p in fitted_parameters(scale)}
    assert shown["mbs_exponent"].moved is False and shown["mbs_exponent"].fitted is False
    # The time factor moves the compute factors and link efficiencies; it multiplies the instruction costs, which
    # are 0 for the catalog's GPUs, so they stay (held). AMP's times are faster than modelled (factor < 1), so the
    # links stay at their bound, 1, the prior too: moved by the structure, held there by the bound and said so
    for i, name in enumerate(names):
        held = name == "mbs_exponent" or name.startswith("pipeline_op_s:")
        assert scale.free[i] != held, name
        if name.startswith("link_efficiency:"):
            assert scale.theta[i] == 0.0 and scale.at_bound[i], name
        else:
            assert held or scale.theta[i] != scale.space.prior[i], name

    with_eta = fit_calibration([data], structure="scale+mbs")
    assert with_eta.free[eta] and with_eta.identified[eta] and with_eta.theta[eta] != 0.0
