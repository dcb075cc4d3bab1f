"""The layer-assignment DP's memory constraint is the estimate's (:mod:`ampe.costmodel.dp_memory`): on real cluster
specs with zoo models the DP never accepts a partition the estimate says does not fit, accepts every one it says
fits (up to the cases the bounds state as conservative), and no partition that fits per the estimate beats the DP's
choice — every partition enumerated; and on every segment of the memory model's cases (frozen layers, fp32, bf16,
the all-reduce's and ZeRO-1's optimizer-step peaks, per-stage recomputation, GPipe, gas = 1, interleaved chunks)
the bounds leave the room ``stage_memory`` leaves."""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from ampe.costmodel.cluster import load_cluster
from ampe.costmodel.estimate import CostModel
from ampe.costmodel.memory import allocatable_bytes, recompute_working_bytes, stage_memory
from ampe.costmodel.strategy import Strategy, complete, with_stage_recompute
from ampe.costmodel.tables import stage_tables
from ampe.costmodel.zoo import load_model
from ampe.dp_assign import evaluate_partition, solve
from ampe.dp_assign.brute import all_partitions
from ampe.dp_assign.costs import stage_choice
from ampe.search.engine import option_costs, stage_costs

SPECS = Path(__file__).resolve().parents[2] / "cluster_specs"


def _segment_margin(cm: CostModel, s: Strategy, j: int, a: int, b: int, rec: str, margin: bool = True) -> float:
    """The least room (bytes) ``stage_memory`` leaves on device stage j's devices holding layers a..b-1 under
    ``rec``, each GPU type on its own: allocatable − allocated (one chunk's share of it, interleaved); ``margin``:
    allocatable leaving the reserve free (the estimate's ``fits``), else within capacity."""
    least = np.inf
    for t in cm.stage_types(s)[j]:
        gpu = cm.device_types().gpus[t]
        mem = stage_memory(cm.model, range(a, b), j, s.pp, s.tp, s.mbs, s.gas, gpu, s.schedule, s.virtual_stages,
                           layer_states=cm.layer_states(s.tp, s.zero, s.dp),
                           layer_acts=cm.layer_activations(gpu, s.tp, s.mbs, rec), recompute=rec, zero=s.zero,
                           dp=s.dp, expandable=s.expandable_segments)
        room = (allocatable_bytes(gpu, s.expandable_segments, margin) - gpu.workspace_bytes) / s.virtual_stages
        least = min(least, room - (mem.allocated - mem.workspace))
    return least


# (spec, model, strategy fields, recomputation options per stage): memory binds in each (some partitions do not fit)
REAL = [
    ("perseus-a40-8.yaml", "gpt3-2.7b", dict(pp=4, dp=2, tp=1, mbs=4, gbs=1024), ("selective",)),
    ("perseus-a40-8.yaml", "gpt3-2.7b", dict(pp=4, dp=2, tp=1, mbs=2, gbs=512), ("none", "selective", "full")),
    ("amp-het-cluster.yaml", "gpt2-amp", dict(pp=4, dp=4, tp=1, mbs=4, gbs=256), ("none",)),
    ("mixed-a100-a40.yaml", "gpt3-6.7b", dict(pp=4, dp=6, tp=1, mbs=2, gbs=96), ("none", "full")),
    ("mixed-a100-a40.yaml", "gpt3-6.7b", dict(pp=4, dp=6, tp=1, mbs=8, gbs=96, zero=1), ("none", "full")),
    ("perseus-a40-16.yaml", "llama-3.2-3b", dict(pp=4, dp=4, tp=1, mbs=4, gbs=256), ("none", "full")),
    ("consumer-mixed-1g.yaml", "gpt2-large", dict(pp=4, dp=4, tp=1, mbs=4, gbs=64), ("none", "full")),
]


@pytest.mark.parametrize("case", range(len(REAL)))
def test_the_dp_fits_exactly_what_the_estimate_fits(case):
    """Within capacity (``margin=False``: the estimate's ``within_capacity``, at risk included) for odd cases, with
    the reserve left free (the search's first tables: the estimate's ``fits``) for even ones."""
    spec, name, fields, recs = REAL[case]
    margin = case % 2 == 0
    cluster, model = load_cluster(SPECS / spec), load_model(name)
    cm = CostModel(cluster, model)
    base = Strategy(placement=tuple(range(cluster.size)), recompute=recs[0], **fields)
    costs = (option_costs(cm, base, recs, margin=margin) if len(recs) > 1
             else stage_costs(cm, base, margin=margin))
    L = model.num_layers
    parts = np.array(list(all_partitions(L, base.pp)))
    dp_fits = stage_choice(costs, parts)[2]
    # the estimate's: a stage fits when some option leaves room on all its devices (one stage_memory per segment)
    margins = {(j, a, b): max(_segment_margin(cm, base, j, a, b, r, margin) for r in recs)
               for p in parts for j, (a, b) in enumerate(itertools.pairwise(p))}
    room = np.array([[margins[j, a, b] for j, (a, b) in enumerate(itertools.pairwise(p))] for p in parts])
    est_fits = (room >= 0).all(axis=1)
    near = (np.abs(room) <= 1e-9 * 2**40).any(axis=1)  # within rounding of a capacity: either answer is right
    tied = np.array([bool(model.tied_duplicates(range(p[0], p[1]))) for p in parts])  # stated conservative
    assert not (dp_fits & ~est_fits & ~near).any()  # never an OOM
    assert (dp_fits == est_fits)[~near & ~tied].all()  # and nothing that fits left out
    assert 0 < est_fits.sum() < len(parts)  # memory binds
    best = solve(costs, "full", top=4)
    fitting = [evaluate_partition(costs, tuple(p)).full_s for p, ok in zip(parts, est_fits & ~near, strict=True)
               if ok]
    assert best.best is not None and best.best.full_s <= min(fitting) * (1 + 1e-12)
    for a in best.assignments:  # the DP's partitions fit per the estimate itself
        s = replace(base, partition=a.partition)
        if len(recs) > 1:
            s = with_stage_recompute(s, (recs[o] for o in a.options))
        assert cm.estimate(s).fits if margin else cm.estimate(s).within_capacity


def _tiny_frozen() -> tuple[CostModel, list[Strategy]]:
    model = load_model("gpt2-tiny-8").with_frozen_prefix(4)  # fp32; the embedding frozen, its tied head trains
    cm = CostModel(load_cluster(SPECS / "local-cpu-4.yaml"), model)
    return cm, [Strategy(pp=2, dp=2, tp=1, mbs=2, gbs=16), Strategy(pp=4, dp=1, tp=1, mbs=1, gbs=1),
                Strategy(pp=2, dp=2, tp=1, mbs=1, gbs=8, zero=1, recompute="full")]


def _variety() -> list[tuple[CostModel, Strategy]]:
    """The memory model's cases on real specs: fp32 with frozen layers and ZeRO-1 (its bucket constant), gas = 1
    (every micro-batch in flight), bf16 with per-stage recomputation, fp16 data-parallel (the all-reduce's peak),
    GPipe, interleaved chunks."""
    cm, tiny = _tiny_frozen()
    out = [(cm, s) for s in tiny]
    a40 = CostModel(load_cluster(SPECS / "perseus-a40-8.yaml"), load_model("gpt3-1.3b"))
    out += [(a40, Strategy(pp=2, dp=4, tp=1, mbs=2, gbs=64)),
            (a40, Strategy(pp=4, dp=2, tp=1, mbs=4, gbs=32, schedule="gpipe", recompute="selective")),
            (a40, Strategy(pp=2, dp=2, tp=2, mbs=2, gbs=32, schedule="interleaved", virtual_stages=2)),
            (a40, Strategy(pp=8, dp=1, tp=1, mbs=8, gbs=8))]
    llama = CostModel(load_cluster(SPECS / "mixed-h100-a100.yaml"), load_model("llama-3.2-1b"))
    out += [(llama, with_stage_recompute(Strategy(pp=4, dp=4, tp=2, mbs=4, gbs=64, zero=1),
                                         ("full", "selective", "none", "none"))),
            (llama, Strategy(pp=2, dp=16, tp=1, mbs=8, gbs=128))]
    return out


VARIETY = _variety()


@pytest.mark.parametrize("case", range(len(VARIETY)))
def test_bounds_leave_the_room_stage_memory_leaves_on_every_segment(case):
    cm, strategy = VARIETY[case]
    s = complete(strategy, cm.model.num_layers)
    bounds = stage_tables(cm, s).memory
    L, n_pos = cm.model.num_layers, s.pp * s.virtual_stages
    w = L - n_pos + 1
    segments = [(p, a, b) for p in range(n_pos) for a in range(p, p + w) for b in range(a + 1, p + w + 1)]
    p, a, b = (np.array(x) for x in zip(*segments, strict=True))
    dp_margin = np.min([bound.capacity[p] - bound.segment_bytes(p, a, b) for bound in bounds], axis=0)
    reference = np.array([_segment_margin(cm, s, q % s.pp, x, y, s.recompute_at(q % s.pp)) for q, x, y in segments])
    scale = 1e-9 * np.abs(reference).max()
    tied = np.array([bool(cm.model.tied_duplicates(range(x, y))) for _, x, y in segments])
    assert np.all(dp_margin[tied] <= reference[tied] + scale)
    exact = ~tied
    if s.gas == 1:  # stated: over by at most one layer's working set
        work = max(recompute_working_bytes(cm.model, range(L), s.tp, s.mbs, 4, r) for r in ("none", s.recompute))
        assert np.all(dp_margin[exact] <= reference[exact] + scale)
        assert np.all(reference[exact] - dp_margin[exact] <= work + scale)
        exact &= np.isclose(dp_margin, reference, rtol=0, atol=scale)
        assert exact.sum() > len(segments) / 2  # the rest: exact
    assert np.allclose(dp_margin[exact], reference[exact], rtol=0, atol=scale)
