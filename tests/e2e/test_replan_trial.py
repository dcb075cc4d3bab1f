"""A failure re-planned and trained for real on CPUs: a plan for 4 ranks on two emulated nodes of two CPU devices,
one node removed (``ampe replan --without``), the re-plan exported and run as a DeepSpeed trial on the 2 ranks left."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from ampe.trials.planfile import load_plan

SPEC = """name: cpu-two-nodes
latency_us: 50
nodes:
  - {name: n, gpu: cpu, count: 2, processors: 1, sharing_efficiency: 0.91, intra_gbps: 40, inter_gbps: 10, repeat: 2}
"""


@pytest.mark.trial
def test_a_node_removed_and_the_replan_trains_on_the_rest(tmp_path, run_cli):
    pytest.importorskip("deepspeed")
    spec = tmp_path / "cluster.yaml"
    spec.write_text(SPEC)
    plan = tmp_path / "plan.json"
    code, _, err = run_cli("search", "--cluster", spec, "--model", "gpt2-tiny", "--global-batch", "8", "--top-k", "3",
                           "--energy-planner", "none", "--out", plan)
    assert code == 0, err
    old = json.loads(plan.read_text())["strategies"][0]
    assert old["pp"] * old["dp"] * old["tp"] == 4
    new = tmp_path / "replanned.json"
    code, out, err = run_cli("replan", "--plan", plan, "--without", "n-1", "--energy-planner", "none", "--out", new)
    assert code == 0, err
    assert "n-1 -2 (down)" in out and "moves:" in out
    assert yaml.safe_load((tmp_path / "replanned.cluster.yaml").read_text())["down"] == ["n-1"]
    doc = load_plan(new)
    s = doc.strategies[0].strategy
    assert s.pp * s.dp * s.tp == 2 and set(s.placement) <= {0, 1}  # the two devices of n-0

    code, out, err = run_cli("export", "--plan", new, "--out", tmp_path / "export", "--script", "train.py")
    assert code == 0, err
    assert json.loads((tmp_path / "export" / "export.json").read_text())["strategy"]["placement"] == list(s.placement)

    results = tmp_path / "trials"
    code, out, err = run_cli("trial", "--plan", new, "--top-k", "1", "--warmup", "1", "--iters", "2", "--timeout",
                             "300", "--out", results, "--progress", "none", "--freq-backend", "none")
    assert code == 0, err
    (line,) = [json.loads(l) for l in (results / "results.jsonl").read_text().splitlines()]
    assert line["status"] == "ok", line.get("reason")
    ran = line["strategy"]
    assert (ran["pp"], ran["dp"], ran["tp"], ran["mbs"], ran["placement"]) == (s.pp, s.dp, s.tp, s.mbs,
                                                                                list(s.placement))
    assert len(line["peak_memory_bytes_per_rank"]) == 2
    assert math.isfinite(line["worker"]["loss_first"]) and math.isfinite(line["worker"]["loss_last"])
