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

import numpy as np
from scipy.optimize import linprog
from scipy.sparse import coo_array

from ampe.energy.dag import ComputationDag
from ampe.energy.evaluate import (
    Evaluation,
    OptionTable,
    earliest,
    evaluate_batch,
    fastest_choice,
    fit_deadlines,
    polish_batch,
)

_METHOD = "highs"


def _hull(times: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Lower convex hull of Pareto options (times ascending, costs falling): its vertices (times, costs)."""
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
    return a[:, 0], a[:, 1]


def relaxed_finish(dag: ComputationDag, table: OptionTable, deadline_s: float) -> np.ndarray | None:
    """Planned finish time (s) of every node at the optimum of the convex relaxation with makespan ≤
    ``deadline_s`` (None if HiGHS fails)."""
    n = len(dag.nodes)
    rows, cols, vals, rhs = [], [], [], []
    lo = np.zeros(n)
    hi = np.zeros(n)
    var = []  # (node, hull times, hull costs) of computations with a choice
    hulls: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # per option row
    for v in range(n):
        row = int(table.row_of[v])
        times, ids = table.row_pareto[row]
        lo[v] = times[0]
        if len(times) > 1 and dag.is_computation(v):
            if row not in hulls:
                hulls[row] = _hull(times, table.row_effective_j[row, ids])
            ht, hc = hulls[row]
            hi[v] = ht[-1]
            var.append((v, ht, hc))
        else:
            hi[v] = times[0]
    m = len(var)
    # Variables: d (n durations), s (n starts), z (m cost epigraphs).
    r = 0
    for j, (v, ht, hc) in enumerate(var):  # z_j ≥ c_a + slope (d_v − t_a) on every hull piece
        for a in range(len(ht) - 1):
            slope = (hc[a + 1] - hc[a]) / (ht[a + 1] - ht[a])
            rows += [r, r]
            cols += [v, 2 * n + j]
            vals += [slope, -1.0]
            rhs.append(slope * ht[a] - hc[a])
            r += 1
    for v, ps in enumerate(dag.preds):  # s_p + d_p ≤ s_v
        for p in ps:
            rows += [r, r, r]
            cols += [n + p, p, n + v]
            vals += [1.0, 1.0, -1.0]
            rhs.append(0.0)
            r += 1
    for v in range(n):  # s_v + d_v ≤ deadline
        if not dag.succs[v]:
            rows += [r, r]
            cols += [n + v, v]
            vals += [1.0, 1.0]
            rhs.append(deadline_s)
            r += 1
    c = np.concatenate([np.zeros(2 * n), np.ones(m)])
    a_ub = coo_array((vals, (rows, cols)), shape=(r, 2 * n + m)).tocsr()
    bounds = np.concatenate([np.stack([lo, hi], 1), np.stack([np.zeros(n), np.full(n, np.inf)], 1),
                             np.stack([np.full(m, -np.inf), np.full(m, np.inf)], 1)])
    res = linprog(c, A_ub=a_ub, b_ub=np.asarray(rhs), bounds=bounds, method=_METHOD)
    if res.status != 0:
        return None
    x = res.x
    return x[n: 2 * n] + x[:n]


def point_by(dag: ComputationDag, deadline_s: float | None = None,
             table: OptionTable | None = None) -> tuple[np.ndarray, Evaluation]:
    """(option index per node, its evaluation) of the cheapest plan found that finishes by ``deadline_s`` (s;
    default and at least: the all-max iteration time). Never slower than the deadline."""
    table = table or OptionTable.of(dag)
    c0 = fastest_choice(dag)[None, :]
    t_fast = float(earliest(dag, table.time_s[np.arange(len(dag.nodes)), c0])[1].max())
    deadline = t_fast if deadline_s is None else max(t_fast, float(deadline_s))
    candidates = [polish_batch(dag, table, c0, rounds=2)]
    finish = relaxed_finish(dag, table, deadline)
    if finish is not None:
        # HiGHS meets constraints to ~1e-7 (absolute): deadlines a little earlier keep the plan within the deadline
        # (a node whose deadline cannot be met keeps its fastest option).
        fitted = fit_deadlines(dag, table, c0, finish[None, :] - 1e-7 - 1e-9 * deadline)
        candidates.append(polish_batch(dag, table, fitted, rounds=2))
    choices = np.concatenate(candidates)
    t, e, eff = evaluate_batch(dag, table, choices)
    ok = np.flatnonzero(t <= deadline * (1 + 1e-12))
    i = int(ok[np.argmin(eff[ok])]) if len(ok) else 0  # the polished all-max plan always fits
    return choices[i], Evaluation(float(t[i]), float(e[i]), float(eff[i]))
