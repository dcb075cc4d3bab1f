"""The cost model's array paths (device maps once per candidate, replicas costed once per class, memory once per
(stage, GPU type), cached tables) give exactly the estimates and DP tables of a straightforward per-device reference:
every ring, link and memory figure taken one device at a time, as the issue-16 profile found them (and every flow
that shares a network interface counted one at a time)."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from ampe.costmodel.cluster import cluster_from_dict, load_cluster
from ampe.costmodel.comm import ring_allreduce_time, ring_bandwidth
from ampe.costmodel.estimate import CostModel, Estimate
from ampe.costmodel.memory import (
    allocatable_bytes,
    combine_chunks,
    recompute_working_bytes,
    stage_memory,
)
from ampe.costmodel.model import cut_sharded
from ampe.costmodel.pipeline import closed_form_s, instruction_overhead_s, simulate
from ampe.costmodel.profile import load_profile
from ampe.costmodel.strategy import RECOMPUTE, Strategy, complete
from ampe.costmodel.tables import stage_tables
from ampe.costmodel.tail import GRAD_BYTES
from ampe.costmodel.zoo import load_model
from ampe.search.engine import SearchOptions, search
from ampe.search.space import enumerate_degrees
from tests.conftest import AMP_PROFILE, SPECS


def three_types():
    """24 GPUs of three types in 4-GPU nodes, one slow link between two nodes of different types; the H100 nodes
    have two network interfaces each, the others one."""
    nodes = [{"name": "h", "gpu": "H100-80GB", "count": 4, "intra_gbps": 2400, "inter_gbps": 400, "repeat": 2,
              "nics": 2},
             {"name": "a", "gpu": "A100-40GB", "count": 4, "intra_gbps": 1200, "inter_gbps": 100, "repeat": 2},
             {"name": "v", "gpu": "V100-16GB", "count": 4, "intra_gbps": 300, "inter_gbps": 50, "repeat": 2}]
    return cluster_from_dict({"name": "three", "nodes": nodes, "links": [{"a": "h-1", "b": "v-0", "gbps": 10}]})


# --- the reference: one device, one ring, one link at a time ------------------------------------------------


def ref_shared(bw, flows):
    """The bandwidth of each flow (a, b) of ``flows`` while all of them run: its link, divided for a flow between
    nodes by the larger of the number of the flows leaving a's network interface and entering b's."""
    nic, node = bw.nics(), bw.node_of
    out, into = Counter(), Counter()
    for a, b in flows:
        if node[a] != node[b]:
            out[nic[a]] += 1
            into[nic[b]] += 1
    return [bw[a, b] / max(out[nic[a]], into[nic[b]]) if node[a] != node[b] else bw[a, b] for a, b in flows]


def ref_boundary(cm, s, j):
    """Per replica: the slowest shard flow from device stage j to (j+1) mod pp with the boundary's flows running at
    once, and the slower of the two stages' tensor-parallel rings."""
    bw, nxt = cm.cluster.bandwidth, (j + 1) % s.pp
    flows = [(s.device(j, r, k), s.device(nxt, r, k)) for r in range(s.dp) for k in range(s.tp)]
    got = ref_shared(bw, flows)
    links = [min(got[r * s.tp:(r + 1) * s.tp]) for r in range(s.dp)]
    rings = [min(ring_bandwidth(bw, s.stage_devices(j, r)), ring_bandwidth(bw, s.stage_devices(nxt, r)))
             for r in range(s.dp)]
    return links, rings


def ref_transfer(nbytes, tp, link, ring, lat):
    """One boundary's transfer: each shard sends nbytes/tp, the receiver all-gathers over its ring."""
    if nbytes <= 0 or not np.isfinite(link):
        return 0.0
    send = lat + nbytes / tp / link
    return send + ((tp - 1) / tp * nbytes / ring + (tp - 1) * lat if tp > 1 else 0.0)


def ref_dp_rings(cm, s):
    """(pp, tp) slowest hop of each data-parallel ring with every ring's hops running at once."""
    out = np.full((s.pp, s.tp), np.inf)
    if s.dp < 2:
        return out
    hops = [(j, k, s.device(j, r, k), s.device(j, (r + 1) % s.dp, k))
            for j in range(s.pp) for k in range(s.tp) for r in range(s.dp)]
    got = ref_shared(cm.cluster.bandwidth, [(a, b) for _, _, a, b in hops])
    for (j, k, _, _), v in zip(hops, got, strict=True):
        out[j, k] = min(out[j, k], v)
    return out


def ref_pipelines(cm: CostModel, s: Strategy, method: str):
    """(fwd, bwd, p2p, pipeline per replica, pace GPU names) with every tensor-parallel group taken on its own."""
    assert s.partition is not None
    bw, n_pos = cm.cluster.bandwidth, s.pp * s.virtual_stages
    fwd, bwd, p2p = np.zeros((s.dp, n_pos)), np.zeros((s.dp, n_pos)), np.zeros((s.dp, max(n_pos - 1, 0)))
    pace = []
    for r in range(s.dp):
        names = []
        for pos in range(n_pos):
            devs = s.stage_devices(pos % s.pp, r)
            gpu = cm.slowest_gpu(devs)
            lt = cm.layer_times(gpu, s.tp, s.mbs, ring_bandwidth(bw, devs), s.recompute)
            a, b = s.partition[pos], s.partition[pos + 1]
            op = instruction_overhead_s(gpu.pipeline_op_s, n_pos)
            fwd[r, pos] = lt.forward_s[a:b].sum() + op
            bwd[r, pos] = lt.backward_s[a:b].sum()
            bwd[r, pos] += op if bwd[r, pos] > 0 else 0.0
            names.append(gpu.name)
            if pos < n_pos - 1:
                links, rings = ref_boundary(cm, s, pos % s.pp)
                nbytes = cm.transfer_bytes(b, s.mbs) / (s.tp if cut_sharded(cm.model, b) else 1)
                p2p[r, pos] = ref_transfer(nbytes, s.tp, links[r], rings[r], cm.cluster.latency_s)
        pace.append(tuple(names))
    frozen = [all(l.frozen for l in cm.model.layers[: s.partition[p + 1]]) for p in range(n_pos - 1)]
    back = p2p * np.array([0.0 if f else 1.0 for f in frozen])[None, :] if n_pos > 1 else p2p
    if method == "simulate":
        pipes = [simulate(fwd[r], bwd[r], p2p[r], back[r], s.shares[r], s.schedule, s.virtual_stages,
                          [not f for f in frozen]).makespan_s for r in range(s.dp)]
    else:
        pipes = [closed_form_s(fwd[r], bwd[r], p2p[r] + back[r], s.shares[r], s.schedule, s.virtual_stages)
                 for r in range(s.dp)]
    return fwd, bwd, p2p, pipes, tuple(pace)


def ref_tail(cm: CostModel, s: Strategy):
    """[stage] data-parallel sync, tied sync and optimizer seconds, every ring of every shard costed."""
    assert s.partition is not None
    bw, lat, gb = cm.cluster.bandwidth, cm.cluster.latency_s, GRAD_BYTES[cm.model.dtype]
    sync, tied, opt = np.zeros(s.pp), np.zeros(s.pp), np.zeros(s.pp)
    dp_rings = ref_dp_rings(cm, s)
    for j in range(s.pp):
        params = sum(cm.model.stage_params(range(s.partition[p], s.partition[p + 1]), s.tp, trainable_only=True)
                     for p in range(j, s.pp * s.virtual_stages, s.pp))
        if s.dp > 1:
            for k in range(s.tp):
                t = ring_allreduce_time(params * gb, s.dp, dp_rings[j, k], lat)
                if s.zero:  # reduce-scatter of the gradients + all-gather of the bit16 weights
                    t = (t + ring_allreduce_time(params * cm.model.bytes_per_elem, s.dp, dp_rings[j, k], lat)) / 2
                sync[j] = max(sync[j], t)
        for r in range(s.dp):
            gpu = cm.slowest_gpu(s.stage_devices(j, r))
            rate = cm.optimizer_seconds_per_param(gpu, s.zero, s.dp)
            opt[j] = max(opt[j], params * rate + gpu.iteration_overhead_s)
    for stages, size in cm.tied_groups(s).values():
        worst = 0.0
        for r in range(s.dp):
            for k in range(s.tp):
                ring = [s.device(j, r, k) for j in stages]
                worst = max(worst, ring_allreduce_time(size * gb, len(ring), ring_bandwidth(bw, ring), lat))
        tied[stages] += worst
    return sync, tied, opt


def ref_memory(cm: CostModel, s: Strategy):
    """(per stage, per device, OOM reason, whether a device is at risk): :func:`stage_memory` called for every
    device; at risk: within capacity, not within its reserve."""
    assert s.partition is not None
    per_dev = [0] * cm.cluster.size
    per_stage, reason, risk = [], None, False
    for j in range(s.pp):
        chunks = [range(s.partition[p], s.partition[p + 1]) for p in range(j, s.pp * s.virtual_stages, s.pp)]
        worst = 0
        for r in range(s.dp):
            for k in range(s.tp):
                d = s.device(j, r, k)
                gpu = cm.cluster.devices[d].gpu
                parts = [stage_memory(cm.model, c, j, s.pp, s.tp, s.mbs, s.shares[r], gpu, s.schedule,
                                      s.virtual_stages,
                                      layer_states=cm.layer_states(s.tp, s.zero, s.dp),
                                      layer_acts=cm.layer_activations(gpu, s.tp, s.mbs, s.recompute),
                                      recompute=s.recompute, zero=s.zero, dp=s.dp,
                                      expandable=s.expandable_segments) for c in chunks]
                footprint = combine_chunks(parts).total
                total = int(footprint)
                per_dev[d] = total
                worst = max(worst, total)
                if total > gpu.memory_bytes and reason is None:
                    reason = f"stage {j} on device {d} ({cm.cluster.devices[d].node})"
                risk |= gpu.memory_bytes - gpu.memory_reserve * gpu.memory_bytes < footprint <= gpu.memory_bytes
        per_stage.append(worst)
    return tuple(per_stage), tuple(per_dev), reason, risk


def ref_tables(cm: CostModel, s: Strategy):
    """The DP tables (time, sync and transfer rows, before prefix sums) with every tensor-parallel group,
    data-parallel ring, link and tied ring of every (replica, shard) taken on its own."""
    model, bw, lat = cm.model, cm.cluster.bandwidth, cm.cluster.latency_s
    L, n_pos, gb = model.num_layers, s.pp * s.virtual_stages, GRAD_BYTES[model.dtype]
    time, coef = np.zeros((s.pp, L)), np.zeros(s.pp)
    dp_rings = ref_dp_rings(cm, s)
    out_bytes = np.array([layer.out_elems for layer in model.layers], dtype=float) * model.bytes_per_elem * s.mbs
    for j in range(s.pp):
        groups = [s.stage_devices(j, r) for r in range(s.dp)]
        for devs in groups:
            lt = cm.layer_times(cm.slowest_gpu(devs), s.tp, s.mbs, ring_bandwidth(bw, devs), s.recompute)
            time[j] = np.maximum(time[j], lt.total_s)
        worst = 0.0
        for k in range(s.tp if s.dp > 1 else 0):
            moved = 2.0 * gb if not s.zero else gb + model.bytes_per_elem
            worst = max(worst, (s.dp - 1) / s.dp * moved / dp_rings[j, k])
        coef[j] = worst + max(cm.optimizer_seconds_per_param(cm.slowest_gpu(devs), s.zero, s.dp) for devs in groups)
    idx = [p % s.pp for p in range(n_pos)]
    trainable = np.array([layer.trainable_params_per_rank(s.tp) for layer in model.layers])
    sync = trainable[None, :] * coef[idx][:, None]
    for i, layer in enumerate(model.layers):
        if layer.tied and layer.trains_tied and n_pos > 1:
            size = layer.tied_params / (s.tp if layer.tp_shardable else 1)
            rings = [[s.device(0, r, k), s.device(s.pp - 1, r, k)] for r in range(s.dp) for k in range(s.tp)]
            worst = max(ring_allreduce_time(size * gb, 2, ring_bandwidth(bw, ring), lat) for ring in rings)
            sync[0 if i < L // 2 else n_pos - 1, i] += worst
    transfer = np.zeros((max(n_pos - 1, 0), L + 1))
    for p in range(n_pos - 1):
        links, rings = ref_boundary(cm, s, p % s.pp)
        for c in range(1, L):
            nbytes = out_bytes[c - 1] / (s.tp if cut_sharded(model, c) else 1)
            one = ref_transfer(nbytes, s.tp, min(links), min(rings), lat)
            transfer[p, c] = one * (1.0 if all(layer.frozen for layer in model.layers[:c]) else 2.0)
    return time[idx], sync, transfer


def ref_memory_margins(cm: CostModel, s: Strategy, segments):
    """Per (position, first layer, end) of ``segments``: the least room left on the position's devices by
    :func:`stage_memory` of that segment alone (as one chunk of the device's room, interleaved), each device on its
    own: its allocatable bytes leaving the reserve free (the stage tables' default), less its workspaces, / chunks,
    less its allocated peak beyond the workspaces."""
    out = []
    for p, a, b in segments:
        j = p % s.pp
        least = np.inf
        for r in range(s.dp):
            for k in range(s.tp):
                gpu = cm.cluster.devices[s.device(j, r, k)].gpu
                rec = s.recompute_at(j)
                mem = stage_memory(cm.model, range(a, b), j, s.pp, s.tp, s.mbs, s.gas, gpu, s.schedule,
                                   s.virtual_stages, recompute=rec, zero=s.zero, dp=s.dp,
                                   layer_states=cm.layer_states(s.tp, s.zero, s.dp),
                                   layer_acts=cm.layer_activations(gpu, s.tp, s.mbs, rec),
                                   expandable=s.expandable_segments)
                room = (allocatable_bytes(gpu, s.expandable_segments, margin=True)
                        - gpu.workspace_bytes) / s.virtual_stages
                least = min(least, room - (mem.allocated - mem.workspace))
        out.append(least)
    return np.array(out)


# --- the comparison -----------------------------------------------------------------------------------------------


def cases():
    """(cost model, strategy) on a three-type cluster and on AMP's het cluster with its profile: random degrees,
    placements, partitions, schedules and memory options."""
    rng = random.Random(16)
    inputs = [(three_types(), load_model("gpt3-1.3b"), None),
              (load_cluster(SPECS / "amp-het-cluster.yaml"), load_model("gpt2-amp"), load_profile(AMP_PROFILE))]
    for cluster, model, profile in inputs:
        cm = CostModel(cluster, model, profile)
        degrees = enumerate_degrees(cluster, model.num_layers, 32, True, schedules=("1f1b", "gpipe", "interleaved"))
        for d in rng.sample(degrees, 14):
            n_pos = d.pp * d.virtual_stages
            part = (0, *sorted(rng.sample(range(1, model.num_layers), n_pos - 1)), model.num_layers)
            devices = list(range(cluster.size))
            rng.shuffle(devices)
            yield cm, Strategy(d.pp, d.dp, d.tp, d.mbs, d.gbs, part, None, d.schedule, d.virtual_stages)
            # a random placement, with memory options (recomputation, ZeRO-1) drawn too
            yield cm, Strategy(d.pp, d.dp, d.tp, d.mbs, d.gbs, part, tuple(devices), d.schedule, d.virtual_stages,
                               recompute=rng.choice(RECOMPUTE), zero=rng.choice((0, 1)) if d.dp > 1 else 0)


def share_cases():
    """Cases of :func:`cases` with dp > 1 given random uneven shares of the same global batch (a separate random
    stream: the cases above stay as they were)."""
    rng = random.Random(34)
    for cm, s in BASE_CASES:
        total = s.gbs // s.mbs
        if s.dp > 1 and total > s.dp and rng.random() < 0.5:
            cuts = sorted(rng.sample(range(1, total), s.dp - 1))
            per = [b - a for a, b in zip([0, *cuts], [*cuts, total], strict=True)]
            if len(set(per)) > 1:
                yield cm, replace(s, replica_gas=tuple(per))


BASE_CASES = list(cases())
CASES = BASE_CASES + list(share_cases())


@pytest.mark.parametrize("case", range(len(CASES)))
def test_estimate_equals_the_per_device_reference(case):
    cm, strategy = CASES[case]
    s = complete(strategy, cm.model.num_layers)
    for method in ("eq5", "simulate"):
        e = cm.estimate(s, method)
        fwd, bwd, p2p, pipes, pace = ref_pipelines(cm, s, method)
        assert e.fwd_s == tuple(tuple(map(float, r)) for r in fwd)  # exact: the same sums, minima and products
        assert e.bwd_s == tuple(tuple(map(float, r)) for r in bwd)
        assert e.p2p_s == tuple(tuple(map(float, r)) for r in p2p)
        assert e.pipeline_s == tuple(map(float, pipes)) and e.stage_gpu == pace
        sync, tied, opt = ref_tail(cm, s)
        assert (e.dp_sync_s, e.tied_sync_s, e.optimizer_s) == (sync.max(), tied.max(), opt.max())
        assert e.tail_s == tuple(map(float, sync + tied + opt))
        assert e.iteration_s == max(pipes) + float((sync + tied + opt).max())
        per_stage, per_dev, reason, risk = ref_memory(cm, s)
        assert e.memory_bytes_per_stage == per_stage and e.memory_bytes_per_device == per_dev
        assert e.max_memory_bytes == max(per_dev)
        assert (e.oom_reason or "").startswith(reason or "") and e.within_capacity == (reason is None)
        assert e.fits == (reason is None and not risk) and (e.memory_risk is not None) == (reason is None and risk)
    # the same strategy costed by a fresh model (no caches) agrees too
    fresh = CostModel(cm.cluster, cm.model, cm.profile).estimate(s)
    assert fresh == cm.estimate(s)


@pytest.mark.parametrize("case", range(0, len(BASE_CASES), 2))
def test_stage_tables_equal_the_per_device_reference(case):
    cm, strategy = CASES[case]
    s = complete(strategy, cm.model.num_layers)
    t = stage_tables(cm, s)
    time, sync, transfer = ref_tables(cm, s)

    def prefix(rows):
        out = np.zeros((rows.shape[0], rows.shape[1] + 1))
        out[:, 1:] = np.cumsum(rows, axis=1)
        return out

    assert np.array_equal(t.time_prefix, prefix(time)) and np.array_equal(t.sync_prefix, prefix(sync))
    assert np.array_equal(t.transfer, transfer)


@pytest.mark.parametrize("case", range(len(BASE_CASES)))
def test_memory_bounds_equal_the_estimate_per_device(case):
    """The DP's memory bounds leave, for every segment a position could hold, exactly the room the estimate's
    ``stage_memory`` leaves on the position's fullest device (to rounding), every device taken on its own: random
    segments of every position's window plus the longest and shortest ones at both ends, under every memory option
    the cases draw (recomputation, ZeRO-1, schedules with k ≥ gas, interleaved chunks). Where the bounds are
    conservative they leave less: a segment holding both members of a tied group (the embedding and the LM head:
    all layers but the last no-op at most), and gas = 1, by at most one layer's working set."""
    cm, strategy = CASES[case]
    s = complete(strategy, cm.model.num_layers)
    t = stage_tables(cm, s)
    L, n_pos = cm.model.num_layers, s.pp * s.virtual_stages
    rng = random.Random(case)
    segments = []
    for p in range(n_pos):
        first, last = p, L - n_pos + p + 1  # the window: starts p.., ends ..last
        segments += [(p, first, first + 1), (p, first, last), (p, last - 1, last)]
        segments += [(p, *sorted(rng.sample(range(first, last + 1), 2))) for _ in range(12)]
    p, a, b = (np.array(x) for x in zip(*segments, strict=True))
    dp_margin = np.min([bound.capacity[p] - bound.segment_bytes(p, a, b) for bound in t.memory], axis=0)
    reference = ref_memory_margins(cm, s, segments)
    scale = 1e-9 * np.maximum(1.0, np.abs(reference).max())
    tied = np.array([bool(cm.model.tied_duplicates(range(a, b))) for _, a, b in segments])
    assert not tied.any() or ((a[tied] == 0).all() and (b[tied] >= L - 1).all())
    assert np.all(dp_margin[tied] <= reference[tied] + scale)  # conservative: the tied weight counted twice
    if s.gas > 1 or s.schedule == "interleaved":
        assert np.allclose(dp_margin[~tied], reference[~tied], rtol=0, atol=scale)
    else:  # conservative: by at most one layer's backward working set
        assert np.all(dp_margin[~tied] <= reference[~tied] + scale)
        work = max(recompute_working_bytes(cm.model, range(L), s.tp, s.mbs, 4, s.recompute_at(j))
                   for j in range(s.pp))
        assert np.all(reference[~tied] - dp_margin[~tied] <= work + scale)


def test_equal_cost_signatures_cost_the_same():
    """Placements that swap identical blocks have one signature and identical costs; the local search's skipping of
    such placements leaves the search result unchanged."""
    cluster, model = three_types(), load_model("gpt3-1.3b")
    cm = CostModel(cluster, model)
    base = Strategy(pp=3, dp=2, tp=4, mbs=1, gbs=32, placement=tuple(range(24)))
    swapped = list(range(24))
    swapped[8:16], swapped[16:24] = swapped[16:24], swapped[8:16]  # stages 1 and 2: A100 nodes ↔ V100 nodes
    within = list(range(24))
    within[8:12], within[12:16] = within[12:16], within[8:12]  # stage 1's two A100 nodes: same links and types
    sig = cm.cost_signature
    assert sig(base) == sig(replace(base, placement=tuple(within))) != sig(replace(base, placement=tuple(swapped)))
    for part in ((0, 1, 20, 26), (0, 10, 20, 26), (0, 12, 13, 26)):
        a = cm.estimate(replace(base, partition=part))
        b = cm.estimate(replace(base, partition=part, placement=tuple(within)))
        assert (a.iteration_s, a.memory_bytes_per_stage, a.fits) == (b.iteration_s, b.memory_bytes_per_stage, b.fits)

    def ranked(result):
        return [(c.placement_name, c.estimate.iteration_s, c.strategy) for c in result.ranked]

    opts = SearchOptions(gbs=32, local_search=3)
    fast = search(cluster, model, None, opts)
    original = CostModel.cost_signature
    try:
        CostModel.cost_signature = lambda self, s: None  # type: ignore[method-assign]  # no skipping
        slow = search(cluster, model, None, opts)
    finally:
        CostModel.cost_signature = original  # type: ignore[method-assign]
    assert ranked(fast) == ranked(slow) and fast.candidates == slow.candidates


def test_estimates_hold_one_value_object_per_class():
    """Per-replica and per-device tuples share their entries, so holding many estimates of a large cluster stays
    cheap: the replicas of one class share one row tuple, the devices of one (stage, type) one int."""
    cm = CostModel(three_types(), load_model("gpt3-1.3b"))
    e: Estimate = cm.estimate(Strategy(pp=2, dp=3, tp=4, mbs=1, gbs=24))
    assert len({id(row) for row in e.fwd_s}) <= len(set(e.fwd_s))
    assert len({id(x) for x in e.memory_bytes_per_device}) <= 2 * 3


def test_swapped_layouts_equal_fresh_ones():
    """The local search derives each neighbour's device maps from the current placement's (``swap_stages``): every
    array and per-stage tuple equals :func:`device_layout` of the swapped placement, on random placements."""
    from ampe.costmodel.layout import device_layout, swap_stages
    from ampe.search.placement import Placement, swaps

    rng = random.Random(7)
    for cm, s in CASES[1::2]:
        if s.pp < 2 or s.placement is None:
            continue
        lay = cm.layout(s)
        for a, b, nb in swaps(Placement(s.placement, "p"), s.pp, s.dp, s.tp):
            if rng.random() > 0.5:
                continue
            got = swap_stages(lay, a, b)
            want = device_layout(cm.cluster, cm.device_types(), s.pp, s.dp, s.tp, nb.devices)
            for name in ("grid", "types", "pace", "tp_ring", "dp_ring", "next_link", "replica_class",
                         "class_replica"):
                assert np.array_equal(getattr(got, name), getattr(want, name)), (name, s, a, b)
                assert getattr(got, name).dtype == getattr(want, name).dtype
            assert (got.stage_types, got.stage_pace, got.stage_pairs) == (want.stage_types, want.stage_pace,
                                                                        want.stage_pairs)


@pytest.mark.parametrize("zero", [0, 1])
def test_memory_does_not_depend_on_what_the_cost_model_costed_before(zero):
    """The cached per-layer states: at bf16 without ZeRO they depend on dp too (BF16_Optimizer's fp32 states), so
    dp 4 costed after dp 1 must be what a fresh cost model says (it was dp 1's states while the key left dp out)."""
    cluster, model = load_cluster(SPECS / "mixed-a100-a40.yaml"), load_model("gpt2", dtype="bf16")
    dp1 = Strategy(pp=1, dp=1, tp=1, mbs=1, gbs=8, zero=zero)
    dp4 = Strategy(pp=1, dp=4, tp=1, mbs=1, gbs=8, zero=zero)
    warm = CostModel(cluster, model)
    warm.estimate(dp1)
    after, fresh = warm.estimate(dp4), CostModel(cluster, model).estimate(dp4)
    assert [m.allocated for m in after.memory_breakdown] == [m.allocated for m in fresh.memory_breakdown]
    assert after.memory_breakdown[0].states < warm.estimate(dp1).memory_breakdown[0].states
    want = stage_tables(CostModel(cluster, model), fresh.strategy).memory
    got = stage_tables(warm, after.strategy).memory
    assert all(np.array_equal(a.head, b.head) and np.array_equal(a.tail, b.tail)
               for a, b in zip(got, want, strict=True))
