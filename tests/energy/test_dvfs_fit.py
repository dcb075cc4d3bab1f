"""The DVFS model against real clock sweeps (tests/data/perseus, tests/data/zeus_power_limit; Apache-2.0, see their
README/LICENSE): the catalog's fitted parameters meet the targets, the fitter finds them again, `ampe dvfs fit`
writes a block a cluster spec loads, and bad input is one line with exit 2."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.energy import dvfs
from ampe.energy.dvfs import DvfsParams
from ampe.energy.dvfs_fit import fit, fit_error, read_clock_profile, read_power_limit_trace
from ampe.errors import InputError

DATA = Path(__file__).resolve().parents[1] / "data"
PERSEUS = DATA / "perseus" / "stage_profile"
ZEUS = DATA / "zeus_power_limit"
TIME_ERR = ENERGY_ERR = 0.05  # issue 13: mean error of relative time and energy per clock
SAVING_PTS = 0.03  # predicted best per-computation saving within 3 points of the measured one


def _clock(pattern: str):
    return [s for f in sorted(PERSEUS.glob(pattern)) for s in read_clock_profile(str(f))]


def _limits(name: str):
    return read_power_limit_trace(str(ZEUS / name))


@pytest.fixture(scope="module")
def a100():
    return _clock("*a100*.csv")


@pytest.fixture(scope="module")
def a40():
    return _clock("*a40*.csv")


def _within_targets(err):
    assert err.time_err <= TIME_ERR and err.energy_err <= ENERGY_ERR, err
    assert abs(err.predicted_saving - err.measured_saving) <= SAVING_PTS, err


def test_shipped_a100_profiles_save_26_to_32_percent_per_computation(a100):
    savings = [1 - min(s.energy_j / s.energy_j[-1]) for s in a100]
    assert len(a100) == 32 and min(savings) >= 0.26 and max(savings) <= 0.325


@pytest.mark.parametrize("name", ["A100-40GB", "A100-80GB"])
def test_catalog_a100_meets_the_targets_on_perseus_profiles(a100, name):
    _within_targets(fit_error(dvfs.params_for(CATALOG[name]), CATALOG[name], a100))


def test_catalog_a40_meets_the_targets_on_perseus_profiles(a40):
    _within_targets(fit_error(dvfs.params_for(CATALOG["A40"]), CATALOG["A40"], a40))


@pytest.mark.parametrize("name", ["V100-16GB", "V100-32GB"])
def test_catalog_v100_meets_the_targets_on_zeus_power_limit_traces(name):
    sweeps = _limits("summary_power_v100.csv")
    assert len(sweeps) >= 40  # busy workloads only; the light ones never meet a limit
    _within_targets(fit_error(dvfs.params_for(CATALOG[name]), CATALOG[name], sweeps))


def test_catalog_a40_meets_the_targets_on_zeus_power_limit_traces():
    """With the activity slopes (a workload's compute and memory shares follow its power): 4.6 %; one curve for
    every workload (β = γ = 0, the catalog before) was 6.6 %."""
    gpu = CATALOG["A40"]
    sweeps = _limits("summary_power_a40.csv")
    _within_targets(fit_error(dvfs.params_for(gpu), gpu, sweeps))
    flat = replace(dvfs.params_for(gpu), activity_slope=0.0, activity_memory_slope=0.0)
    assert fit_error(flat, gpu, sweeps).time_err > TIME_ERR  # the slopes are what brings it under 5 %


def test_a40_trace_runs_at_100_w_sit_at_the_clock_floor_with_slowdowns_that_follow_their_power():
    """Why one curve for every workload misses 5 % on the A40 traces, and what the activity slopes use: at the 100 W
    limit nearly every run draws more than its limit (it cannot throttle further: lowest clock), and there the
    runs' slowdowns — each workload's own compute share — spread so widely that any single predicted slowdown is
    ≥ 15 % off on average; but they rise with the workload's power at the top limit (its activity), on V100 too."""
    import numpy as np

    sweeps = _limits("summary_power_a40.csv")
    at_100 = [(s.power_w[0], s.time_s[0] / s.time_s[-1]) for s in sweeps if s.limit_w[0] == 100]
    assert len(at_100) == 31 and sum(w > 100 for w, _ in at_100) >= 29
    slow = np.array([t for _, t in at_100])
    best = min(float(np.mean(np.abs(c / slow - 1))) for c in np.linspace(1.0, 5.0, 4001))
    assert best >= 0.15
    assert best * len(slow) / sum(len(s.limit_w) - 1 for s in sweeps) >= 0.02  # ≥ 2 points of the mean
    for trace in ("summary_power_a40.csv", "summary_power_v100.csv"):
        low = [(s.power_w[-1], s.time_s[0] / s.time_s[-1]) for s in _limits(trace) if s.limit_w[0] == 100]
        top, slowdown = np.array(low).T
        assert np.corrcoef(top, slowdown)[0, 1] > 0.7  # measured: 0.79 (A40, 31 runs), 0.83 (V100, 45)


def test_fitting_both_a40_sources_jointly_meets_the_targets_on_both(a40):
    gpu = CATALOG["A40"]
    traces = _limits("summary_power_a40.csv")
    p = fit(gpu, a40, traces, source="fitted")
    _within_targets(fit_error(p, gpu, a40))
    _within_targets(fit_error(p, gpu, traces))
    assert p.activity_slope > 0 and p.activity_memory_slope < 0  # less active: less compute-, more memory-bound


def test_activity_slopes_predict_held_out_a40_workloads_better(a40):
    """Held out: fitted on the Perseus profiles and the traces of three networks, the model with the activity
    slopes predicts the other two networks' traces (BERT on sentiment140, ShuffleNet: 12 workloads, none of their
    points seen) better than the same fit without them (measured 6.1 % vs 9.0 %)."""
    gpu = CATALOG["A40"]
    traces = _limits("summary_power_a40.csv")
    out = ("sentiment140/bert", "shufflenetv2")
    train = [s for s in traces if not any(k in s.label for k in out)]
    test = [s for s in traces if any(k in s.label for k in out)]
    assert len(test) == 12 and len(train) == 19
    with_slopes = fit_error(fit(gpu, a40, train, source="fitted"), gpu, test)
    without = fit_error(fit(gpu, a40, train, source="fitted", activity_slope=False), gpu, test)
    assert with_slopes.time_err < without.time_err - 0.01, (with_slopes, without)


def test_activity_slopes_zero_is_the_model_without_them():
    """β = γ = 0: any activity has the reference's time curve, and its power is the card's static watts plus the
    activity × the reference's clock-dependent power."""
    import numpy as np

    p = replace(dvfs.PARAMS["A40"], activity_slope=0.0, activity_memory_slope=0.0)
    x = np.linspace(0.2, 1.0, 9)
    static = dvfs.static_power(p, x)
    for act in (0.3, 1.0, 1.4):
        assert dvfs.relative_time(p, x, act) == pytest.approx(dvfs.relative_time(p, x))
        assert dvfs.relative_power(p, x, act) == pytest.approx(static + act * (dvfs.relative_power(p, x) - static))
    q = dvfs.PARAMS["A40"]
    assert dvfs.compute_share(q, 0.5) == pytest.approx(q.compute_share - 0.5 * q.activity_slope)
    assert dvfs.memory_share(q, 0.5) == pytest.approx(q.memory_share - 0.5 * q.activity_memory_slope)


def test_the_earlier_model_fails_the_same_check(a100):
    """The check can fail: the model before the fit predicted 11.5 % where A100 saves ~29 % (issue 13)."""
    earlier = dvfs._old(0.5, 990 / 1410, 360.0, 70.0, "earlier")
    err = fit_error(earlier, CATALOG["A100-80GB"], a100)
    assert err.measured_saving - err.predicted_saving > 0.15


def test_fitting_the_a100_profiles_again_meets_the_targets_and_finds_the_catalog_curve(a100):
    gpu = CATALOG["A100-80GB"]
    p = fit(gpu, a100, source="fitted")
    err = fit_error(p, gpu, a100)
    _within_targets(err)
    cat = fit_error(dvfs.params_for(gpu), gpu, a100)
    assert err.energy_err <= cat.energy_err + 0.002  # the catalog holds the fit, rounded
    assert p.power_cap_w is not None and p.power_cap_w < p.busy_w  # the top clocks are throttled, as measured


def test_fitting_the_v100_traces_again_meets_the_targets():
    gpu = CATALOG["V100-16GB"]
    sweeps = _limits("summary_power_v100.csv")
    _within_targets(fit_error(fit(gpu, limit_sweeps=sweeps, source="fitted"), gpu, sweeps))


def test_the_a40_cap_is_found_where_clocks_stop_mattering(a40):
    p = dvfs.params_for(CATALOG["A40"])
    assert p.power_cap_w is not None and 280 <= p.power_cap_w <= 300
    x_cap = dvfs.cap_x(p) * CATALOG["A40"].sm_clock_max_mhz
    assert 1350 <= x_cap <= 1550  # "clocks above ~1500 MHz change nothing"


# ---------------------------------------------------------------------------------------------------------------
# ampe dvfs fit


def test_cli_fit_writes_a_gpu_types_block_that_a_cluster_spec_loads(tmp_path, capsys):
    from ampe.cli import main

    out = tmp_path / "a40.yaml"
    profile = PERSEUS / "gpt3-175b+a40_bf16.csv"
    assert main(["dvfs", "fit", "--profile", str(profile), "--gpu", "A40", "--out", str(out)]) == 0
    assert "mean error time" in capsys.readouterr().out
    block = yaml.safe_load(out.read_text())
    spec = {"name": "fitted", "nodes": [{"name": "a40", "gpu": "A40", "count": 4, "intra_gbps": 200,
                                        "inter_gbps": 100}], **block}
    (tmp_path / "cluster.yaml").write_text(yaml.safe_dump(spec))
    cluster = load_cluster(tmp_path / "cluster.yaml")
    gpu = cluster.devices[0].gpu
    assert gpu.dvfs is not None and gpu.dvfs.source.startswith("fitted by ampe dvfs fit")
    assert dvfs.params_for(gpu) is gpu.dvfs and gpu.dvfs != dvfs.PARAMS["A40"]
    assert dvfs.blocking_power_w(gpu) == pytest.approx(70.38)
    _within_targets(fit_error(gpu.dvfs, gpu, read_clock_profile(str(profile))))  # survives the rounding


def test_cli_fit_to_stdout_and_blocking_power(capsys):
    from ampe.cli import main

    profile = PERSEUS / "gpt3-175b+a100_sxm_bf16.csv"
    assert main(["dvfs", "fit", "--profile", str(profile), "--gpu", "A100-40GB", "--blocking-power", "80"]) == 0
    one = yaml.safe_load(capsys.readouterr().out)["gpu_types"]["A100-40GB"]["dvfs"]
    assert one["blocking_w"] == 80
    assert main(["dvfs", "fit", "--profile", str(profile), "--gpu", "A100-40GB", "--gpus", "2"]) == 0
    two = yaml.safe_load(capsys.readouterr().out)["gpu_types"]["A100-40GB"]["dvfs"]
    assert two["busy_w"] == pytest.approx(one["busy_w"] / 2, rel=0.02)  # rows summed two GPUs' joules
    assert two["compute_share"] == pytest.approx(one["compute_share"], abs=0.02)  # the shape does not change


@pytest.mark.parametrize("text,field", [
    ("stage,instruction,frequency,time\n0,forward,1000,0.1\n", "energy"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,0.1,x\n0,forward,1100,0.1,1\n", "row 2.energy"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,-1,1\n0,forward,1100,0.1,1\n", "row 2.time"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,1,1\n0,forward,1000,1,1\n", "row 3.frequency"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,1,1\n", "frequency"),
    ("stage,instruction,frequency,time,energy\n0,forward,100,1,1\n0,forward,1100,1,1\n", "frequency"),
    ("stage,instruction,frequency,time,energy\n", "(rows)"),
    # ambiguity is an error, never a silent choice: a duplicated column, an unquoted extra field, an oversize field
    ("stage,instruction,frequency,time,energy,time\n0,forward,1000,1,1,2\n", "time"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,1,1\n0,forward,1,100,1,1\n", "row 3"),
    ("stage,instruction,frequency,time,energy\n0,forward,1000,1," + "9" * 200_000 + "\n", "line 2"),
])
def test_cli_fit_bad_profile_is_one_line_naming_file_and_field(tmp_path, capsys, text, field):
    from ampe.cli import main

    bad = tmp_path / "bad.csv"
    bad.write_text(text)
    assert main(["dvfs", "fit", "--profile", str(bad), "--gpu", "A40"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: {field}:" in err and "Traceback" not in err


def test_cli_fit_unknown_gpu_type(capsys):
    from ampe.cli import main

    assert main(["dvfs", "fit", "--profile", str(PERSEUS / "bloom+a40_bf16.csv"), "--gpu", "B200"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--gpu" in err and "B200" in err


def test_cluster_spec_refuses_bad_dvfs_fields():
    spec = {"name": "x", "nodes": [{"name": "a", "gpu": "A40", "count": 1, "intra_gbps": 1, "inter_gbps": 1}],
            "gpu_types": {"A40": {"dvfs": {"compute_share": 1.5, "static_share": 0.4, "busy_w": 300,
                                           "blocking_w": 70}}}}
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "spec.yaml")
    assert e.value.field == "gpu_types.A40.dvfs.compute_share"
    del spec["gpu_types"]["A40"]["dvfs"]["busy_w"]  # type: ignore[index]
    spec["gpu_types"]["A40"]["dvfs"]["compute_share"] = 0.5  # type: ignore[index]
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "spec.yaml")
    assert e.value.field == "gpu_types.A40.dvfs.busy_w"
    spec["gpu_types"]["A40"]["dvfs"].update(busy_w=300, static_share=0.7, memory_share=0.5)  # type: ignore[index]
    with pytest.raises(InputError) as e:
        cluster_from_dict(spec, "spec.yaml")
    assert e.value.field == "gpu_types.A40.dvfs.memory_share"
    spec["gpu_types"]["A40"]["dvfs"]["memory_share"] = 0.2  # type: ignore[index]
    assert cluster_from_dict(spec, "spec.yaml").devices[0].gpu.dvfs.memory_share == 0.2


def test_fit_recovers_a_known_curve_from_exact_synthetic_sweeps():
    """Oracle: sweeps generated from known parameters are fitted back to (near) zero error, cap included."""
    import numpy as np

    from ampe.energy.dvfs_fit import ClockSweep

    gpu = CATALOG["A40"]
    truth = dvfs.params_for(gpu)
    mhz = np.arange(855.0, 1741.0, 15.0)
    t, w = dvfs.ratios(truth, mhz / gpu.sm_clock_max_mhz)
    sweeps = [ClockSweep(f"synthetic {k}", mhz, 0.1 * k * t, 0.1 * k * t * w) for k in (1, 2)]
    p = fit(gpu, sweeps, source="fitted")
    err = fit_error(p, gpu, sweeps)
    assert err.time_err < 2e-3 and err.energy_err < 2e-3
    assert p.power_cap_w == pytest.approx(truth.power_cap_w, rel=0.01)


@pytest.mark.parametrize("name", ["V100-16GB", "A40"])
@pytest.mark.parametrize("act", [0.4, 1.0])
def test_power_limit_prediction_inverts_the_model_exactly(name, act):
    """A workload with ``act`` × the type's clock-dependent power on the card's static watts (and the compute and
    memory shares of that activity): its clocks are found again from its average power alone, so its times are
    predicted exactly."""
    import numpy as np

    from ampe.energy.dvfs_fit import LimitSweep, activity

    gpu = CATALOG[name]
    p = dvfs.params_for(gpu)
    x = np.array([0.3, 0.5, 0.7, 0.9, 1.0])
    static = dvfs.static_power(p, x)
    power = p.busy_w * dvfs.relative_power(p, x, act)
    if not p.activity_slope and not p.activity_memory_slope:
        assert power == pytest.approx(p.busy_w * (static + act * (dvfs.relative_power(p, x) - static)))
    assert float(activity(p, power[-1])) == pytest.approx(act)
    time_s = 10.0 * dvfs.relative_time(p, x, act) / dvfs.relative_time(p, 1.0, act)
    err = fit_error(p, gpu, [LimitSweep("synthetic", power + 5.0, time_s, power)])
    assert err.time_err < 1e-6 and err.energy_err < 1e-6
    # the share mapping (the workload's power ∝ the type's curve) would put these clocks elsewhere
    other = DvfsParams(p.compute_share, 0.9, p.busy_w, p.blocking_w)
    assert fit_error(other, gpu, [LimitSweep("synthetic", power + 5.0, time_s, power)]).time_err > 1e-3


def test_light_power_limit_workloads_are_left_out():
    sweeps = _limits("summary_power_v100.csv")
    assert all(s.power_w[-1] >= 0.6 * s.limit_w[-1] for s in sweeps)
    assert not any("ncf" in s.label for s in sweeps)  # NCF draws ~38 W under a 250 W limit: no clock information
