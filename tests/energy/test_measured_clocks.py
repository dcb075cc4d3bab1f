"""Energy planning from measured per-layer data: per-clock rows (`ampe profile --clocks`) become each stage's options;
default-clock energy rescales the DVFS model's power; every output names its source."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.schedules import BACKWARD, FORWARD
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.energy import dvfs
from ampe.energy.inputs import dag_from_inputs, replica_inputs
from ampe.energy.strategy import plan_clocks

TWO_A100 = {"name": "two-a100", "nodes": [{"name": "n", "gpu": "A100-40GB", "count": 2, "intra_gbps": 600,
                                           "inter_gbps": 100}]}
# Measured curve, not monotone and unlike the model: 1005 MHz is the cheapest, 810 MHz slower *and* dearer.
CLOCKS = {1410: (1.00, 1.00), 1200: (1.10, 0.86), 1005: (1.28, 0.78), 810: (1.70, 0.95)}  # (time ×, energy ×)


def _write(tmp_path, clocked: bool):
    model = load_model("gpt2-tiny")
    lines = ["model,device,tp,mbs,layer,forward_s,backward_s,forward_j,backward_j"
             + (",sm_clock_mhz" if clocked else "")]
    for layer in range(model.num_layers):
        for mhz, (t, e) in (CLOCKS.items() if clocked else [(None, (1.0, 1.0))]):
            f, b = 0.002 * t, 0.004 * t
            row = f"gpt2-tiny,A100-40GB,1,2,{layer},{f},{b},{0.5 * e},{1.0 * e}"
            lines.append(row + (f",{mhz}" if clocked else ""))
    path = tmp_path / "p.csv"
    path.write_text("\n".join(lines) + "\n")
    return path, model


def _estimate(tmp_path, clocked: bool):
    path, model = _write(tmp_path, clocked)
    cluster = cluster_from_dict(TWO_A100)
    est = CostModel(cluster, model, load_profile(path)).estimate(Strategy(2, 1, 1, 2, 8))
    return est, cluster, model


def test_per_clock_rows_become_each_stages_options(tmp_path):
    est, cluster, _model = _estimate(tmp_path, clocked=True)
    (inputs,) = replica_inputs(est, cluster)
    assert [inputs.source(v) for v in range(2)] == ["measured", "measured"]
    dag = dag_from_inputs(inputs)
    for stage in range(2):
        layers = est.strategy.partition[stage + 1] - est.strategy.partition[stage]
        fwd = {o.mhz: o for o in dag_options(dag, stage, FORWARD)}
        assert sorted(fwd) == sorted(CLOCKS)
        assert fwd[1410].time_s == pytest.approx(est.fwd_s[0][stage])  # scaled to the cost model's stage time
        scale = est.fwd_s[0][stage] / (0.002 * layers)
        for mhz, (t, e) in CLOCKS.items():
            assert fwd[mhz].time_s == pytest.approx(0.002 * t * layers * scale)
            assert fwd[mhz].energy_j == pytest.approx(0.5 * e * layers * scale)
        cheapest = min(dag_options(dag, stage, BACKWARD), key=lambda o: o.energy_j)
        assert cheapest.mhz == 1005
    se = plan_clocks(est, cluster)
    assert se.source.startswith("measured")


def test_default_clock_energy_rescales_the_model_power(tmp_path):
    est, cluster, _model = _estimate(tmp_path, clocked=False)
    (inputs,) = replica_inputs(est, cluster)
    gpu = cluster.devices[0].gpu
    measured_w = (0.5 + 1.0) / (0.002 + 0.004)  # joules over seconds of every layer
    assert measured_w < dvfs.power_w(gpu, gpu.sm_clock_max_mhz)  # below the model's: not throttled
    act = float(dvfs.activity(dvfs.params_for(gpu), measured_w))  # the card's static watts + act × the rest
    assert inputs.activity == pytest.approx((act,) * 2) and 0 < act < 1
    assert inputs.power_scale == pytest.approx((1.0, 1.0))
    assert [inputs.source(v) for v in range(2)] == ["scaled", "scaled"]
    options = dag_options(dag_from_inputs(inputs), 0, FORWARD)
    top = max(options, key=lambda o: o.mhz)
    assert top.energy_j == pytest.approx(measured_w * est.fwd_s[0][0])
    low = min(options, key=lambda o: o.mhz)
    assert low.time_s == pytest.approx(est.fwd_s[0][0] * dvfs.time_ratio(gpu, low.mhz, act))
    assert low.energy_j == pytest.approx(dvfs.power_w(gpu, low.mhz, act) * low.time_s)
    assert "rescaled" in plan_clocks(est, cluster).source


def test_measured_power_sets_the_activity_and_with_it_the_time_curve():
    """docs/energy.md §1: a computation measured drawing less than the model's power at f_max has a lower activity,
    so (on a type with activity slopes, A40) a smaller compute share: lower clocks slow it less. At or above the
    capped power the cap hides its activity: the reference curve, scaled."""
    from ampe.costmodel.catalog import CATALOG

    gpu = CATALOG["A40"]
    light, _ = dvfs.measured_activity(gpu, 180.0)
    heavy, _ = dvfs.measured_activity(gpu, 280.0)
    assert light < heavy < 1
    assert dvfs.time_ratio(gpu, 900, light) < dvfs.time_ratio(gpu, 900, heavy) < dvfs.time_ratio(gpu, 900)
    assert dvfs.power_w(gpu, gpu.sm_clock_max_mhz, light) == pytest.approx(180.0)
    capped = dvfs.power_w(gpu, gpu.sm_clock_max_mhz)
    assert dvfs.measured_activity(gpu, capped + 10) == pytest.approx((1.0, (capped + 10) / capped))


def test_activity_moves_continuously_up_to_the_cap():
    """Just below a binding cap the measured power says little (an average sits under its limit), so the activity
    rises continuously to 1 there: a watt either side of the cap changes the time curve by little (it once jumped
    from 0.69 to 1, 4.06x vs 4.76x at 210 MHz, between 293.19 and 293.2 W on A40)."""
    from ampe.costmodel.catalog import CATALOG

    gpu = CATALOG["A40"]
    capped = dvfs.power_w(gpu, gpu.sm_clock_max_mhz)
    watts = np.linspace(0.9 * capped, 1.02 * capped, 241)
    acts = np.array([dvfs.measured_activity(gpu, float(w))[0] for w in watts])
    assert np.all(np.diff(acts) >= -1e-12) and acts[-1] == 1.0 and acts[0] < 0.8
    assert np.max(np.diff(acts)) < 0.01
    below, at = (dvfs.time_ratio(gpu, 210, dvfs.measured_activity(gpu, w)[0]) for w in (capped - 0.01, capped))
    assert below == pytest.approx(at, rel=1e-3)
    for w in (0.95 * capped, 0.99 * capped):  # the measured watts are still what the model draws at f_max
        a, k = dvfs.measured_activity(gpu, w)
        assert dvfs.power_w(gpu, gpu.sm_clock_max_mhz, a) * k == pytest.approx(w)


def test_an_uncapped_type_reads_activity_above_its_reference_power():
    from ampe.costmodel.catalog import CATALOG

    gpu = CATALOG["RTX3090"]  # no cap in its model
    top = dvfs.power_w(gpu, gpu.sm_clock_max_mhz)
    a, k = dvfs.measured_activity(gpu, 1.1 * top)
    assert a > 1 and k == pytest.approx(1.0)


def test_without_energy_in_the_profile_the_model_is_used_and_said(tmp_path):
    path, model = _write(tmp_path, clocked=False)
    text = path.read_text().splitlines()
    path.write_text("\n".join(",".join(line.split(",")[:7]) for line in text) + "\n")
    cluster = cluster_from_dict(TWO_A100)
    est = CostModel(cluster, model, load_profile(path)).estimate(Strategy(2, 1, 1, 2, 8))
    assert est.clock_options == () and plan_clocks(est, cluster).source.startswith("modelled")


def test_search_says_it_planned_from_measurements(tmp_path, run_cli):
    import yaml

    path, _ = _write(tmp_path, clocked=True)
    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump(TWO_A100))
    code, out, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--profile", path,
                             "--global-batch", "8", "--pp", "2", "--top-k", "2")
    assert code == 0, err
    assert "Energy measured (per-clock profile" in out


def dag_options(dag, stage, kind):
    """The options of (stage, kind) in a computation DAG."""
    for node in dag.nodes:
        if node.stage == stage and node.kind == kind:
            return dag.specs[node.spec].options
    raise AssertionError("no such computation")


def test_frontier_exports_the_strategys_instruction_profile_for_zeus(tmp_path, run_cli):
    import json

    import yaml

    from ampe.energy.profile_csv import load_instruction_profile

    spec = tmp_path / "c.yaml"
    spec.write_text(yaml.safe_dump(TWO_A100))
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8", "--pp", "2",
                           "--top-k", "1", "--out", plan)
    assert code == 0, err
    csv_path = tmp_path / "zeus.csv"
    code, out, err = run_cli("frontier", "--plan", plan, "--export-profile", csv_path, "--out", tmp_path / "f.json")
    assert code == 0, err
    assert "instruction profile written" in out
    prof = load_instruction_profile(csv_path, 2)
    gas = json.loads(plan.read_text())["strategies"][0]["gas"]
    code, _, err = run_cli("frontier", "--profile", csv_path, "--stages", "2", "--microbatches", gas, "--out",
                           tmp_path / "g.json")
    assert code == 0, err
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("f.json", "g.json"))
    t_plan, t_prof = (min(p["time_s"] for p in doc) for doc in (a, b))
    assert t_prof <= t_plan * (1 + 1e-6)  # the profile has no transfers, else the same computations
    assert t_prof >= 0.8 * t_plan
    assert len(prof.specs) == 4 and all(len(o.options) > 1 for o in prof.specs.values())
    code, _, err = run_cli("frontier", "--profile", csv_path, "--stages", "2", "--microbatches", "4",
                           "--export-profile", tmp_path / "x.csv", "--out", tmp_path / "h.json")
    assert code == 2 and "--export-profile" in err
