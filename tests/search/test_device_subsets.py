"""``--devices auto``: strategies that leave out a whole GPU-type group, ranked with the rest; ``evaluate`` of a
strategy on a subset (explicit placement)."""

from __future__ import annotations

import json

import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.strategy import Strategy, validate
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError
from ampe.search.engine import SearchOptions, search
from ampe.search.subsets import device_subsets, left_out, search_devices


def mixed(fast: tuple[str, int, int], slow: tuple[str, int, int]):
    return cluster_from_dict({"name": "mixed", "nodes": [
        {"name": "fast", "gpu": fast[0], "count": fast[1], "intra_gbps": 2400, "inter_gbps": 100, "repeat": fast[2]},
        {"name": "slow", "gpu": slow[0], "count": slow[1], "intra_gbps": 200, "inter_gbps": 100, "repeat": slow[2]}]})


def test_subsets_leave_out_each_gpu_type_group():
    cl = mixed(("A100-80GB", 8, 1), ("A40", 4, 2))
    subsets = dict(device_subsets(cl))
    assert subsets[""] == tuple(range(16))
    assert subsets["without 8×A100-80GB"] == tuple(range(8, 16))
    assert subsets["without 8×A40"] == tuple(range(8))
    part = cl.subset(subsets["without 8×A40"])
    assert part.size == 8 and {d.gpu.name for d in part.devices} == {"A100-80GB"}
    assert part.bandwidth[0, 1] == cl.bandwidth[0, 1]
    # one node of each kind: the two A100 nodes are alike, so are the two A40 nodes
    nodes = [label for label in subsets if label.startswith("without node")]
    assert nodes == ["without node slow-0 (4×A40)"]  # leaving out the A100 node equals "without 8×A100-80GB"
    one_type = mixed(("A40", 4, 1), ("A40", 4, 1))
    assert device_subsets(one_type) == [("", tuple(range(8))), ("without node fast-0 (4×A40)", tuple(range(4, 8)))]
    big = mixed(("A100-80GB", 8, 8), ("A40", 4, 2))  # 10 nodes: only the GPU-type groups
    assert [label for label, _ in device_subsets(big)] == ["", "without 64×A100-80GB", "without 8×A40"]


def test_auto_leaves_out_the_slow_group_where_that_is_faster():
    # eight T4s beside eight A100s slow gpt3-1.3b down (eight A40s, about half an A100 each, speed it up)
    cl, model = mixed(("A100-80GB", 8, 1), ("T4", 4, 2)), load_model("gpt3-1.3b")
    opts = SearchOptions(gbs=64, local_search=0)
    every = search(cl, model, None, opts)
    auto = search_devices(cl, model, None, opts)
    best = auto.ranked[0]
    assert best.estimate.iteration_s < every.ranked[0].estimate.iteration_s
    assert left_out(cl, best.strategy.placement) == "8×T4" and "without 8×T4" in best.placement_name
    assert all(cl.devices[d].gpu.name == "A100-80GB" for d in best.strategy.placement)
    # re-costed on the whole cluster: the same figures as on the part, idle devices hold nothing
    assert best.estimate.memory_bytes_per_device[8:] == (0,) * 8
    again = CostModel(cl, model).estimate(best.strategy)
    assert again.iteration_s == pytest.approx(best.estimate.iteration_s, rel=1e-12)
    # the full-cluster strategies are still on the table
    assert any(len(c.strategy.placement) == 16 for c in auto.ranked)


def test_auto_keeps_the_mixed_cluster_where_leaving_out_is_not_faster():
    cl, model = mixed(("A100-80GB", 4, 1), ("A40", 4, 1)), load_model("gpt3-6.7b")
    opts = SearchOptions(gbs=64, local_search=0)
    every, auto = search(cl, model, None, opts), search_devices(cl, model, None, opts)
    assert len(auto.ranked[0].strategy.placement) == 8 and left_out(cl, auto.ranked[0].strategy.placement) == ""
    assert auto.ranked[0].estimate.iteration_s == pytest.approx(every.ranked[0].estimate.iteration_s)


def test_evaluate_accepts_a_subset_placement(run_cli, tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("name: m\nnodes:\n  - {name: a100, gpu: A100-80GB, count: 8, intra_gbps: 2400, inter_gbps: 100}\n"
                    "  - {name: a40, gpu: A40, count: 4, intra_gbps: 200, inter_gbps: 100, repeat: 2}\n")
    s = tmp_path / "s.json"
    s.write_text(json.dumps({"pp": 2, "dp": 4, "tp": 1, "mbs": 2, "gbs": 64, "placement": list(range(8))}))
    code, out, err = run_cli("evaluate", "--cluster", spec, "--model", "gpt3-1.3b", "--strategy", s)
    assert code == 0, err
    assert "yes" in out  # fits on the eight A100s
    assert validate(Strategy(2, 4, 1, 2, 64, placement=tuple(range(8))), 16, 30).world_size == 8
    with pytest.raises(InputError, match="placement"):
        validate(Strategy(2, 4, 1, 2, 64, placement=(0, 1, 2, 3, 4, 5, 6, 6)), 16, 30)
    with pytest.raises(InputError, match="give a placement"):
        validate(Strategy(2, 4, 1, 2, 64), 16, 30)


def test_cli_devices_auto_says_what_was_left_out(run_cli, tmp_path):
    spec = tmp_path / "c.yaml"
    spec.write_text("name: m\nnodes:\n  - {name: a100, gpu: A100-80GB, count: 8, intra_gbps: 2400, inter_gbps: 100}\n"
                    "  - {name: t4, gpu: T4, count: 4, intra_gbps: 200, inter_gbps: 100, repeat: 2}\n")
    plan = tmp_path / "p.json"
    code, out, err = run_cli("search", "--cluster", spec, "--model", "gpt3-1.3b", "--devices", "auto",
                             "--global-batch", "64", "--energy-planner", "none", "--local-search", "0", "--out", plan)
    assert code == 0, err
    assert "left out" in out and "8×T4" in out
    doc = json.loads(plan.read_text())
    assert len(doc["strategies"][0]["placement"]) == 8 and doc["inputs"]["devices"] == "auto"
