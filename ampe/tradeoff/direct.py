"""One frontier point computed directly: the least-energy clocks that finish an iteration by a given time.

The whole frontier (Phillips–Dessouky from T* down to T_min) is only needed to trade time for energy; the time
objective needs its fastest point alone. :func:`point_by` solves the same convex relaxation at that one time
directly, as a linear program (HiGHS) in real seconds: every computation's cost is the lower convex hull of its
Pareto (time, effective energy) options, durations are continuous between its fastest and its cheapest option, and
the critical path must fit the deadline. The planned finish times then act as deadlines: every computation takes its
cheapest option that still finishes by its planned finish when started as early as the choices before it allow, and
the result is polished (computations slowed within their free float). Every option time is at most the planned
duration, so the plan never runs longer than the deadline; the all-max plan, polished, is kept when it is cheaper.
No τ, no quantization.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from ampe.tradeoff.dag import ComputationDag
from ampe.tradeoff.evaluate import (
    Evaluation,
    OptionTable,
    earliest,
    evaluate_batch,
    fastest_choice,
    fit_deadlines,
    polish_batch,
    spend_float,
)
from ampe.tradeoff.periodic import FOLD_FROM, Fold, periodic_fold
from ampe.tradeoff.repair import speed_up_through

_PIECES = 8  # most linear pieces per computation's cost in the LP (fewer constraints; exact at the kept vertices)
_REPAIR_MOVES = 64  # most greedy moves of the rounded-up candidate (each re-propagates the longest path)
_METHOD = "highs-ds"  # dual simplex: warm-startable (see WarmStarts); the fallback when scipy lacks HiGHS's classes
_CENTRAL_MAX = 256  # LPs of at most this many computations are also solved by interior point (see point_by)
_COLD_IPM_ROWS = 8192  # a cold LP with more rows: interior point + crossover (dual simplex grows faster with size:
# equal at 8 x 192, 1.5x slower at 16 x 384, measured), its basis kept for warm starts
_HIGHS_CORE = "scipy.optimize._highspy._core"  # scipy's HiGHS bindings (private; scipy >= 1.15)


@dataclass(frozen=True)
class CscMatrix:
    """A sparse matrix in compressed sparse column form, as HiGHS reads it: column j's entries are
    ``data[indptr[j]:indptr[j+1]]`` in rows ``indices[...]`` (ascending, each once, none zero). scipy's ``csc_array``
    has the same fields; building one here keeps ``scipy.sparse`` (~0.25 s CPU of imports) out of the search."""

    shape: tuple[int, int]
    indptr: np.ndarray
    indices: np.ndarray
    data: np.ndarray


def csc_from_entries(rows: np.ndarray, cols: np.ndarray, vals: np.ndarray, shape: tuple[int, int]) -> CscMatrix:
    """The matrix with ``vals`` at (``rows``, ``cols``), repeated positions summed, zero sums dropped: the same arrays
    as scipy's ``csc_array(coo_array(...))`` after ``sum_duplicates``, ``eliminate_zeros`` and ``sort_indices``
    (the numbers; the indices here are int32, as HiGHS takes them). Repeats are summed in the order given: the LP has
    at most two entries at one position (+1 and −1: a class's dependency on itself), a sum exact in either order.

    Args:
        rows, cols: each entry's row and column (non-negative ints, within ``shape``).
        vals: each entry's value.
        shape: (rows, columns) of the matrix.

    Returns:
        The matrix.
    """
    m, n = shape
    order = np.lexsort((rows, cols))  # by column, then row
    r, c, v = np.asarray(rows)[order], np.asarray(cols)[order], np.asarray(vals, dtype=np.float64)[order]
    start = np.ones(len(r), dtype=bool)
    start[1:] = (r[1:] != r[:-1]) | (c[1:] != c[:-1])
    heads = np.flatnonzero(start)
    sums = np.add.reduceat(v, heads) if len(heads) else np.zeros(0)
    keep = sums != 0
    r, c, sums = r[heads][keep], c[heads][keep], sums[keep]
    indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(np.bincount(c, minlength=n), out=indptr[1:])
    return CscMatrix((m, n), indptr, r.astype(np.int32), sums)


@dataclass
class WarmStarts:
    """Optimal simplex bases of the LPs solved so far, keyed by the LP's structure (rows, columns, sparsity):
    the replicas of one strategy (and strategies with the same pipeline shape) give LPs of one structure with other
    numbers, and their optimal bases are close — a warm-started dual simplex then needs 1–25 % of the iterations."""

    bases: dict[tuple, Any] = field(default_factory=dict)


def _highs_lp_solve(c: np.ndarray, a: CscMatrix, rhs: np.ndarray, ub: np.ndarray,
                    warm: WarmStarts | None, central: bool = False) -> np.ndarray | None:
    """min c·x, a·x ≤ rhs, 0 ≤ x ≤ ub with HiGHS's dual simplex, from a stored basis of an LP of the same structure
    where there is one (large cold LPs: interior point + crossover); ``central``: interior point without crossover
    instead (a point in the middle of the optimal face, not a vertex). None if not optimal. A warm start that does
    not end optimal is retried cold. Uses the HiGHS classes scipy ships (private; scipy without them falls back to
    linprog, cold, with crossover)."""
    hs = _highs_classes()
    if hs is None:
        from scipy.optimize import linprog
        from scipy.sparse import csc_array

        a_scipy = csc_array((a.data, a.indices, a.indptr), shape=a.shape)
        res = linprog(c, A_ub=a_scipy, b_ub=rhs, bounds=np.stack([np.zeros(len(ub)), ub], 1),
                      method="highs-ipm" if central else _METHOD)
        return res.x if res.status == 0 else None
    x = _highs_classes_solve(hs, c, a, rhs, ub, warm, central)
    if x is None and warm is not None and not central:
        x = _highs_classes_solve(hs, c, a, rhs, ub, None, central)
    return x


@lru_cache(maxsize=1)
def _highs_classes() -> Any:
    """scipy's HiGHS bindings (``scipy.optimize._highspy._core``, scipy ≥ 1.15) if they have what
    :func:`_highs_classes_solve` uses, else None (checked once; a changed private interface falls back to linprog)."""
    try:
        hs = _load_highs_core()
    except ImportError:
        return None
    needed = ("_Highs", "HighsLp", "HighsOptions", "MatrixFormat", "ObjSense", "HighsModelStatus", "HighsStatus",
              "kHighsInf")
    return hs if all(hasattr(hs, name) for name in needed) else None


def _load_highs_core() -> Any:
    """scipy's HiGHS bindings, loaded from their own file: importing them by name first runs ``scipy.optimize``'s
    ``__init__`` (~0.5 s CPU of imports, most of the demo search's; measured 2026-11-28), which nothing here uses.
    Registered under their own name, so a later ``import scipy.optimize`` reuses this module rather than
    initialising the extension a second time. Where the file is not found, the ordinary import."""
    if _HIGHS_CORE in sys.modules:
        return sys.modules[_HIGHS_CORE]
    scipy_spec = importlib.util.find_spec("scipy")  # finds the package without running its __init__
    for folder in (scipy_spec.submodule_search_locations or []) if scipy_spec is not None else []:
        for suffix in importlib.machinery.EXTENSION_SUFFIXES:
            path = Path(folder, "optimize", "_highspy", f"_core{suffix}")
            if not path.is_file():
                continue
            loader = importlib.machinery.ExtensionFileLoader(_HIGHS_CORE, str(path))
            spec = importlib.util.spec_from_file_location(_HIGHS_CORE, path, loader=loader)
            if spec is None:
                break
            module = importlib.util.module_from_spec(spec)
            sys.modules[_HIGHS_CORE] = module
            try:
                loader.exec_module(module)
            except BaseException:
                del sys.modules[_HIGHS_CORE]
                raise
            return module
    import scipy.optimize._highspy._core as hs

    return hs


def _highs_classes_solve(hs: Any, c: np.ndarray, a: CscMatrix, rhs: np.ndarray, ub: np.ndarray,
                         warm: WarmStarts | None, central: bool) -> np.ndarray | None:
    m, n = a.shape
    highs = hs._Highs()
    options = hs.HighsOptions()
    options.output_flag = False
    key = (m, n, a.indptr.tobytes(), a.indices.tobytes())
    warm = None if central else warm
    basis = warm.bases.get(key) if warm is not None else None
    options.solver = "ipm" if central or (basis is None and m > _COLD_IPM_ROWS) else "simplex"
    options.run_crossover = "off" if central else "on"
    options.simplex_dual_edge_weight_strategy = 1  # devex: ~30 % faster than the default here, cold or warm
    failed = hs.HighsStatus.kError  # e.g. a NaN in the model: HiGHS then reports "optimal" on what it has
    if highs.passOptions(options) == failed or _pass_model(hs, highs, c, a, rhs, ub) == failed:
        return None
    if basis is not None and highs.setBasis(basis) == failed:
        return None
    if highs.run() == failed or highs.getModelStatus() != hs.HighsModelStatus.kOptimal:
        return None
    if warm is not None:
        warm.bases[key] = highs.getBasis()
    x = np.asarray(highs.getSolution().col_value)
    return x if np.isfinite(x).all() else None


def _pass_model(hs: Any, highs: Any, c: np.ndarray, a: CscMatrix, rhs: np.ndarray, ub: np.ndarray,
                arrays: bool = True) -> Any:
    """Hand min c·x, a·x ≤ rhs, 0 ≤ x ≤ ub to ``highs``; its HighsStatus. As arrays (read in place; every variable
    continuous) where the bindings have that overload, else (``arrays`` False, or another scipy's bindings) through
    a HighsLp, whose fields HiGHS copies element by element (~4 ms more per LP at 1,024 GPUs): the same LP."""
    m, n = a.shape
    upper = np.ascontiguousarray(np.where(np.isinf(ub), hs.kHighsInf, ub), np.float64)
    if arrays:
        f64, i32 = np.float64, np.int32
        try:
            return highs.passModel(
                n, m, int(a.indptr[-1]), int(hs.MatrixFormat.kColwise), int(hs.ObjSense.kMinimize), 0.0,
                np.ascontiguousarray(c, f64), np.zeros(n), upper, np.full(m, -hs.kHighsInf),
                np.ascontiguousarray(rhs, f64), np.ascontiguousarray(a.indptr, i32),
                np.ascontiguousarray(a.indices, i32), np.ascontiguousarray(a.data, f64), np.zeros(n, i32))
        except TypeError:  # no such overload in these bindings
            pass
    lp = hs.HighsLp()
    lp.num_col_, lp.num_row_ = n, m
    lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, m
    lp.a_matrix_.format_ = hs.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    lp.col_cost_ = c
    lp.col_lower_ = np.zeros(n)
    lp.col_upper_ = upper
    lp.row_lower_ = np.full(m, -hs.kHighsInf)
    lp.row_upper_ = rhs
    return highs.passModel(lp)


def _hull(times: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of Pareto options (times ascending, costs falling): its vertices (times, costs), reduced
    to at most ``_PIECES`` pieces (read-only: one per distinct option row, shared by stages of one type and time)."""
    t, c = np.ascontiguousarray(times, dtype=float), np.ascontiguousarray(costs, dtype=float)
    return _hull_of(t.tobytes(), c.tobytes())


@lru_cache(maxsize=1024)
def _hull_of(times_b: bytes, costs_b: bytes) -> tuple[np.ndarray, np.ndarray]:
    times, costs = np.frombuffer(times_b), np.frombuffer(costs_b)
    pts: list[tuple[float, float]] = []
    for x, y in zip(times.tolist(), costs.tolist(), strict=True):
        while len(pts) >= 2:
            (x1, y1), (x2, y2) = pts[-2], pts[-1]
            if (y2 - y1) * (x - x1) >= (y - y1) * (x2 - x1):
                pts.pop()
            else:
                break
        pts.append((x, y))
    a = np.asarray(pts)
    ht, hc = _simplify(a[:, 0].copy(), a[:, 1].copy(), _PIECES)
    ht.flags.writeable = hc.flags.writeable = False
    return ht, hc


def _simplify(t: np.ndarray, c: np.ndarray, pieces: int) -> tuple[np.ndarray, np.ndarray]:
    """At most ``pieces`` + 1 of the hull vertices: both ends, then repeatedly the vertex farthest below the chord
    of its current piece (a convex over-estimate of the hull, exact at the kept vertices)."""
    if len(t) <= pieces + 1:
        return t, c

    def farthest(a: int, b: int) -> tuple[float, int]:  # (gap, vertex) of the piece a..b; (0, -1) if none below
        if b - a < 2:
            return 0.0, -1
        chord = c[a] + (c[b] - c[a]) * (t[a + 1: b] - t[a]) / (t[b] - t[a])
        d = chord - c[a + 1: b]
        i = int(np.argmax(d))
        return (float(d[i]), a + 1 + i) if d[i] > 0.0 else (0.0, -1)

    pieces_now = [(0, len(t) - 1, *farthest(0, len(t) - 1))]  # (first, last, gap, vertex), in order
    while len(pieces_now) < pieces:
        j = max(range(len(pieces_now)), key=lambda i: (pieces_now[i][2], -i))  # first of the largest gaps
        a, b, _gap, at = pieces_now[j]
        if at < 0:
            break
        pieces_now[j: j + 1] = [(a, at, *farthest(a, at)), (at, b, *farthest(at, b))]
    keep = [p[0] for p in pieces_now] + [len(t) - 1]
    return t[keep], c[keep]


def relaxed_plan(dag: ComputationDag, table: OptionTable, deadline_s: float, warm: WarmStarts | None = None,
                 central: bool = False, fold: Fold | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """(planned duration, planned finish) of every computation (s) at the optimum of the convex relaxation with
    makespan ≤ ``deadline_s`` (transfers: their own duration, finish +inf); None if HiGHS fails.

    LP variables: a start s per computation and, per linear piece of its cost (the hull reduced to at most
    ``_PIECES`` pieces), how far into that piece its duration goes, 0 ≤ x ≤ piece length, at the piece's slope
    (joules per second, negative: slower is cheaper). The duration is the fastest option's time plus Σ x; convexity
    makes the LP fill the pieces in order. Rows: one per dependency (s_p + d_p + lag ≤ s_v; transfers are folded into
    their edge as a constant lag) and one per last computation (s_v + d_v ≤ deadline) — no cost-epigraph rows, so
    the LP has about 2 rows per computation whatever the number of pieces (bounds are free in the simplex).

    ``fold`` (:func:`~ampe.tradeoff.periodic.periodic_fold`): computations of one class share one start, one duration
    and the pieces, computation v starting ``offset[v]`` periods P after its class (P: one more LP variable); the
    dependency rows become s_p + d_p + lag ≤ s_v + (offset_v − offset_p)·P, equal rows once; each class's pieces
    cost as many times as it has computations. Every schedule of that smaller LP is one of the full DAG (every
    dependency of the DAG is a row), so the plan is feasible; it is the best *periodic* one."""
    n = len(dag.nodes)
    fixed = table.time_s[np.arange(n), fastest_choice(dag)]
    comp = dag.computation_mask
    ops = np.flatnonzero(comp)
    k = len(ops)
    if fold is None:
        cls, off, kc = np.arange(k), np.zeros(k, dtype=np.int64), k
    else:
        cls, off, kc = fold.cls, fold.offset, int(fold.cls.max()) + 1 if k else 0
    mult = np.bincount(cls, minlength=kc).astype(float)
    rep = np.full(kc, -1, dtype=np.int64)  # one computation per class (its first): the class's option row
    rep[cls[::-1]] = ops[::-1]
    lo, pop, plen, pslope = _cost_pieces(table, rep, fixed[rep].copy())
    q = len(pop)
    src_a, dst_a, lag_a, sinks = _dependencies(dag, ops, fixed)
    periods = np.zeros(0)  # the P column's entries: −(offset_v − offset_p) per dependency row, offset_v per sink row
    if fold is not None:  # dependencies and sinks in class terms, each distinct row once
        src_a, dst_a, lag_a, sinks, periods = _class_rows(cls, off, src_a, dst_a, lag_a, sinks)
    a_ub, width = _constraint_matrix(src_a, dst_a, sinks, pop, kc, periods if fold is not None else None)
    rhs = np.concatenate([-lag_a - lo[src_a], deadline_s - lo[sinks]])
    c = np.concatenate([np.zeros(kc), pslope * mult[pop], np.zeros(width - kc - q)])
    x = _highs_lp_solve(c, a_ub, rhs, np.concatenate([np.full(kc, np.inf), plen, np.full(width - kc - q, np.inf)]),
                        warm, central)
    if x is None:
        return None
    dur = lo + np.bincount(pop, weights=x[kc: kc + q], minlength=kc)
    period = float(x[-1]) if fold is not None else 0.0
    durations = fixed.copy()
    finish = np.full(n, np.inf)
    durations[ops] = dur[cls]
    finish[ops] = x[cls] + off * period + dur[cls]
    return durations, finish


def _cost_pieces(table: OptionTable, rep: np.ndarray,
                 lo: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The LP's piece variables of the classes whose first computations are ``rep``: (fastest hull time per class
    (s; ``lo``, the fastest option's time, where a row has one option), class, length (s) and slope (J/s) per
    piece)."""
    piece_op, piece_len, piece_slope = [], [], []  # per piece variable: its class, length, slope
    for row in np.unique(table.row_of[rep]).tolist():
        times, ids = table.row_pareto[row]
        nodes = np.flatnonzero(table.row_of[rep] == row)
        if len(times) < 2:
            continue
        ht, hc = _hull(times, table.row_effective_j[row, ids])
        lo[nodes] = ht[0]
        p = len(ht) - 1
        piece_op.append(np.repeat(nodes, p))
        piece_len.append(np.tile(np.diff(ht), len(nodes)))
        piece_slope.append(np.tile(np.diff(hc) / np.diff(ht), len(nodes)))
    pop = np.concatenate(piece_op) if piece_op else np.zeros(0, dtype=np.int64)
    plen = np.concatenate(piece_len) if piece_len else np.zeros(0)
    pslope = np.concatenate(piece_slope) if piece_slope else np.zeros(0)
    return lo, pop, plen, pslope


def _dependencies(dag: ComputationDag, ops: np.ndarray,
                  fixed: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(source, destination, lag (s)) of every dependency between computations, as positions in ``ops``, through any
    transfers in between (their time ``fixed`` is the lag), and the positions of the last computations."""
    n = len(dag.nodes)
    comp = dag.computation_mask
    k = len(ops)
    slot = np.full(n, -1, dtype=np.int64)
    slot[ops] = np.arange(k)
    pred_pad = dag.levels.preds[ops]  # (k, most predecessors), padded with n
    has = pred_pad < n
    dst_a = np.repeat(np.arange(k), has.sum(axis=1))
    src_n = pred_pad[has]
    lag_a = np.zeros(len(src_n))
    while True:
        through = ~comp[src_n]  # a transfer: its time is a constant lag, its one predecessor the source
        if not through.any():
            break
        lag_a[through] += fixed[src_n[through]]
        src_n[through] = dag.levels.preds[src_n[through], 0]
    src_a = slot[src_n]
    sinks = slot[ops[dag.levels.succs[ops].min(axis=1, initial=n) >= n]] if len(ops) else np.zeros(0, dtype=np.int64)
    return src_a, dst_a, lag_a, sinks


def _class_rows(cls: np.ndarray, off: np.ndarray, src_a: np.ndarray, dst_a: np.ndarray, lag_a: np.ndarray,
                sinks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Dependencies and sinks in class terms, each distinct row once, and the period column's entry per row
    (−(offset_v − offset_p) per dependency, offset_v per sink)."""
    rows_e = np.unique(np.stack([cls[src_a], cls[dst_a], off[dst_a] - off[src_a], lag_a.view(np.int64)], 1), axis=0)
    rows_s = np.unique(np.stack([cls[sinks], off[sinks]], 1), axis=0)
    periods = np.concatenate([-rows_e[:, 2], rows_s[:, 1]]).astype(float)
    return rows_e[:, 0], rows_e[:, 1], rows_e[:, 3].copy().view(np.float64), rows_s[:, 0], periods


def _constraint_matrix(src_a: np.ndarray, dst_a: np.ndarray, sinks: np.ndarray, pop: np.ndarray, kc: int,
                       periods: np.ndarray | None) -> tuple[CscMatrix, int]:
    """The LP's rows (one per dependency, then one per sink) over its columns (a start per class, the piece
    variables, then the period P where ``periods`` gives its entries), and the number of columns."""
    ne, q = len(src_a), len(pop)
    # the piece variables of each class, as (row-of-its-class) lists: class → its pieces
    order = np.argsort(pop, kind="stable")
    counts = np.bincount(pop, minlength=kc)
    first = np.concatenate([[0], np.cumsum(counts)])

    def piece_entries(rows: np.ndarray, ops_of_rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        c = counts[ops_of_rows]
        r = np.repeat(rows, c)
        offs = np.arange(int(c.sum())) - np.repeat(np.cumsum(c) - c, c)
        return r, kc + order[np.repeat(first[ops_of_rows], c) + offs]

    e_rows = np.arange(ne)
    s_rows = ne + np.arange(len(sinks))
    pr_e, pc_e = piece_entries(e_rows, src_a)
    pr_s, pc_s = piece_entries(s_rows, sinks)
    rows = np.concatenate([e_rows, e_rows, pr_e, s_rows, pr_s])
    cols = np.concatenate([src_a, dst_a, pc_e, sinks, pc_s])
    vals = np.concatenate([np.ones(ne), -np.ones(ne), np.ones(len(pr_e)), np.ones(len(sinks)), np.ones(len(pr_s))])
    width = kc + q
    if periods is not None:
        used = np.flatnonzero(periods)
        rows, cols = np.concatenate([rows, used]), np.concatenate([cols, np.full(len(used), width)])
        vals = np.concatenate([vals, periods[used]])
        width += 1
    # zero sums dropped: a class's dependency on itself one or more periods later, where only P remains
    return csc_from_entries(rows, cols, vals, (ne + len(sinks), width)), width


def _round_up(table: OptionTable, durations: np.ndarray) -> np.ndarray:
    """Per node the fastest Pareto option not faster than its planned duration (its cheapest if none is)."""
    times, ids, count = table.pareto_padded
    rows = table.row_of
    k = (times[rows] < (durations * (1 - 1e-9))[:, None]).sum(axis=1)  # Pareto times faster than the duration
    return ids[rows, np.minimum(k, count[rows] - 1)]


def point_by(dag: ComputationDag, deadline_s: float | None = None, table: OptionTable | None = None,
             warm: WarmStarts | None = None, fastest_s: float | None = None,
             fold_from: int = FOLD_FROM) -> tuple[np.ndarray, Evaluation]:
    """(option index per node, its evaluation) of the cheapest plan found that finishes by ``deadline_s`` (s;
    default and at least: the all-max iteration time). Never slower than the deadline. ``warm``: bases of LPs
    solved before, reused and extended (the plan can depend on them: the LP's optimum is rarely unique).
    ``fastest_s``: the all-max iteration time of ``dag`` if the caller has it (as ``evaluate_choice`` of
    :func:`fastest_choice` gives it: the same level pass), else computed here. ``fold_from``: the fewest
    computations whose LP folds a repeating 1F1B middle (:func:`~ampe.tradeoff.periodic.periodic_fold`)."""
    table = table or OptionTable.of(dag)
    c0 = fastest_choice(dag)[None, :]
    finish_max = earliest(dag, table.time_s[np.arange(len(dag.nodes)), c0])[1]
    t_fast = float(finish_max.max()) if fastest_s is None else float(fastest_s)
    deadline = t_fast if deadline_s is None else max(t_fast, float(deadline_s))
    fold = periodic_fold(dag, finish_max[0], fold_from)
    plan = relaxed_plan(dag, table, deadline, warm, fold=fold) if fold is not None else None
    plans = [plan if plan is not None else relaxed_plan(dag, table, deadline, warm)]
    if np.sum(table.num_options[dag.computation_mask] > 1) <= _CENTRAL_MAX:
        plans.append(relaxed_plan(dag, table, deadline, central=True))
    raw, labels = [c0], ["all-max"]  # candidates before polishing (one batch: the level passes are shared)
    for i, plan in enumerate(plans):
        if plan is None:
            continue
        durations, finish = plan
        # HiGHS meets constraints to ~1e-7 (absolute): deadlines a little earlier keep the plan within the deadline
        # (a node whose deadline cannot be met keeps its fastest option).
        raw.append(fit_deadlines(dag, table, c0, finish[None, :] - 1e-7 - 1e-9 * deadline))
        labels.append(f"fit {i}")
        # Where the hulls are loose (few or non-convex options) rounding every planned duration up to the next
        # Pareto option and greedily speeding up the real critical path until the deadline is met can do better.
        repaired = speed_up_through(dag, table, _round_up(table, durations), [deadline], max_moves=_REPAIR_MOVES)[0]
        if repaired is not None:
            raw.append(repaired[None, :])
            labels.append(f"repair {i}")
    polished = polish_batch(dag, table, np.concatenate(raw), rounds=2)
    fits = [j for j, label in enumerate(labels) if label.startswith("fit")]
    # The LP's optimum is rarely unique (computations of one option row in series trade slack at one price), and the
    # optimum found fixes how the shared float is split; spending what is left of it helps whichever it was.
    spent = spend_float(dag, table, polished[fits], deadline) if fits else polished[:0]
    candidates = [polished[:1]]
    for j in range(1, len(labels)):  # in the order of before: each fit, its spent float, its repair
        candidates.append(polished[j: j + 1])
        if j in fits:
            candidates.append(spent[fits.index(j): fits.index(j) + 1])
    choices = np.concatenate(candidates)
    t, e, eff = evaluate_batch(dag, table, choices)
    ok = np.flatnonzero(t <= deadline * (1 + 1e-12))
    i = int(ok[np.argmin(eff[ok])]) if len(ok) else 0  # the polished all-max plan always fits
    return choices[i], Evaluation(float(t[i]), float(e[i]), float(eff[i]))
