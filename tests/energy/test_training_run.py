"""Energy a person can act on: a training run's kWh at the plan and at all-max clocks (`ampe search --iterations`,
`--tokens`), and the timeline coloured per GPU type against its own maximum clock."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from ampe.costmodel.catalog import CATALOG
from ampe.costmodel.zoo import load_model
from ampe.energy.inputs import PipelineInputs, dag_from_inputs
from ampe.energy.run import J_PER_KWH, iterations_for_tokens, training_run
from ampe.energy.timeline import timeline
from ampe.tradeoff.evaluate import fastest_choice

ROOT = Path(__file__).resolve().parents[2]
CPU = ROOT / "cluster_specs" / "local-cpu.yaml"


def test_training_run_is_iterations_times_one_iteration_in_kwh_and_hours():
    run = training_run(36_000, energy_j=900.0, energy_max_clock_j=1000.0, time_s=1.1, max_clock_time_s=1.0)
    assert run.energy_kwh == pytest.approx(36_000 * 900.0 / 3.6e6) == pytest.approx(9.0)
    assert run.energy_max_clock_kwh == pytest.approx(10.0) and run.saved_kwh == pytest.approx(1.0)
    assert run.hours == pytest.approx(11.0) and run.hours_max_clock == pytest.approx(10.0)
    with pytest.raises(ValueError):
        training_run(0, 1.0, 1.0, 1.0, 1.0)


def test_tokens_become_whole_iterations_rounded_up():
    assert iterations_for_tokens(1000, 4, 128) == 2  # 512 tokens per iteration
    assert iterations_for_tokens(1024, 4, 128) == 2 and iterations_for_tokens(1025, 4, 128) == 3


def _search(tmp_path, *extra):
    from ampe.cli import main

    out = tmp_path / "plan.json"
    code = main(["search", "--cluster", str(CPU), "--model", "gpt2-tiny", "--global-batch", "8", "--top-k", "3",
                 "--out", str(out), *extra])
    return code, out


def test_search_iterations_reports_kwh_per_run_at_the_plan_and_at_max_clocks(tmp_path, capsys):
    code, out = _search(tmp_path, "--iterations", "250000")
    assert code == 0
    text = capsys.readouterr().out
    assert "energy per training run of 250000 iterations" in text and "energy plan" in text and "Wh" in text
    entries = json.loads(out.read_text())["strategies"]
    assert entries
    for e in entries:
        p = e["predicted"]
        run = p["training_run"]
        assert run["iterations"] == 250000 and run["tokens"] is None
        assert run["energy_kwh"] == pytest.approx(250000 * p["energy_j"] / J_PER_KWH)
        assert run["energy_max_clock_kwh"] == pytest.approx(250000 * p["energy_max_clock_j"] / J_PER_KWH)
        assert run["saved_kwh"] == pytest.approx(run["energy_max_clock_kwh"] - run["energy_kwh"])
        assert run["saved_kwh"] >= 0  # objective time: never more energy than all-max
        assert run["hours"] == pytest.approx(250000 * p["plan_time_s"] / 3600)
        assert run["hours"] >= run["hours_max_clock"] * (1 - 1e-9)


def test_search_tokens_converts_with_global_batch_and_sequence_length(tmp_path):
    code, out = _search(tmp_path, "--tokens", "1e8")
    assert code == 0
    seq = load_model("gpt2-tiny").seq_len
    run = json.loads(out.read_text())["strategies"][0]["predicted"]["training_run"]
    assert run["tokens"] == 10**8 and run["iterations"] == math.ceil(1e8 / (8 * seq))


@pytest.mark.parametrize("extra", [("--iterations", "10", "--energy-planner", "none"),
                                   ("--iterations", "10", "--tokens", "100"), ("--tokens", "1.5"),
                                   ("--iterations", "0")])
def test_search_run_length_bad_input_is_one_line_exit_2(tmp_path, capsys, extra):
    try:
        code, _ = _search(tmp_path, *extra)
    except SystemExit as e:  # argparse refuses before the command runs
        code = e.code
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def _mixed_timeline():
    h100, v100 = CATALOG["H100-80GB"], CATALOG["V100-32GB"]  # no power cap binds: only f_max is the fastest
    inputs = PipelineInputs((0.02, 0.02), (0.04, 0.04), (h100, v100), 4, p2p_forward_s=(0.001,))
    dag = dag_from_inputs(inputs)
    return timeline(dag, fastest_choice(dag), gpus=inputs.gpus)


def test_timeline_names_stage_types_and_puts_each_max_clock_at_full_share():
    tl = _mixed_timeline()
    assert tl.stage_types == (("H100-80GB", 1980.0), ("V100-32GB", 1530.0))
    shares = [tl.clock_share(b) for b in tl.computations]
    assert shares == pytest.approx([1.0] * len(shares))  # 1980 MHz on an H100, 1530 on a V100: both full speed


def test_timeline_picture_with_types(tmp_path):
    from PIL import Image

    from ampe.viz import timeline_plot

    path = tmp_path / "t.png"
    timeline_plot(path, _mixed_timeline(), "mixed")
    with Image.open(path) as im:
        assert im.format == "PNG" and im.size[0] >= 500
