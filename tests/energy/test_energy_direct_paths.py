"""The shortcuts behind the direct point: float spending, warm-started LPs, the batched option search and the
topological order, each against what it replaces."""

from __future__ import annotations

import graphlib
import random
from types import SimpleNamespace

import numpy as np
import pytest

from ampe.energy.pipeline_dag import _static_order
from ampe.tradeoff import evaluate
from ampe.tradeoff.direct import WarmStarts, point_by, relaxed_plan
from ampe.tradeoff.evaluate import OptionTable, evaluate_batch, fastest_choice, polish_batch, spend_float
from tests.energy.energy_support import random_dag


@pytest.mark.parametrize("seed", range(6))
def test_spending_float_never_lengthens_and_never_costs_more(seed):
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, 4, 10, 6, transfers=seed % 2 == 0, schedule="1f1b" if seed % 3 else "gpipe")
    table = OptionTable.of(dag)
    t_max = float(evaluate_batch(dag, table, fastest_choice(dag)[None, :])[0][0])
    for deadline in (t_max, 1.03 * t_max):
        start = polish_batch(dag, table, fastest_choice(dag)[None, :])
        spent = spend_float(dag, table, start, deadline)
        _, _, eff0 = evaluate_batch(dag, table, start)
        t1, _, eff1 = evaluate_batch(dag, table, spent)
        assert t1[0] <= deadline * (1 + 1e-12)
        assert eff1[0] <= eff0[0] + 1e-9
    # with room to spare it does slow something down (the test can fail)
    assert eff1[0] < eff0[0]


@pytest.mark.parametrize("seed", range(4))
def test_warm_started_lp_reaches_the_cold_optimum(seed):
    """LPs of one structure with other numbers (here: other deadlines) solved from the stored basis reach the cold
    solve's optimum, and their plans meet the deadline."""
    rng = np.random.default_rng(seed)
    dag = random_dag(rng, 3, 8, 5, transfers=True)
    table = OptionTable.of(dag)
    t_max = float(evaluate_batch(dag, table, fastest_choice(dag)[None, :])[0][0])
    warm = WarmStarts()
    for factor in (1.0, 1.01, 1.05, 1.0):
        hot = relaxed_plan(dag, table, t_max * factor, warm)
        cold = relaxed_plan(dag, table, t_max * factor)
        assert hot is not None and cold is not None
        # same optimum (costs through the hull, as the LP sees them)
        assert _relaxed_cost(dag, table, hot[0]) == pytest.approx(_relaxed_cost(dag, table, cold[0]), rel=1e-7)
        _, ev = point_by(dag, t_max * factor, table, warm)
        assert ev.time_s <= t_max * factor * (1 + 1e-12)
    assert len(warm.bases) == 1  # one structure, one stored basis


def _relaxed_cost(dag, table, durations) -> float:
    from ampe.tradeoff.direct import _hull

    total = 0.0
    for v in range(len(dag.nodes)):
        times, ids = table.row_pareto[int(table.row_of[v])]
        if not dag.is_computation(v) or len(times) < 2:
            continue
        ht, hc = _hull(times, table.row_effective_j[int(table.row_of[v]), ids])
        total += float(np.interp(durations[v], ht, hc))
    return total


def test_option_search_at_once_equals_the_binary_searches(monkeypatch):
    rng = np.random.default_rng(7)
    dag = random_dag(rng, 4, 12, 7, transfers=True)
    table = OptionTable.of(dag)
    nodes = evaluate._movable(dag, table)
    base = np.tile(fastest_choice(dag), (5, 1))
    limit = rng.uniform(0.0, 0.08, size=(5, len(nodes)))
    a, b = base.copy(), base.copy()
    changed_a = evaluate._slow_within(table, a, nodes, limit)
    monkeypatch.setattr(evaluate, "_COMPARE_AT_ONCE", 0)  # force the per-row binary searches
    changed_b = evaluate._slow_within(table, b, nodes, limit)
    assert changed_a == changed_b and np.array_equal(a, b)
    assert not np.array_equal(a, base)


def test_topological_order_is_graphlibs():
    rnd = random.Random(3)
    for _ in range(200):
        n = rnd.randint(1, 40)
        rank = list(range(n))
        rnd.shuffle(rank)
        preds = [{p for p in rnd.sample(range(n), min(3, n)) if rank[p] < rank[v]} for v in range(n)]
        assert _static_order(preds) == list(graphlib.TopologicalSorter(dict(enumerate(preds))).static_order())
    assert len(_static_order([{1}, {0}])) < 2  # a cycle leaves nodes out


@pytest.mark.parametrize("seed", range(4))
def test_incremental_longest_path_matches_a_fresh_one(seed):
    """After every single-node change (transfers, whose one predecessor is recomputed inline, included) the kept
    finishes and path equal a pass from scratch."""
    from ampe.tradeoff.evaluate import LongestPath, critical_path, earliest

    rng = np.random.default_rng(seed)
    dag = random_dag(rng, 4, 9, 4, transfers=True, schedule="gpipe" if seed % 2 else "1f1b")
    times = [float(x) for x in rng.uniform(0.01, 0.05, len(dag.nodes))]
    kept = LongestPath(dag, times)
    for _ in range(60):
        v = int(rng.integers(len(times)))
        times[v] = float(rng.uniform(0.0, 0.06))
        kept.set_time(v, times[v])
        assert kept.path() == critical_path(dag, times)
        assert np.allclose(kept.ef, earliest(dag, np.asarray([times]))[1][0], rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="NaN"):
        kept.set_time(0, float("nan"))
    with pytest.raises(ValueError, match="NaN"):
        LongestPath(dag, [float("nan"), *times[1:]])


def test_lp_solves_refuse_non_finite_models_and_retry_a_failed_warm_start_cold():
    """HiGHS reports "optimal" on a model it refused (a NaN bound): such a solve is no solution. A stored basis that
    does not fit (here: another LP's) fails the warm start, and the LP is solved again cold."""
    from scipy.sparse import csc_array

    from ampe.tradeoff import direct

    a = csc_array(np.array([[1.0, 1.0], [1.0, -1.0]]))
    c, rhs, ub = np.array([-1.0, -1.0]), np.array([1.0, 1.0]), np.array([1.0, np.inf])
    assert direct._highs_lp_solve(c, a, np.array([np.nan, 1.0]), ub, None) is None
    assert direct._highs_lp_solve(c, a, rhs, np.array([np.nan, 3.0]), None) is None
    cold = direct._highs_lp_solve(c, a, rhs, ub, None)
    assert cold is not None and c @ cold == pytest.approx(-1.0)
    other = csc_array(np.array([[1.0, 1.0, 1.0], [1.0, -1.0, 0.0], [0.0, 1.0, 1.0]]))
    warm = direct.WarmStarts()
    direct._highs_lp_solve(np.array([-1.0, -1.0, -1.0]), other, np.ones(3), np.array([1.0, np.inf, 1.0]), warm)
    (stray,) = warm.bases.values()
    warm.bases[(2, 2, a.indptr.tobytes(), a.indices.tobytes())] = stray  # the key of a's structure, a wrong basis
    hs = direct._highs_classes()
    assert direct._highs_classes_solve(hs, c, a, rhs, ub, warm, False) is None  # the warm start itself fails
    again = direct._highs_lp_solve(c, a, rhs, ub, warm)
    assert again is not None and c @ again == pytest.approx(-1.0)


@pytest.mark.parametrize("seed", range(3))
def test_lp_passed_as_arrays_equals_the_lp_passed_as_a_highs_lp(seed):
    """The arrays overload (bindings that lack it fall back to a HighsLp) hands HiGHS the same LP: same optimum,
    same solution, on the relaxation of a random pipeline."""
    from scipy.sparse import csc_array

    from ampe.tradeoff import direct

    hs = direct._highs_classes()
    rng = np.random.default_rng(seed)
    m, n = 12, 9
    a = csc_array(np.where(rng.random((m, n)) < 0.4, rng.normal(size=(m, n)), 0.0))
    c, rhs = rng.normal(size=n), rng.random(m) + 0.5
    ub = np.where(c > 0, np.inf, rng.random(n) + 0.5)  # unbounded above only where that cannot pay
    # the arrays overload must be taken here (these bindings have it): no HighsLp to fall back to
    no_lp = SimpleNamespace(**{k: getattr(hs, k) for k in ("MatrixFormat", "ObjSense", "kHighsInf")})
    solutions = []
    for arrays in (True, False):
        highs = hs._Highs()
        options = hs.HighsOptions()
        options.output_flag = False
        highs.passOptions(options)
        assert direct._pass_model(no_lp if arrays else hs, highs, c, a, rhs, ub, arrays) != hs.HighsStatus.kError
        highs.run()
        assert highs.getModelStatus() == hs.HighsModelStatus.kOptimal
        solutions.append(np.asarray(highs.getSolution().col_value))
    assert np.array_equal(solutions[0], solutions[1])


@pytest.mark.parametrize("seed", range(6))
def test_fitting_one_choice_node_by_node_matches_the_level_passes(seed):
    """fit_deadlines / fit_releases of a single choice (plain Python, node by node) give what the level passes give
    for the same choice inside a batch, on deadlines and releases that are tight, loose and (some) unmeetable."""
    from ampe.tradeoff.evaluate import earliest, fit_deadlines, fit_releases, latest

    rng = np.random.default_rng(seed)
    dag = random_dag(rng, 3 + seed % 3, 5 + seed, 5, transfers=seed % 2 == 0,
                     schedule="gpipe" if seed % 3 == 2 else "1f1b")
    table = OptionTable.of(dag)
    n = len(dag.nodes)
    cur = np.array([rng.integers(table.num_options[v]) for v in range(n)])
    other = fastest_choice(dag)
    batch = np.stack([cur, other])
    times = table.time_s[np.arange(n), batch]
    es, ef = earliest(dag, times)
    end = ef.max(axis=1) * 1.02
    _, lf = latest(dag, times, end)
    changed = 0
    for scale in (1.0, 1.01, 0.99):
        deadline = ef * scale + rng.uniform(0.0, 0.002, ef.shape)
        both = fit_deadlines(dag, table, batch, deadline)
        assert np.array_equal(fit_deadlines(dag, table, batch[:1], deadline[:1])[0], both[0])
        release = es * scale - rng.uniform(0.0, 0.002, es.shape)
        back = fit_releases(dag, table, batch, release, end)
        assert np.array_equal(fit_releases(dag, table, batch[:1], release[:1], end[:1])[0], back[0])
        changed += int((both[0] != cur).sum() + (back[0] != cur).sum())
        assert np.array_equal(fit_deadlines(dag, table, batch[1:], lf[1:])[0],
                              fit_deadlines(dag, table, batch, lf)[1])
    assert changed  # the passes did move options (the test can fail)


def test_dags_sharing_a_shape_equal_dags_built_afresh():
    """A DAG whose shape was cached by another (other option sets, other transfer-spec sharing) is the DAG built
    with an empty cache: nodes with their specs, predecessors, orders, levels."""
    from ampe.energy import pipeline_dag as dag_module
    from ampe.tradeoff.options import constant

    specs = [{"forward": constant(0.01 * (v + 1)), "backward": constant(0.02)} for v in range(4)]

    def build(p2p):
        d = dag_module.build_dag(specs, 6, blocking_w=[1.0] * 4, p2p_forward_s=p2p)
        for v, x in enumerate(d.nodes):  # every transfer carries its own link's seconds
            if x.kind == dag_module.TRANSFER:
                sent_by = d.nodes[d.preds[v][0]]
                link = x.stage if sent_by.kind == "forward" else x.stage - 1
                assert d.specs[x.spec].options[0].time_s == p2p[link] and d.spec_of[v] == x.spec
        return (d.nodes, d.preds, d.stage_order, [s.options for s in d.specs], d.spec_of.tolist(), d.succs,
                [(lv.nodes.tolist(), lv.preds.tolist()) for lv in d.levels.levels])

    patterns = ([0.001, 0.001, 0.001], [0.001, 0.002, 0.001], [0.003, 0.002, 0.001], [0.0, 0.002, 0.002])
    dag_module._shape.cache_clear()
    fresh = []
    for p in patterns:
        fresh.append(build(p))
        dag_module._shape.cache_clear()
    for p in patterns:  # now every DAG after the first of each shape comes from the cache
        build(p)
    assert [build(p) for p in patterns] == fresh
    assert dag_module._shape.cache_info().hits > 0
    assert len({len(f[3]) for f in fresh}) > 1  # the patterns share transfer specs differently


@pytest.mark.parametrize("seed", range(3))
def test_csc_built_with_numpy_is_scipys_csc_of_the_same_entries(seed):
    """The LP's matrix is built without scipy.sparse: the same arrays as scipy's COO → CSC (repeated positions summed,
    zeros dropped, rows sorted), on entries like the LP's (±1 pairs that cancel, other repeats, explicit zeros)."""
    from scipy.sparse import coo_array, csc_array

    from ampe.tradeoff.direct import csc_from_entries

    rng = np.random.default_rng(seed)
    m, n, k = 15, 11, 60
    rows, cols = rng.integers(0, m, k), rng.integers(0, n - 2, k)  # the last two columns stay empty
    vals = rng.choice([1.0, -1.0, 0.0, 3.0, -7.0], k)
    rows, cols, vals = np.concatenate([rows, rows[:9]]), np.concatenate([cols, cols[:9]]), np.concatenate(
        [vals, -vals[:9]])  # nine positions that cancel
    ours = csc_from_entries(rows, cols, vals, (m, n))
    theirs = csc_array(coo_array((vals, (rows, cols)), shape=(m, n)))
    theirs.sum_duplicates()
    theirs.eliminate_zeros()
    theirs.sort_indices()
    assert ours.shape == theirs.shape and len(ours.data) < k
    assert ours.indptr.dtype == ours.indices.dtype == np.int32 and ours.data.dtype == theirs.data.dtype
    for mine, scipys in ((ours.indptr, theirs.indptr), (ours.indices, theirs.indices), (ours.data, theirs.data)):
        assert np.array_equal(mine, scipys)


def test_lp_without_highs_classes_falls_back_to_linprog_on_the_same_matrix(monkeypatch):
    """scipy without the HiGHS classes: the matrix goes to linprog (cold), with the same optimum."""
    from ampe.tradeoff import direct

    a = direct.csc_from_entries(np.array([0, 0, 1, 1, 2]), np.array([0, 1, 0, 1, 2]),
                                np.array([1.0, 1.0, 1.0, -1.0, 1.0]), (3, 3))
    c, rhs, ub = np.array([-1.0, -2.0, -1.0]), np.array([1.0, 1.0, 2.0]), np.array([np.inf, 1.0, np.inf])
    with_classes = direct._highs_lp_solve(c, a, rhs, ub, None)
    monkeypatch.setattr(direct, "_highs_classes", lambda: None)
    without = direct._highs_lp_solve(c, a, rhs, ub, None)
    assert with_classes is not None and without is not None
    assert c @ without == pytest.approx(c @ with_classes) == pytest.approx(-4.0)


def test_highs_bindings_loaded_from_their_file_serve_a_later_scipy_optimize():
    """The bindings loaded without ``scipy.optimize`` (a fresh process: nothing of scipy imported before) are the
    module a later ``import scipy.optimize`` uses: one initialisation, and linprog's HiGHS still solves."""
    import subprocess
    import sys

    code = ("import sys\nfrom ampe.tradeoff import direct\nhs = direct._highs_classes()\n"
            "assert hs is not None and 'scipy.optimize' not in sys.modules and 'scipy.sparse' not in sys.modules\n"
            "from scipy.optimize import linprog\nimport scipy.optimize._highspy._core as again\n"
            "res = linprog([-1, -2], A_ub=[[1, 1]], b_ub=[1], bounds=[(0, None)] * 2, method='highs-ds')\n"
            "print(again is hs, res.status, res.x.tolist())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "0", "[0.0,", "1.0]"]
