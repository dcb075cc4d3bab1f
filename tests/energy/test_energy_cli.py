"""``ampe frontier``: JSON points with per-stage plans, the plot, and plan files that are data only."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from ampe.energy.plan import ClockPlan
from ampe.errors import InputError
from tests.support.schedules import gpipe, one_f_one_b
from tests.support.synthetic_profiles import profile_rows


@pytest.fixture
def profile(tmp_path):
    path = tmp_path / "perseus.csv"
    path.write_text("\n".join(profile_rows("lm_head", 3, seed=0, base_s=0.02)) + "\n")
    return path


def test_frontier_json_plot_and_plans(tmp_path, profile, run_cli):
    out, png = tmp_path / "f.json", tmp_path / "f.png"
    code, stdout, err = run_cli("frontier", "--profile", profile, "--stages", 3, "--microbatches", 4,
                                "--out", out, "--plot", png, "--plans", "all")
    assert code == 0, err
    points = json.loads(out.read_text())
    assert len(points) > 10
    times = [p["time_s"] for p in points]
    effs = [p["effective_energy_j"] for p in points]
    assert times == sorted(times) and all(b < a for a, b in itertools.pairwise(effs))
    assert [p["chosen"] for p in points].count(True) == 1 and points[0]["chosen"]  # no straggler: T_min
    clocks = {float(line.split(",")[2]) for line in profile.read_text().splitlines()[1:]}
    for p in points:
        assert set(p) == {"time_s", "energy_j", "effective_energy_j", "chosen", "plan"}
        assert len(p["plan"]) == 3
        for s, stage in enumerate(p["plan"]):
            assert [(i, mb) for i, mb, _ in stage] == [(x.instruction, x.microbatch) for x in one_f_one_b(3, 4, s)]
            assert all(mhz in clocks for _, _, mhz in stage)
        assert p["energy_j"] > p["effective_energy_j"] > 0
    slowest_clocks = [mhz for stage in points[-1]["plan"] for _, _, mhz in stage]
    assert max(slowest_clocks) < 1410  # the minimum-energy end slows everything down
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # By default only the chosen point carries its plan; every point keeps its time and energies.
    code, _, err = run_cli("frontier", "--profile", profile, "--stages", 3, "--microbatches", 4, "--out", out)
    assert code == 0, err
    compact = json.loads(out.read_text())
    assert [p["time_s"] for p in compact] == times
    assert [("plan" in p) for p in compact] == [p["chosen"] for p in compact]
    assert next(p for p in compact if p["chosen"])["plan"] == next(p for p in points if p["chosen"])["plan"]
    from PIL import Image

    assert Image.open(png).size[0] >= 600
    assert "T_min" in stdout and "chosen" in stdout


def test_straggler_gpipe_and_max_points(tmp_path, profile, run_cli):
    out = tmp_path / "f.json"
    code, _, err = run_cli("frontier", "--profile", profile, "--stages", 3, "--microbatches", 3, "--schedule",
                           "gpipe", "--straggler", 1.1, "--max-points", 7, "--out", out, "--p2p-power", 40,
                           "--unit-time", 0.002)
    assert code == 0, err
    points = json.loads(out.read_text())
    assert len(points) <= 7
    chosen = next(p for p in points if p["chosen"])
    assert points[0]["time_s"] < chosen["time_s"] <= 1.1 * points[0]["time_s"] + 1e-9
    assert [(i, mb) for i, mb, _ in chosen["plan"][1]] == [(x.instruction, x.microbatch) for x in gpipe(3, 3, 1)]


def test_floor_times_reaches_perseus_published_t_min(tmp_path, run_cli):
    data = Path(__file__).resolve().parent.parent / "data" / "perseus"
    out = tmp_path / "f.json"
    args = ["frontier", "--profile", data / "stage_profile" / "gpt3-175b+a100_sxm_bf16.csv", "--stages", 8,
            "--microbatches", 12, "--p2p-power", 83.64, "--unit-time", 0.001, "--out", out]
    code, stdout, err = run_cli(*args, "--floor-times")
    assert code == 0, err
    published = [float(line.split(",")[0]) for line in
                 (data / "frontier" / "a100_sxm" / "gpt3-175b_bf16_mb12.csv").read_text().splitlines()[1:]]
    points = json.loads(out.read_text())
    assert points[0]["time_s"] <= min(published) * 1.0005
    assert "floored" in stdout
    code, _, err = run_cli(*args, "--resolution", 50)  # measured times: T_min is the real all-max time, slower
    assert code == 0, err
    measured = json.loads(out.read_text())
    assert measured[0]["time_s"] > min(published) * 1.0005 and len(measured) < len(points)


@pytest.mark.parametrize("args", [
    ("--stages", "0"), ("--unit-time", "-1"), ("--straggler", "0.5"), ("--p2p-power", "-3"), ("--microbatches", "x"),
])
def test_bad_arguments_exit_2_in_one_line(tmp_path, profile, run_cli, args):
    base = {"--profile": str(profile), "--stages": "3", "--microbatches": "2", "--out": str(tmp_path / "f.json")}
    base.update(dict([args]))
    code, _, err = run_cli("frontier", *[x for kv in base.items() for x in kv])
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_plan_json_round_trip_and_rejects_non_data(tmp_path, profile, run_cli):
    out = tmp_path / "f.json"
    assert run_cli("frontier", "--profile", profile, "--stages", 3, "--microbatches", 2, "--out", out)[0] == 0
    point = json.loads(out.read_text())[0]
    plan = ClockPlan.from_json(point, str(out))
    assert plan.time_s == point["time_s"] and len(plan.for_stage(2)) == 4
    again = plan.to_json()
    assert again["plan"] == point["plan"] and again["energy_j"] == point["energy_j"]
    for bad, field in [({**point, "plan": "__import__('os').system('false')"}, "plan"),
                       ({**point, "plan": [[["os.system", 0, 1410]]]}, "plan[0][0]"),
                       ({**point, "plan": [[["forward", -1, 1410]]]}, "plan[0][0]"),
                       ({**point, "time_s": "1e9"}, "time_s"), ([point], "(root)")]:
        with pytest.raises(InputError) as e:
            ClockPlan.from_json(bad, "plan.json")
        assert e.value.field == field
