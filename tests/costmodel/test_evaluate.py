"""`ampe evaluate`: AMP's het-cluster strategy with AMP's profile, JSON output, and bad strategies."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from tests.conftest import AMP_PROFILE, SPECS

HET = SPECS / "amp-het-cluster.yaml"
AMP_PREDICTED = 1.0859  # AMP's own cost model (repository log)
AMP_MEASURED = 1.47  # AMP paper, Table 9, first row


def test_amp_het_cluster_strategy_prediction(run_cli, tmp_path):
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32, "partition": [0, 7, 14, 20, 30]}))
    out = tmp_path / "o.json"
    code, text, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--profile", AMP_PROFILE,
                              "--strategy", s, "--json", out)
    assert code == 0, err
    r = json.loads(out.read_text())["results"][0]
    for key in ("iteration_s", "samples_per_s", "stage_times_s", "max_memory_bytes", "memory_bytes_per_stage",
                "fits", "oom_reason"):
        assert key in r
    pred = r["iteration_s"]
    print(f"ampe {pred:.4f} s/iter vs AMP predicted {AMP_PREDICTED} vs AMP measured {AMP_MEASURED}")
    # ampe prices the T4 stage at T4 speed (AMP blends 0.75·V100 + 0.25·T4 everywhere), both transfer
    # directions, the tied-embedding all-reduce and the optimizer step: it lands much closer to the measurement.
    assert abs(pred - AMP_MEASURED) < 0.5 * abs(AMP_PREDICTED - AMP_MEASURED)
    assert r["fits"] and r["oom_reason"] is None
    # the last stage runs on the g4 node (T4s) and is the bottleneck
    assert max(r["stage_times_s"]) == r["stage_times_s"][3]
    assert r["samples_per_s"] == pytest.approx(32 / pred)
    assert "4/4/1" in text and f"{pred:.4f}" in text


def test_heterogeneous_replicas_differ_and_the_slowest_sets_the_pace():
    cm = CostModel(load_cluster(HET), load_model("gpt2-amp"), load_profile(AMP_PROFILE))
    # pp=4 × dp=4 in "replica-major" placement: replica r's stages are the 4 GPUs of node r (the 4th is the T4 node)
    placement = tuple(r * 4 + j for j in range(4) for r in range(4))
    e = cm.estimate(Strategy(4, 4, 1, 1, 32, (0, 8, 15, 22, 30), placement))
    assert len(set(round(x, 9) for x in e.pipeline_s)) == 2
    assert e.pipeline_s[3] > 1.3 * e.pipeline_s[0]  # the all-T4 replica is much slower
    assert e.iteration_s == pytest.approx(max(e.pipeline_s) + max(e.tail_s))
    assert max(e.tail_s) <= e.dp_sync_s + e.tied_sync_s + e.optimizer_s + 1e-12
    assert e.stage_gpu[3] == ("T4",) * 4 and e.stage_gpu[0] == ("V100-16GB",) * 4


def test_plan_list_and_simulation_method(run_cli, tmp_path):
    s = tmp_path / "s.json"
    s.write_text(json.dumps([{"pp": 2, "dp": 8, "tp": 1, "mbs": 2}, {"pp": 4, "dp": 2, "tp": 2, "mbs": 1}]))
    out = tmp_path / "o.json"
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--strategy", s, "--global-batch",
                           "32", "--method", "simulate", "--json", out)
    assert code == 0, err
    res = json.loads(out.read_text())["results"]
    assert [r["strategy"]["gas"] for r in res] == [2, 16] and all(r["method"] == "simulate" for r in res)


BAD = {
    "degrees": ({"pp": 4, "dp": 2, "tp": 1, "mbs": 1, "gbs": 32}, "pp·dp·tp"),
    "partition_gap": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32, "partition": [0, 7, 14, 20, 29]},
                      "partition"),
    "partition_overlap": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32, "partition": [0, 7, 7, 20, 30]},
                          "partition"),
    "partition_count": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32, "partition": [0, 15, 30]}, "partition"),
    "mbs": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 3, "gbs": 32}, "mbs"),
    "gbs_dp": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 30}, "gbs"),
    "placement": ({"pp": 4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32, "placement": [0] * 16}, "placement"),
    "negative": ({"pp": -4, "dp": 4, "tp": 1, "mbs": 1, "gbs": 32}, "pp"),
    "missing": ({"dp": 4, "tp": 1, "mbs": 1, "gbs": 32}, "pp"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_strategy_one_line_exit_2(case, run_cli, tmp_path):
    body, field = BAD[case]
    s = tmp_path / "bad.json"
    s.write_text(json.dumps(body))
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--strategy", s)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1, err
    assert str(s) in lines[0] and f": {field}:" in lines[0]


def test_bad_json_and_bad_flags(run_cli, tmp_path):
    s = tmp_path / "bad.json"
    s.write_text("{pp: 4")
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--strategy", s)
    assert code == 2 and "JSON syntax error" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "gpt2-amp", "--strategy", s, "--method", "x")
    assert code == 2 and len(err.strip().splitlines()) == 1
    code, _, err = run_cli("evaluate", "--cluster", HET, "--model", "nomodel", "--strategy", s)
    assert code == 2 and "unknown model" in err


def test_every_bad_strategy_of_a_list_is_reported_and_the_good_ones_costed(run_cli, tmp_path):
    from tests.conftest import SPECS

    path = tmp_path / "s.json"
    path.write_text(json.dumps([{"pp": 2, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8},
                                {"pp": 0, "dp": 1, "tp": 1, "mbs": 1, "gbs": 8},
                                {"pp": 1, "dp": 2, "tp": 1, "mbs": 1, "gbs": 8},
                                {"pp": 2, "dp": 1, "tp": 1, "mbs": 3, "gbs": 8}]))
    code, out, err = run_cli("evaluate", "--cluster", SPECS / "local-cpu.yaml", "--model", "gpt2-tiny",
                             "--strategy", path)
    assert code == 2
    assert [line.split(": ")[3] for line in err.strip().splitlines()] == ["[1].pp", "[3].mbs"]
    assert "2/1/1" in out and "1/2/1" in out  # the good ones are costed
