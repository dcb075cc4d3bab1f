"""Slow and shared links (issue 32 item 5): transfers that block DeepSpeed's 1F1B stages, charged alike by the
simulation, the closed form and the DP; and a node's network interface shared by the flows that cross it at once
(pipeline shards and replicas, data-parallel rings). Hand-computed figures on small clusters, then properties."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.costmodel.cluster import cluster_from_dict
from ampe.costmodel.comm import ring_allreduce_time
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.pipeline import blocking_eq5, eq5, simulate
from ampe.costmodel.strategy import Strategy
from ampe.costmodel.zoo import load_model
from ampe.errors import InputError

INTER = 1e9  # bytes/s: 8 Gbit/s out of a node
INTRA = 1e10  # bytes/s: 80 Gbit/s between two devices of a node


def two_nodes(count: int = 4, nics: int | None = None, nodes: int = 2) -> dict:
    node = {"name": "n", "gpu": "RTX3090", "count": count, "intra_gbps": 80, "inter_gbps": 8, "repeat": nodes}
    if nics is not None:
        node["nics"] = nics
    return {"name": "two", "latency_us": 0, "nodes": [node]}


def model_and_cut():
    model = load_model("gpt2-medium")
    cut = model.num_layers // 2
    return model, cut, (0, cut, model.num_layers)


# --- shared network interfaces, by hand -----------------------------------------------------------------------


def test_concurrent_flows_share_the_interfaces_they_cross():
    bw = cluster_from_dict(two_nodes(nodes=3)).bandwidth  # devices 0-3 node 0, 4-7 node 1, 8-11 node 2
    # three flows out of node 0 (two to node 1, one to node 2), one inside node 0, one back from node 1 to node 0
    got = bw.concurrent([0, 1, 2, 3, 4], [4, 5, 8, 2, 0])
    assert got.tolist() == [INTER / 3, INTER / 3, INTER / 3, INTRA, INTER]  # full duplex: 4 → 0 is alone
    # in two groups (not at the same time) they do not share
    assert bw.concurrent([0, 1], [4, 5], [0, 1]).tolist() == [INTER, INTER]
    # two interfaces per node: devices 0-1 use the first, 2-3 the second
    bw2 = cluster_from_dict(two_nodes(nics=2, nodes=3)).bandwidth
    assert bw2.concurrent([0, 1, 2], [4, 6, 8]).tolist() == [INTER / 2, INTER / 2, INTER]


def test_a_stage_boundary_of_tensor_parallel_shards_moves_the_whole_activation_through_one_nic():
    model, cut, part = model_and_cut()
    nbytes = model.layers[cut - 1].out_elems * model.bytes_per_elem  # mbs 1
    s = Strategy(pp=2, dp=1, tp=4, mbs=1, gbs=8, partition=part)  # stage 0: node 0, stage 1: node 1
    # each shard sends a quarter over a quarter of the NIC, the receiver all-gathers over its 4-GPU ring
    gather = 3 / 4 * nbytes / INTRA
    shared = CostModel(cluster_from_dict(two_nodes()), model).estimate(s)
    assert shared.p2p_s[0][0] == pytest.approx(nbytes / INTER + gather, rel=1e-12)
    own = CostModel(cluster_from_dict(two_nodes(nics=4)), model).estimate(s)
    assert own.p2p_s[0][0] == pytest.approx(nbytes / 4 / INTER + gather, rel=1e-12)
    # inside one node: a quarter per shard over its own link, then the all-gather: the whole tensor's time again
    inside = CostModel(cluster_from_dict(two_nodes(count=8, nodes=1)), model).estimate(s)
    assert inside.p2p_s[0][0] == pytest.approx(nbytes / 4 / INTRA + gather, rel=1e-12)


def test_replicas_of_a_stage_on_one_node_share_its_nic():
    model, cut, part = model_and_cut()
    nbytes = model.layers[cut - 1].out_elems * model.bytes_per_elem
    s = Strategy(pp=2, dp=4, tp=1, mbs=1, gbs=8, partition=part)  # four replicas of each stage on one node
    e = CostModel(cluster_from_dict(two_nodes()), model).estimate(s)
    assert e.p2p_s[0][0] == pytest.approx(4 * nbytes / INTER, rel=1e-12)


def test_data_parallel_rings_of_every_shard_and_stage_share_the_nics():
    model = load_model("gpt2-medium")
    cm = CostModel(cluster_from_dict(two_nodes()), model)
    params = model.stage_params(range(model.num_layers), 4, trainable_only=True)
    s = Strategy(pp=1, dp=2, tp=4, mbs=1, gbs=8)  # replica 0 on node 0, replica 1 on node 1: four rings cross
    want = ring_allreduce_time(params * 2, 2, INTER / 4)
    assert cm.estimate(s).dp_sync_s == pytest.approx(want, rel=1e-12)
    own = CostModel(cluster_from_dict(two_nodes(nics=4)), model).estimate(s)
    assert own.dp_sync_s == pytest.approx(ring_allreduce_time(params * 2, 2, INTER), rel=1e-12)
    # two stages, each with its replicas on both nodes: both stages' rings cross at once
    *_, part = model_and_cut()
    s2 = Strategy(pp=2, dp=2, tp=1, mbs=1, gbs=8, partition=part, placement=(0, 4, 1, 5))
    e2 = cm.estimate(s2)
    assert e2.dp_sync_s == pytest.approx(max(ring_allreduce_time(
        model.stage_params(range(part[j], part[j + 1]), 1, trainable_only=True) * 2, 2, INTER / 2)
        for j in range(2)), rel=1e-12)


def test_nics_field_is_checked():
    with pytest.raises(InputError, match=r"nodes\[0\]\.nics"):
        cluster_from_dict(two_nodes(nics=5))
    with pytest.raises(InputError, match=r"nodes\[0\]\.nics"):
        cluster_from_dict(two_nodes(nics=0))


# --- blocking transfers, by hand -----------------------------------------------------------------------------


def test_blocking_transfers_by_hand():
    # two stages, forward 1 s and backward 2 s, 1 s each way: each micro-batch holds both stages 3 + 2 s
    assert blocking_eq5([3, 3], [2], 4) == 3 * 5 + 6 + 2 == 23
    assert simulate([1, 1], [2, 2], [1], [1], 4).makespan_s == pytest.approx(23)
    assert eq5([3, 3], [2], 4) == 17  # AMP's overlap hides them
    # three stages: the middle one is held by both boundaries, 3 + 4 s per micro-batch; the simulation's fill and
    # drain overlap one round trip of a boundary (equal stages and links: 0 ≤ eq5 − simulate ≤ a + g)
    assert blocking_eq5([3, 3, 3], [2, 2], 4) == 3 * 7 + 9 + 4 == 34
    assert simulate([1] * 3, [2] * 3, [1, 1], [1, 1], 4).makespan_s == pytest.approx(32)


def test_nothing_crosses_a_frozen_cut_so_nothing_waits_there():
    f, b, a = [1.0, 1.0, 1.0], [0.0, 2.0, 2.0], [0.5, 0.5]
    sent = simulate(f, b, a, a, 6).makespan_s
    frozen = simulate(f, b, a, [0.0, 0.5], 6, grad_sent=[False, True]).makespan_s
    assert frozen < sent


def test_the_estimate_charges_what_blocks_on_a_slow_link_and_the_simulation_agrees():
    model, _, part = model_and_cut()
    cm = CostModel(cluster_from_dict(two_nodes(count=2)), model)
    s = Strategy(pp=2, dp=1, tp=2, mbs=1, gbs=16, partition=part)
    e, sim = cm.estimate(s), cm.estimate(s, "simulate")
    t = [f + b for f, b in zip(e.fwd_s[0], e.bwd_s[0], strict=True)]
    both = 2 * e.p2p_s[0][0]
    assert e.pipeline_s[0] == pytest.approx(blocking_eq5(t, [both], 16), rel=1e-12)
    assert e.pipeline_s[0] > eq5(t, [both], 16) + 14 * both  # the steady state pays for the transfers
    assert sim.iteration_s == pytest.approx(e.iteration_s, rel=0.01)


# --- properties ----------------------------------------------------------------------------------------------

seconds = st.floats(0.05, 2.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(pp=st.integers(1, 6), gas=st.integers(1, 12), f=seconds, ratio=st.floats(1.0, 3.0),
       e=st.floats(0.0, 3.0), g=st.floats(0.5, 1.5))
def test_equal_stages_and_links_eq5_is_the_simulation_within_one_round_trip(pp, gas, f, ratio, e, g):
    a, back = [e * f] * (pp - 1), [e * f * g] * (pp - 1)
    t = [f * (1 + ratio)] * pp
    both = np.add(a, back)
    sim = simulate([f] * pp, [f * ratio] * pp, a, back, gas).makespan_s
    closed = blocking_eq5(t, both, gas)
    assert closed >= eq5(t, both, gas)  # charges at least what AMP's form did
    assert sim * (1 - 1e-9) <= closed <= sim + (both[0] if pp > 1 else 0.0) * (1 + 1e-9) + 1e-12


def test_eq5_can_be_under_the_simulation_when_stages_split_forward_and_backward_differently():
    """Hypothesis's find, kept: no transfers, the two heaviest stages equal in total but not in how their time splits
    between forward and backward. 1F1B's second micro-batch waits an eighth of a second on the split; Eq. 5, which
    only sees totals, does not charge it (0.9 % under)."""
    f, b = [1.0, 1.875, 1.25, 0.25], [1.0, 1.875, 2.5, 0.25]
    sim = simulate(f, b, [0.0] * 3, [0.0] * 3, 2).makespan_s
    assert blocking_eq5(np.add(f, b), [0.0] * 3, 2) == eq5(np.add(f, b), [0.0] * 3, 2) == 13.75
    assert sim == pytest.approx(13.875, rel=1e-12)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), pp=st.integers(2, 6), gas=st.integers(1, 12), ratio=st.floats(1.0, 3.0))
def test_without_transfers_and_one_backward_to_forward_ratio_eq5_is_never_under_the_simulation(data, pp, gas, ratio):
    f = data.draw(st.lists(st.floats(0.2, 2.0), min_size=pp, max_size=pp))
    b = [x * ratio for x in f]
    sim = simulate(f, b, [0.0] * (pp - 1), [0.0] * (pp - 1), gas).makespan_s
    assert sim <= eq5(np.add(f, b), [0.0] * (pp - 1), gas) * (1 + 1e-9)


@settings(max_examples=300, deadline=None)
@given(data=st.data(), pp=st.integers(2, 6), gas=st.integers(1, 12), scale=st.sampled_from([0.1, 0.5, 1.0, 2.0]))
def test_eq5_within_eight_percent_of_the_simulation_with_transfers_up_to_twice_the_lightest_forward(data, pp, gas,
                                                                                                   scale):
    """Stages that split forward and backward differently, with links: Eq. 5 can be under the simulation (above),
    by at most 4.0 % in 10^5 random and hill-climbed cases (docs/cost_model.md); the test allows twice that."""
    f = data.draw(st.lists(st.floats(0.2, 2.0), min_size=pp, max_size=pp))
    b = [x * data.draw(st.floats(1.0, 3.0)) for x in f]
    cap = scale * min(f)
    a = data.draw(st.lists(st.floats(0.0, cap), min_size=pp - 1, max_size=pp - 1))
    g = data.draw(st.lists(st.floats(0.0, cap), min_size=pp - 1, max_size=pp - 1))
    t, both = np.add(f, b), np.add(a, g)
    sim = simulate(f, b, a, g, gas).makespan_s
    assert sim <= blocking_eq5(t, both, gas) * 1.08
    assert blocking_eq5(t, both, gas) >= eq5(t, both, gas)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1))
def test_random_small_strategies_charge_at_least_what_unshared_overlapped_links_did(seed):
    """On random placements of random degrees (tensor parallelism inside a node, one NIC per node), the pipeline
    and the data-parallel sync are at least AMP's Eq. 5 over the unshared links of before, and the estimate of
    1F1B is not under its simulation where the transfers are below the lightest stage's compute."""
    rng = np.random.default_rng(seed)
    count, nodes = int(rng.choice([2, 4])), int(rng.integers(2, 4))
    spec = two_nodes(count=count, nodes=nodes)
    spec["nodes"][0]["inter_gbps"] = float(rng.choice([1, 8, 100]))
    cluster = cluster_from_dict(spec)
    model = load_model("gpt2")
    n = cluster.size
    tp = int(rng.choice([d for d in (1, 2, 4) if count % d == 0]))
    pp = int(rng.choice([d for d in (1, 2, 3, 4, 6) if (n // tp) % d == 0 and d <= model.num_layers]))
    dp = n // tp // pp
    gas = int(rng.integers(1, 9))
    groups = rng.permutation(n // tp)  # whole tensor-parallel groups (aligned pairs or quads) move together
    placement = tuple(int(g * tp + k) for g in groups for k in range(tp))
    s = Strategy(pp=pp, dp=dp, tp=tp, mbs=1, gbs=gas * dp, placement=placement)
    cm = CostModel(cluster, model)
    e = cm.estimate(s)
    bw, part = cluster.bandwidth, e.strategy.partition
    comp = [f + b for f, b in zip(e.fwd_s[0], e.bwd_s[0], strict=True)]
    for r in range(dp):  # before: every shard sent the whole activation over its link, alone, overlapped
        old = []
        for j in range(pp - 1):
            link = min(bw[s.device(j, r, k), s.device(j + 1, r, k)] for k in range(tp))
            nbytes = cm.transfer_bytes(part[j + 1], 1)
            old.append(2 * nbytes / link)
            assert e.p2p_s[r][j] >= nbytes / link * (1 - 1e-12)
        t = [f + b for f, b in zip(e.fwd_s[r], e.bwd_s[r], strict=True)]
        assert e.pipeline_s[r] >= eq5(t, old, gas) * (1 - 1e-12)
    for j in range(pp):  # before: each ring alone at its slowest hop
        hop = min(bw[s.device(j, r, k), s.device(j, (r + 1) % dp, k)] for r in range(dp) for k in range(tp))
        params = model.stage_params(range(part[j], part[j + 1]), tp, trainable_only=True)
        assert e.dp_sync_s >= ring_allreduce_time(params * 2, dp, hop) * (1 - 1e-12)
    if pp > 1 and max(e.p2p_s[0]) <= min(comp) / 3:
        assert cm.estimate(s, "simulate").iteration_s <= e.iteration_s * (1 + 1e-9)
