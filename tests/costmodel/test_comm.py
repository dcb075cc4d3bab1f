"""Ring all-reduce and point-to-point times against hand computations."""

from __future__ import annotations

import numpy as np
import pytest

from ampe.costmodel.cluster import GBPS, cluster_from_dict
from ampe.costmodel.comm import p2p_time, ring_allreduce_time, ring_bandwidth


def test_ring_allreduce_on_a_ring_with_one_slow_link():
    # 4 devices on 4 nodes; node 2 has a 10 Gbps uplink, everyone else 100 Gbps.
    c = cluster_from_dict({"name": "ring", "nodes": [
        {"name": "a", "gpu": "A40", "count": 1, "intra_gbps": 400, "inter_gbps": 100, "repeat": 2},
        {"name": "slow", "gpu": "A40", "count": 1, "intra_gbps": 400, "inter_gbps": 10},
        {"name": "b", "gpu": "A40", "count": 1, "intra_gbps": 400, "inter_gbps": 100}]})
    ring = [0, 1, 2, 3]
    nbytes = 1e9
    # Hand computation: 2(n-1)/n · M / B_min with B_min = 10 Gbps = 1.25e9 B/s, plus 2(n-1) latencies.
    hand = 2 * 3 / 4 * 1e9 / 1.25e9 + 6 * c.latency_s
    assert ring_bandwidth(c.bandwidth, ring) == pytest.approx(10 * GBPS)
    assert ring_allreduce_time(nbytes, 4, ring_bandwidth(c.bandwidth, ring), c.latency_s) == pytest.approx(hand)
    # AMP's bug looks only at the wrap-around link (3 → 0), which is fast: the real ring is 10× slower.
    last_link_only = c.bandwidth[3, 0]
    assert last_link_only == pytest.approx(100 * GBPS)
    assert ring_allreduce_time(nbytes, 4, last_link_only) < hand / 9


def test_ring_includes_wraparound_hop():
    bw = np.full((3, 3), 100.0)
    bw[2, 0] = bw[0, 2] = 1.0
    assert ring_bandwidth(bw, [0, 1, 2]) == 1.0
    assert ring_bandwidth(bw, [1]) == float("inf")


def test_trivial_cases():
    assert ring_allreduce_time(1e9, 1, 1.0) == 0.0
    assert p2p_time(0, 1.0, 1.0) == 0.0
    assert p2p_time(100, 50.0, 0.5) == pytest.approx(2.5)
