"""Devices time-sharing processors (cluster ``processors:``, CPU emulation of 4 ranks on 2 cores): the processor-sharing
pipeline simulation against the per-device one and hand-derived cases."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.model import load_model
from ampe.costmodel.pipeline import simulate, simulate_shared
from ampe.costmodel.strategy import Strategy
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
