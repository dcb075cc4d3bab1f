"""The exact assignment against brute force on random small instances (heterogeneous stages, links, memory, sync)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ampe.costmodel.bounds import MemoryBound
from ampe.dp_assign import (
    Bands,
    StageCosts,
    StageOption,
    bands,
    brute_force,
    evaluate_partition,
    reaches,
    reaches_bands,
    solve,
    stage_ceiling,
)


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate([np.zeros((values.shape[0], 1)), np.cumsum(values, axis=1)], axis=1)


def random_costs(rng: np.random.Generator, integer: bool, memory: bool, sync: bool,
                 max_layers: int = 12, max_stages: int = 5) -> StageCosts:
    """Stage-dependent layer times (each stage its own speed and per-layer noise), per-(boundary, cut) transfers,
    optional per-stage memory with random capacities (often infeasible) and per-stage sync rates."""
    num_layers = int(rng.integers(1, max_layers + 1))
    pp = int(rng.integers(1, max_stages + 1))
    gas = int(rng.choice([1, 2, 3, 4, 8, 32]))

    tiny = integer and rng.random() < 0.5  # small integers: many exact ties between partitions

    def draw(shape, hi):
        return rng.integers(0, (2 if tiny else hi) + 1, shape).astype(float) if integer else rng.random(shape) * hi

    speed = rng.choice([0.5, 1.0, 2.0, 3.0], size=(pp, 1))
    times = speed * draw((1, num_layers), 10) + draw((pp, num_layers), 2)
    transfer = draw((max(pp - 1, 0), num_layers + 1), 6)
    kwargs = {}
    if memory:
        kwargs["mem_prefix"] = _prefix(draw((pp, num_layers), 10))
        kwargs["mem_capacity"] = rng.uniform(0.4, 2.0, pp) * 5 * num_layers / pp + 5
    if sync:
        params = draw((1, num_layers), 8)
        kwargs["sync_prefix"] = _prefix(rng.choice([0.5, 1.0, 4.0], size=(pp, 1)) * params)
        if rng.random() < 0.5:  # per-stage tail constants (per-iteration framework work)
            kwargs["sync_s"] = draw((pp,), 4)
    if rng.random() < 0.5:  # per-stage constants (per-instruction overheads of the stage's device type)
        kwargs["stage_s"] = draw((pp,), 6)
    return StageCosts(_prefix(times), transfer, gas, **kwargs)


def assert_matches_brute_force(costs: StageCosts, objective: str) -> None:
    sol = solve(costs, objective, top=4)
    brute = brute_force(costs, objective)
    if not brute:
        assert not sol.feasible and sol.best is None and sol.reason
        return
    assert sol.feasible
    want = brute[0].objective(objective)
    got = sol.best.objective(objective)
    assert got == pytest.approx(want, rel=1e-12, abs=1e-12)
    # the returned partition is one of the optimal partitions, re-costed by the shared evaluator
    assert evaluate_partition(costs, sol.best.partition) == sol.best
    assert sol.best.fits
    optimal = {a.partition for a in brute if math.isclose(a.objective(objective), want, rel_tol=1e-12, abs_tol=1e-12)}
    assert sol.best.partition in optimal
    # alternatives: distinct, feasible, sorted, never better than the optimum
    parts = [a.partition for a in sol.assignments]
    assert len(parts) == len(set(parts))
    values = [a.objective(objective) for a in sol.assignments]
    assert values == sorted(values)
    assert all(a.fits for a in sol.assignments)


def with_options(rng: np.random.Generator, costs: StageCosts, integer: bool) -> StageCosts:
    """Add one or two per-stage options shaped like activation recomputation: each slower than the last (extra
    backward work per layer) and lighter in memory (a fraction of each layer's bytes), with a capacity cut by a
    working set, so a stage's choice depends on its layers."""
    pp, n = costs.pp, costs.num_layers
    mem = costs.mem_prefix if costs.mem_prefix is not None else np.zeros((pp, n + 1))
    cap = costs.mem_capacity if costs.mem_capacity is not None else np.full(pp, np.inf)
    if costs.mem_prefix is None:  # give the base memory too, so options matter
        mem = _prefix(rng.integers(0, 11, (pp, n)).astype(float))
        cap = rng.uniform(0.3, 1.5, pp) * 5 * n / pp + 3
        costs = replace(costs, mem_prefix=mem, mem_capacity=cap)
    layer_t = np.diff(costs.time_prefix, axis=1)
    layer_m = np.diff(mem, axis=1)
    opts = []
    t, m = layer_t, layer_m
    for _ in range(int(rng.integers(1, 3))):
        extra = rng.integers(0, 3, t.shape).astype(float) if integer else rng.random(t.shape) * 2
        t = t + extra
        m = np.floor(m * rng.uniform(0.1, 0.8)) if integer else m * rng.uniform(0.1, 0.8)
        opts.append(StageOption(_prefix(t), _prefix(m), cap - rng.integers(0, 4, pp)))
    return replace(costs, options=tuple(opts))


def random_bounds(rng: np.random.Generator, pp: int, n: int, integer: bool) -> tuple[MemoryBound, ...]:
    """One to three memory bounds shaped like the search's: each the largest of one to three operands (additive
    bytes, a term by the first layer, one by the end, some parts left out) plus, mostly, the largest of a per-layer
    working set, with capacities that make some segments and some instances infeasible. The first-layer terms often
    rise faster than the layers add (several runs of start columns for the memory check)."""

    def draw(shape, hi):
        return rng.integers(0, hi + 1, shape).astype(float) if integer else rng.random(shape) * hi

    out = []
    for _ in range(int(rng.integers(1, 4))):
        cap = rng.uniform(0.5, 2.0, pp) * (3 * n / pp + 12)
        if rng.random() < 0.2:
            cap[int(rng.integers(pp))] = np.inf
        peak = draw((pp, n), 10) if rng.random() < 0.7 else None
        parts = [MemoryBound.of(_prefix(draw((pp, n), 6)), cap, draw((pp, n + 1), 8) if rng.random() < 0.7 else None,
                                draw((pp, n + 1), 8) if rng.random() < 0.7 else None)
                 for _ in range(int(rng.integers(1, 4)))]
        out.append(MemoryBound(np.concatenate([b.head for b in parts]), np.concatenate([b.tail for b in parts]),
                               parts[0].capacity, peak))
    return tuple(out)


def with_bounds(rng: np.random.Generator, costs: StageCosts, integer: bool) -> StageCosts:
    """``costs`` with random memory bounds (:func:`random_bounds`) on option 0 and on each option."""
    pp, n = costs.pp, costs.num_layers
    opts = tuple(replace(o, memory=random_bounds(rng, pp, n, integer)) for o in costs.options)
    return replace(costs, memory=random_bounds(rng, pp, n, integer), options=opts)


@pytest.mark.parametrize("integer", [True, False])
def test_dp_assign_with_memory_bounds_matches_brute_force(integer):
    """Memory bounds with terms by the first layer and the end and a largest working set (the search's form): the
    DP's band mask answers as the evaluator's per-segment arithmetic, so its optimum equals brute force's, with and
    without per-stage options and the additive bound beside them; instances are often infeasible and the bounds
    often decide the optimum."""
    rng = np.random.default_rng(8200 + integer)
    infeasible = moved = 0
    for i in range(150):
        plain = random_costs(rng, integer, bool(i % 2), bool(rng.integers(2)))
        if rng.random() < 0.4:
            plain = with_options(rng, plain, integer)
        costs = with_bounds(rng, plain, integer)
        for objective in ("full", "eq5"):
            assert_matches_brute_force(costs, objective)
        got, free = solve(costs).best, solve(plain).best
        infeasible += got is None
        moved += got is not None and free is not None and got.partition != free.partition
    assert infeasible >= 10 and moved >= 10, (infeasible, moved)


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("sync", [False, True])
def test_dp_assign_with_per_stage_options_matches_brute_force(integer, sync):
    """Per-stage options (e.g. activation recomputation chosen per stage): the DP's optimum equals brute force, and
    each stage of the result runs its fastest option that fits."""
    rng = np.random.default_rng(7000 + 2 * integer + sync)
    mixed = 0
    for _ in range(150):
        costs = with_options(rng, random_costs(rng, integer, True, sync), integer)
        assert_matches_brute_force(costs, "full")
        assert_matches_brute_force(costs, "eq5")
        best = solve(costs, "full").best
        if best is not None:
            assert len(best.options) == costs.pp
            mixed += len(set(best.options)) > 1
    assert mixed >= 5  # the instances do exercise stages that choose differently


def test_per_stage_option_hand_computed():
    """Two stages of two layers, time 1 per layer and memory 3 per layer without the option; stage 0 holds 2
    micro-batches in flight (capacity 4 for 2 layers: needs the option), stage 1 has room (capacity 6). The option
    costs 0.5 s per layer and keeps 1 byte per layer. Stage 0 runs it, stage 1 does not."""
    time_prefix = _prefix(np.ones((2, 4)))
    mem_prefix = _prefix(np.array([[3.0] * 4, [3.0] * 4]) * np.array([[2.0], [1.0]]))  # stage 0: 2 in flight
    opt = StageOption(_prefix(np.full((2, 4), 1.5)), _prefix(np.array([[2.0] * 4, [1.0] * 4])), np.array([4.0, 6.0]))
    costs = StageCosts(time_prefix, None, gas=4, mem_prefix=mem_prefix, mem_capacity=np.array([4.0, 6.0]),
                       options=(opt,))
    sol = solve(costs, "eq5")
    # (0,2,4): stage 0 needs the option (12 > 4 bytes; 4 ≤ 4 with it): t = 3; stage 1: 6 ≤ 6, t = 2 → 3·3 + 5 = 14
    # (0,1,4): stage 0 without (6 > 4) → option: 1.5; stage 1 three layers 9 > 6 → option: 4.5 → 3·4.5 + 6 = 19.5
    # (0,3,4): stage 0 with the option 12 > 4: does not fit
    assert sol.best.partition == (0, 2, 4)
    assert sol.best.options == (1, 0)
    assert sol.best.stage_s == (3.0, 2.0)
    assert sol.best.eq5_s == pytest.approx(14.0)
    assert [a.partition for a in brute_force(costs, "eq5")] == [(0, 2, 4), (0, 1, 4)]


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("memory", [False, True])
@pytest.mark.parametrize("sync", [False, True])
def test_dp_assign_matches_brute_force_on_seeded_instances(integer, memory, sync):
    rng = np.random.default_rng(1000 + 4 * integer + 2 * memory + sync)
    for _ in range(120):
        costs = random_costs(rng, integer, memory, sync)
        assert_matches_brute_force(costs, "full")
        assert_matches_brute_force(costs, "eq5")


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), integer=st.booleans(), memory=st.booleans(), sync=st.booleans())
def test_dp_assign_matches_brute_force_property(seed, integer, memory, sync):
    costs = random_costs(np.random.default_rng(seed), integer, memory, sync)
    assert_matches_brute_force(costs, "full")


@pytest.mark.parametrize("integer", [True, False])
def test_blocking_transfers_match_brute_force(integer):
    """With transfers that hold both stages they join (DeepSpeed's 1F1B), the bottleneck is t_j + e_{j-1} + e_j:
    the DP's optimum, its answers to ``reaches`` (also on band rows cut at the stage ceiling, as the search's branch
    and bound stacks them) equal brute force's, forbidden cuts and per-stage options included."""
    rng = np.random.default_rng(9500 + integer)
    differs = 0
    for _ in range(180):
        costs = random_costs(rng, integer, bool(rng.integers(2)), bool(rng.integers(2)))
        if rng.random() < 0.3:
            costs = with_options(rng, costs, integer)
        if rng.random() < 0.2:
            costs = with_bounds(rng, costs, integer)
        if costs.pp > 1 and rng.random() < 0.2:
            costs = replace(costs, transfer=np.where(rng.random(costs.transfer_s.shape) < 0.2, np.inf,
                                                     costs.transfer_s))
        blocking = replace(costs, blocking=True)
        for objective in ("full", "eq5"):
            assert_matches_brute_force(blocking, objective)
        brute = brute_force(blocking, "full")
        if not brute:
            continue
        opt = brute[0].full_s
        overlapped = brute_force(costs, "full")[0]
        assert opt >= overlapped.full_s - 1e-9  # it charges at least what the overlapped form does
        differs += brute[0].partition != overlapped.partition
        b = bands(blocking)
        for limit in (opt * (1 - 1e-6) - 1e-6, opt * (1 + 1e-6) + 1e-6, opt / 2, opt * 2 + 1):
            assert reaches(blocking, limit) == (opt >= limit), (limit, opt)
            if b.nonnegative:
                below = np.flatnonzero(b.seg_t.min(axis=(0, 2)) < stage_ceiling(limit, b.gas))
                rows = int(below[-1]) + 1 if len(below) else 0
                seg_y = b.seg_y[:, :rows] if isinstance(b.seg_y, np.ndarray) else None
                part = Bands(b.seg_t[:, :rows].copy(), seg_y, b.cut, b.gas, None, True, True)
                assert reaches_bands(part, limit) == (opt >= limit), (limit, opt)
    assert differs >= 10  # the charge does move the optimum


def test_blocking_transfers_by_hand():
    # 4 layers of 1 s on 2 stages, gas 3, cut 2 s before layer 1 or 3 and 0.5 s before layer 2: overlapped, the
    # balanced (0,2,4) costs 2·2 + 4 + 0.5 = 8.5; blocking, each stage is held 2 + 0.5: 2·2.5 + 4.5 = 9.5
    transfer = np.array([[0.0, 2.0, 0.5, 2.0, 0.0]])
    costs = StageCosts.uniform_stages([1, 1, 1, 1], pp=2, gas=3, transfer=transfer)
    assert solve(costs).best.partition == (0, 2, 4) and solve(costs).best.eq5_s == 8.5
    blocking = replace(costs, blocking=True)
    assert solve(blocking).best.eq5_s == 9.5
    assert evaluate_partition(blocking, (0, 1, 4)).eq5_s == 2 * (3 + 2) + 4 + 2 == 16


def test_seeded_instances_cover_infeasible_and_tied_cases():
    """The random generator must actually produce memory-infeasible instances and ties, or the tests prove little."""
    rng = np.random.default_rng(7)
    infeasible = feasible = ties = 0
    for _ in range(200):
        brute = brute_force(random_costs(rng, integer=True, memory=True, sync=False), "eq5")
        infeasible += not brute
        feasible += bool(brute)
        for sync, objective in ((False, "eq5"), (True, "full")):
            brute = brute_force(random_costs(rng, integer=True, memory=False, sync=sync), objective)
            ties += len(brute) > 1 and brute[0].objective(objective) == brute[1].objective(objective)
    assert infeasible >= 20 and feasible >= 100 and ties >= 15, (infeasible, feasible, ties)


def test_hand_computed_instance():
    # 4 layers [1, 2, 3, 4] s on two equal stages, gas 3, cut costs 0.5 everywhere:
    # cuts after 1, 2, 3 layers give stage times (1,9) (3,7) (6,4) → eq5 = 2·max + 10 + 0.5 = 28.5, 24.5, 22.5.
    costs = StageCosts.uniform_stages([1, 2, 3, 4], pp=2, gas=3, transfer=np.full((1, 5), 0.5))
    sol = solve(costs, top=3)
    assert sol.best.partition == (0, 3, 4)
    assert sol.best.eq5_s == 22.5 and sol.best.full_s == 22.5
    assert sol.best.stage_s == (6.0, 4.0) and sol.best.transfer_s == (0.5,)
    # with a sync term y = params, params [4, 0, 0, 0] → stage 1 sync 4 for every cut; params [0,0,0,8] → stage 2
    sync = StageCosts.uniform_stages([1, 2, 3, 4], pp=2, gas=3, transfer=np.full((1, 5), 0.5),
                                     layer_params=[0, 0, 9, 0])
    # cut after 2: sync max 9 → 24.5 + 9; cut after 3: 22.5 + 9; cut after 1: 28.5 + 9 → still (0,3,4)
    assert solve(sync).best.full_s == 31.5
    heavy = StageCosts.uniform_stages([1, 2, 3, 4], pp=2, gas=3, transfer=np.full((1, 5), 0.5),
                                      layer_params=[0, 0, 9, 0], sync_s_per_param=[1.0, 0.0])
    # the sync is free on stage 2, so moving layer 2 there wins: (0,2,4) = 24.5 + 0
    assert solve(heavy).best.partition == (0, 2, 4)
    assert solve(heavy, "eq5").best.partition == (0, 3, 4)


def test_heterogeneous_stages_get_fewer_layers_on_the_slow_stage():
    layer = np.ones(12)
    tp = _prefix(np.vstack([layer, 3 * layer]))  # stage 1 three times slower
    sol = solve(StageCosts(tp, np.zeros((1, 13)), gas=16))
    assert sol.best.partition == (0, 9, 12)  # 9 vs 3·3 = 9: balanced


def test_memory_infeasible_and_too_many_stages():
    tp = _prefix(np.ones((2, 4)))
    mem = _prefix(np.full((2, 4), 10.0))
    costs = StageCosts(tp, np.zeros((1, 5)), 2, mem_prefix=mem, mem_capacity=np.array([15.0, 15.0]))
    sol = solve(costs)
    assert not sol.feasible and "memory" in sol.reason and brute_force(costs) == []
    fits = StageCosts(tp, np.zeros((1, 5)), 2, mem_prefix=mem, mem_capacity=np.array([30.0, 10.0]))
    assert solve(fits).best.partition == (0, 3, 4)
    assert not solve(StageCosts(_prefix(np.ones((5, 4))), np.zeros((4, 5)), 1)).feasible


def test_forbidden_cuts_are_avoided():
    transfer = np.zeros((1, 7))
    transfer[0, 1:6] = [np.inf, np.inf, 0.0, np.inf, np.inf]
    costs = StageCosts.uniform_stages([1, 1, 1, 5, 1, 1], pp=2, gas=4, transfer=transfer)
    assert solve(costs).best.partition == (0, 3, 6)
    transfer[0, 3] = np.inf
    sol = solve(StageCosts.uniform_stages([1] * 6, pp=2, gas=4, transfer=transfer))
    assert not sol.feasible and "forbidden" in sol.reason


def test_single_stage_and_single_layer_stages():
    costs = StageCosts.uniform_stages([1, 2, 3], pp=1, gas=5)
    assert solve(costs).best.partition == (0, 3) and solve(costs).best.eq5_s == 4 * 6 + 6
    costs = StageCosts.uniform_stages([1, 2, 3], pp=3, gas=5)
    assert solve(costs).best.partition == (0, 1, 2, 3)


def test_invalid_inputs_are_rejected():
    with pytest.raises(ValueError):
        StageCosts(np.zeros((2, 5)), np.zeros((2, 5)), 1)  # transfer needs pp-1 rows
    with pytest.raises(ValueError):
        StageCosts(np.zeros((2, 5)), np.zeros((1, 5)), 0)
    with pytest.raises(ValueError):
        StageCosts(np.full((1, 3), np.nan), np.zeros((0, 3)), 1)
    with pytest.raises(ValueError):
        StageCosts(np.zeros((1, 3)), np.zeros((0, 3)), 1, mem_prefix=np.zeros((1, 3)))
    with pytest.raises(ValueError):
        evaluate_partition(StageCosts(np.zeros((2, 5)), np.zeros((1, 5)), 1), [0, 0, 4])
    with pytest.raises(ValueError):
        solve(StageCosts(np.zeros((1, 3)), np.zeros((0, 3)), 1), objective="energy")


@pytest.mark.parametrize("integer", [True, False])
@pytest.mark.parametrize("sync", [False, True])
def test_reaches_matches_brute_force(integer, sync):
    """``reaches(costs, limit)`` (the branch-and-bound test: is the optimum ≥ limit?) answers as brute force does
    for limits just below, at and just above the optimum and far from it, with per-stage options, memory bounds and,
    with a sync term, ``sync_once`` (a tail charged only to stages with sync work)."""
    rng = np.random.default_rng(9100 + 2 * integer + sync)
    checked = 0
    for _ in range(150):
        costs = random_costs(rng, integer, True, sync)
        if rng.random() < 0.5:
            costs = with_options(rng, costs, integer)
        if rng.random() < 0.3:  # the search's memory bounds (first layer, end, largest working set)
            costs = with_bounds(rng, costs, integer)
        if sync and rng.random() < 0.7:
            costs = replace(costs, sync_once=rng.integers(0, 4, costs.pp).astype(float))
        if rng.random() < 0.2:  # negative cut costs: no early stop (reaches solves exactly)
            costs = replace(costs, transfer=costs.transfer_s - 3)
        for objective in ("full", "eq5"):
            brute = brute_force(costs, objective)
            if not brute:
                assert reaches(costs, 0.0, objective) and reaches(costs, math.inf, objective)
                continue
            opt = brute[0].objective(objective)
            sol = solve(costs, objective)
            assert sol.best is not None and sol.best.objective(objective) == pytest.approx(opt, rel=1e-12, abs=1e-12)
            for limit in (opt * (1 - 1e-6) - 1e-6, opt * (1 + 1e-6) + 1e-6, opt / 2, opt * 2 + 1):
                assert reaches(costs, limit, objective) == (opt >= limit), (limit, opt)
            checked += 1
    assert checked > 100


@pytest.mark.parametrize("sync", [False, True])
def test_reaches_bands_on_the_rows_below_the_ceiling_answers_as_on_all(sync):
    """With every cost ≥ 0, ``reaches_bands`` on only the band rows (stage lengths) holding an entry below
    ``stage_ceiling(limit, gas)`` answers as on the whole tables (and as brute force), for limits around the
    optimum and far from it; some limits leave no row at all."""
    rng = np.random.default_rng(9300 + sync)
    truncated = 0
    for _ in range(150):
        costs = random_costs(rng, False, True, sync)
        if rng.random() < 0.5:
            costs = with_options(rng, costs, False)
        brute = brute_force(costs, "full")
        if costs.pp > costs.num_layers or not brute:
            continue
        opt = brute[0].objective("full")
        b = bands(costs)
        assert b.nonnegative
        for limit in (opt * (1 - 1e-6), opt * (1 + 1e-6), opt / 3, opt * 2 + 1, 1e-9):
            shortest = b.seg_t.min(axis=(0, 2))
            below = np.flatnonzero(shortest < stage_ceiling(limit, b.gas))
            rows = int(below[-1]) + 1 if len(below) else 0
            truncated += rows < b.seg_t.shape[1]
            seg_y = b.seg_y[:, :rows] if isinstance(b.seg_y, np.ndarray) else None
            part = Bands(b.seg_t[:, :rows].copy(), seg_y, b.cut, b.gas, shortest[:rows], True)
            whole = Bands(b.seg_t.copy(), b.seg_y, b.cut, b.gas, None, True)
            assert reaches_bands(part, limit) == reaches_bands(whole, limit) == (opt >= limit), (limit, opt)
    assert truncated > 50


def test_sync_once_is_charged_only_to_stages_with_sync_work():
    """Two stages; stage 1's only layer has no sync work: ``sync_once`` adds to stage 0's tail only."""
    costs = StageCosts(np.array([[0.0, 1, 2], [0, 1, 2]]), None, 1, sync_prefix=np.array([[0.0, 3, 3], [0, 3, 3]]),
                       sync_once=np.array([5.0, 7.0]))
    a = evaluate_partition(costs, (0, 1, 2))
    assert a.sync_s == (8.0, 0.0)
    assert a.full_s == 1 + 1 + 8
    assert solve(costs).best == a
    assert reaches(costs, 10.0) and not reaches(costs, 10.0 + 1e-9)


def test_bands_of_some_rows_equal_those_rows_of_all():
    """``bands(costs, rows=...)`` (what a caller caching per-stage slices computes on a miss) gives exactly the
    selected stages' slices of the whole tables, with options, memory, sync and ``sync_once``."""
    rng = np.random.default_rng(12)
    for _ in range(60):
        costs = with_options(rng, random_costs(rng, False, True, True), False)
        if costs.sync_prefix is not None:
            costs = replace(costs, sync_once=rng.random(costs.pp))
        if costs.pp > costs.num_layers:
            continue
        whole = bands(costs)
        rows = sorted(set(rng.integers(0, costs.pp, size=2).tolist()))
        part = bands(costs, rows=rows)
        np.testing.assert_array_equal(part.seg_t, whole.seg_t[rows])
        if whole.seg_y is not None:
            np.testing.assert_array_equal(part.seg_y, whole.seg_y[rows])
        np.testing.assert_array_equal(part.cut, whole.cut)
