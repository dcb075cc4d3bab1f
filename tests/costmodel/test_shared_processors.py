"""Devices time-sharing processors (cluster ``processors:``, CPU emulation of 4 ranks on 2 cores): the processor-sharing
pipeline simulation against the per-device one and hand-derived cases."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pipeline import simulate, simulate_shared
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError


def test_own_processors_reproduce_the_plain_simulation():
    rng = np.random.default_rng(3)
    for _ in range(20):
        pp, dp, gas = int(rng.integers(1, 5)), int(rng.integers(1, 3)), int(rng.integers(1, 9))
        f, b = rng.uniform(0.1, 1.0, (dp, pp)), rng.uniform(0.1, 2.0, (dp, pp))
        pf, pb = rng.uniform(0, 0.2, (dp, pp - 1)), rng.uniform(0, 0.2, (dp, pp - 1))
        procs = [[[r * pp + j] for j in range(pp)] for r in range(dp)]
        shared = simulate_shared(f, b, pf, pb, gas, procs)
        alone = max(simulate(f[r], b[r], pf[r], pb[r], gas).makespan_s for r in range(dp))
        assert shared == pytest.approx(alone, rel=1e-9)


def test_replicas_on_one_processor_take_turns():
    f, b = np.full((2, 1), 1.0), np.full((2, 1), 2.0)
    empty = np.zeros((2, 0))
    # Two data-parallel replicas of a 1-stage pipeline on one processor: each runs at half speed throughout.
    assert simulate_shared(f, b, empty, empty, 4, [[[0]], [[0]]]) == pytest.approx(2 * 4 * 3.0)


def test_colocating_a_stages_replicas_serialises_a_short_pipeline():
    # pp 2 × dp 2, gas 1 (no overlap between stages): the two stages of one replica on one core run one after the
    # other at full speed; the two replicas of one stage on one core run together at half speed.
    f, b = np.ones((2, 2)), np.ones((2, 2))
    z = np.zeros((2, 1))
    mixed = simulate_shared(f, b, z, z, 1, [[[0], [0]], [[1], [1]]])
    stacked = simulate_shared(f, b, z, z, 1, [[[0], [1]], [[0], [1]]])
    assert mixed == pytest.approx(4.0) and stacked == pytest.approx(8.0)


def test_cluster_processors_and_estimate():
    spec = {"name": "cpu4", "latency_us": 0,
            "nodes": [{"name": "h", "gpu": "cpu", "count": 4, "processors": 2, "intra_gbps": 1e6, "inter_gbps": 1e6}]}
    cl = cluster_from_dict(spec)
    assert cl.processor == (0, 1, 0, 1)
    cm = CostModel(cl, load_model("gpt2-tiny"))
    s = Strategy(pp=1, dp=4, tp=1, mbs=1, gbs=4)
    e = cm.estimate(s)
    one = CostModel(cluster_from_dict({**spec, "nodes": [{**spec["nodes"][0], "processors": None}]}),
                    load_model("gpt2-tiny")).estimate(s)
    # four replicas, two per core: twice the compute of a replica per core, and both optimizer steps
    assert e.shared_processor_s == pytest.approx(e.iteration_s)
    assert e.iteration_s == pytest.approx(2 * one.pipeline_s[0] + 2 * one.optimizer_s + one.dp_sync_s, rel=1e-6)
    with pytest.raises(InputError, match="processors"):
        cluster_from_dict({**spec, "nodes": [{**spec["nodes"][0], "processors": 5}]})


def test_sharing_efficiency_slows_only_shared_stretches():
    # Two replicas on processor 0 at efficiency 0.8 run together at 0.4 of its speed each; a lone computation on
    # processor 1 keeps full speed however low its efficiency.
    f, b = np.full((2, 1), 1.0), np.full((2, 1), 2.0)
    empty = np.zeros((2, 0))
    assert simulate_shared(f, b, empty, empty, 4, [[[0]], [[0]]], efficiency=[0.8, 0.5]) == \
        pytest.approx(2 * 4 * 3.0 / 0.8)
    assert simulate_shared(f, b, empty, empty, 4, [[[0]], [[1]]], efficiency=[0.8, 0.5]) == pytest.approx(4 * 3.0)
    # One replica ends early: the other finishes its remaining work alone at full speed.
    f2, b2 = np.array([[1.0], [2.0]]), np.zeros((2, 1))
    # shared until replica 0 is done: 1 s of work at 0.4/s = 2.5 s; then replica 1's last 1 s alone
    assert simulate_shared(f2, b2, empty, empty, 1, [[[0]], [[0]]], efficiency=[0.8]) == pytest.approx(3.5)


def test_sharing_efficiency_in_spec_and_estimate():
    node = {"name": "h", "gpu": "cpu", "count": 4, "processors": 2, "intra_gbps": 1e6, "inter_gbps": 1e6}
    full = cluster_from_dict({"name": "c", "latency_us": 0, "nodes": [node]})
    lossy = cluster_from_dict({"name": "c", "latency_us": 0, "nodes": [{**node, "sharing_efficiency": 0.8}]})
    assert full.processor_efficiency == (1.0, 1.0) and lossy.processor_efficiency == (0.8, 0.8)
    s = Strategy(pp=1, dp=4, tp=1, mbs=1, gbs=4)
    a = CostModel(full, load_model("gpt2-tiny")).estimate(s)
    e = CostModel(lossy, load_model("gpt2-tiny")).estimate(s)
    # every computation and optimizer step is shared two ways all the time; the all-reduce is not scaled
    assert e.iteration_s - e.dp_sync_s == pytest.approx((a.iteration_s - a.dp_sync_s) / 0.8, rel=1e-6)
    for bad, match in ((0, "greater than 0"), (1.5, "less than or equal to 1")):
        with pytest.raises(InputError, match=f"sharing_efficiency: .*{match}"):
            cluster_from_dict({"name": "c", "nodes": [{**node, "sharing_efficiency": bad}]})
    with pytest.raises(InputError, match=r"sharing_efficiency.*processors"):
        cluster_from_dict({"name": "c", "nodes": [{**node, "processors": None, "sharing_efficiency": 0.9}]})


def test_iteration_overhead_is_charged_once_per_rank_and_shared_like_compute():
    base = {"name": "c", "latency_us": 0,
            "nodes": [{"name": "h", "gpu": "cpu", "count": 4, "processors": 2, "sharing_efficiency": 0.8,
                       "intra_gbps": 1e6, "inter_gbps": 1e6}]}
    model = load_model("gpt2-tiny")
    s = Strategy(pp=1, dp=4, tp=1, mbs=1, gbs=4)

    def estimate(overhead_s: float, shared: bool = True):
        spec = {**base, "gpu_types": {"cpu": {"iteration_overhead_s": overhead_s}}}
        if not shared:
            spec["nodes"] = [{**base["nodes"][0], "processors": None, "sharing_efficiency": 1.0}]
        return CostModel(cluster_from_dict(spec), model).estimate(s)

    # own cores: +overhead once per iteration; two ranks per core at efficiency 0.8: 2 × overhead / 0.8
    assert estimate(0.01, shared=False).iteration_s - estimate(0.0, shared=False).iteration_s == pytest.approx(0.01)
    assert estimate(0.01).iteration_s - estimate(0.0).iteration_s == pytest.approx(2 * 0.01 / 0.8)
    with pytest.raises(InputError, match="iteration_overhead_s"):
        cluster_from_dict({**base, "gpu_types": {"cpu": {"iteration_overhead_s": -1}}})
