"""Evaluate clock assignments on the discrete options: real iteration time and energy (Perseus Eq. 3/4).

A *choice* assigns every DAG node an index into its ``OpOptions.options`` (transfers have one option). Batches of
choices (a ``k × n`` integer array) are evaluated together, vectorised over the batch.

Energy of one iteration of one pipeline whose own critical path takes T and which waits until T' ≥ T::

    E(T') = Σ_i e_i + Σ_s P_block,s · (T' − busy_s)         (Eq. 3; busy_s = Σ computation time on stage s)
          = Σ_i (e_i − P_block,s(i) · t_i) + T' · Σ_s P_block,s   = effective (Eq. 4) + T' · Σ_s P_block,s

Transfers are not computations: their time counts as blocking.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ampe.tradeoff import levels
from ampe.tradeoff.dag import ComputationDag

_COMPARE_AT_ONCE = 1 << 20  # _slow_within: most limit × Pareto-time comparisons made at once (8 MB of booleans)


@dataclass(frozen=True)
class OptionTable:
    """Dense per-node option arrays of a DAG (padded with +inf time where a node has fewer options)."""

    time_s: np.ndarray  # (n, K)
    num_options: np.ndarray  # (n,)
    total_blocking_w: float
    row_of: np.ndarray  # (n,): the node's row below (nodes of one spec share one; specs never mix stages)
    row_effective_j: np.ndarray  # (rows, K): effective energy per row
    row_pareto: tuple[tuple[np.ndarray, np.ndarray], ...]  # per row: real-time Pareto (times ascending, ids)
    row_energy_j: np.ndarray  # (rows, K): energy per row

    @cached_property
    def energy_j(self) -> np.ndarray:
        """(n, K) energy per node and option (J); 0 for transfers (gathered from the rows when first asked)."""
        return self.row_energy_j[self.row_of]

    @cached_property
    def effective_j(self) -> np.ndarray:
        """(n, K) effective energy e − P_block·t per node and option (J); 0 for transfers."""
        return self.row_effective_j[self.row_of]

    @cached_property
    def pareto_padded(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per row: Pareto times ascending (+inf padded), their option ids (0 padded) and how many there are."""
        width = max(len(t) for t, _ in self.row_pareto)
        times = np.full((len(self.row_pareto), width), np.inf)
        ids = np.zeros((len(self.row_pareto), width), dtype=np.int64)
        count = np.zeros(len(self.row_pareto), dtype=np.int64)
        for r, (t, i) in enumerate(self.row_pareto):
            times[r, : len(t)], ids[r, : len(t)], count[r] = t, i, len(t)
        return times, ids, count

    @cached_property
    def speedups(self) -> tuple[np.ndarray, np.ndarray]:
        """Per option row and current option c: the faster option with the least extra effective energy per second
        saved (first such option on ties) and that rate (+inf where no option is faster), read-only; the greedy
        repair's moves (:func:`~ampe.tradeoff.repair.speed_up_through`), kept for the table's next repair. Rows with
        the same times and energies (stages of one GPU type and time) are computed once."""
        t_all = self.time_s[np.unique(self.row_of, return_index=True)[1]]  # (rows, K), +inf padded
        k = t_all.shape[1]
        best = np.zeros((len(t_all), k), dtype=np.int64)
        rate = np.full((len(t_all), k), np.inf)
        groups: dict[bytes, list[int]] = {}
        for row in np.flatnonzero(np.isfinite(t_all).sum(axis=1) > 1).tolist():  # rows with a choice (not transfers)
            groups.setdefault(t_all[row].tobytes() + self.row_effective_j[row].tobytes(), []).append(row)
        if groups:
            first = [g[0] for g in groups.values()]
            t = t_all[first]
            eff = self.row_effective_j[first]
            with np.errstate(divide="ignore", invalid="ignore"):
                r = (eff[:, None, :] - eff[:, :, None]) / (t[:, :, None] - t[:, None, :])  # [row, current, faster]
            r = np.where(t[:, None, :] < t[:, :, None], r, np.inf)
            b = np.argmin(r, axis=2)
            low = np.take_along_axis(r, b[..., None], axis=2)[..., 0]
            for i, rows in enumerate(groups.values()):
                best[rows] = b[i]
                rate[rows] = low[i]
        best.setflags(write=False)
        rate.setflags(write=False)
        return best, rate

    @property
    def pareto(self) -> tuple[tuple[np.ndarray, np.ndarray], ...]:
        """Per node: (Pareto option times ascending, option ids); costs fall along them."""
        return tuple(self.row_pareto[r] for r in self.row_of.tolist())

    @classmethod
    def of(cls, dag: ComputationDag) -> OptionTable:
        """Build the table of ``dag`` (one row per spec and stage, gathered per node)."""
        k = max(len(s.options) for s in dag.specs)
        # one row per (spec, blocking stage or -1 for transfers), numbered in order of first use
        node_stage = np.where(dag.computation_mask, dag.node_stage, -1)
        keys = dag.spec_of * (dag.num_stages + 1) + node_stage + 1
        _, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        rank = np.empty(len(first), dtype=np.int64)
        rank[np.argsort(first, kind="stable")] = np.arange(len(first))
        row_of = rank[inverse.reshape(-1)]
        order = np.sort(first)
        rows = {(int(dag.spec_of[v]), int(node_stage[v])): i for i, v in enumerate(order.tolist())}
        r = len(rows)
        t = np.full((r, k), np.inf)
        e = np.zeros((r, k))
        eff = np.zeros((r, k))
        num = np.zeros(r, dtype=np.int64)
        pareto: list[tuple[np.ndarray, np.ndarray]] = []
        made: dict[tuple[int, float | None], int] = {}  # (option set, blocking watts) → its first row
        for (spec, stage), i in rows.items():
            opts = dag.specs[spec].options
            num[i] = len(opts)
            key = (id(opts), dag.blocking_w[stage] if stage >= 0 else None)  # stages of one type and time share
            same = made.get(key)
            if same is not None:
                t[i], e[i], eff[i] = t[same], e[same], eff[same]
                pareto.append(pareto[same])
                continue
            made[key] = i
            t[i, : len(opts)] = [o.time_s for o in opts]
            if stage >= 0:
                e[i, : len(opts)] = [o.energy_j for o in opts]
                eff[i, : len(opts)] = [o.energy_j - dag.blocking_w[stage] * o.time_s for o in opts]
            pareto.append(_pareto(t[i, : len(opts)], eff[i, : len(opts)]))
        return cls(t[row_of], num[row_of], float(sum(dag.blocking_w)), row_of, eff, tuple(pareto), e)


def _pareto(times: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Options no other option beats in both time and cost: (times ascending, option ids); costs then fall."""
    if not (np.isfinite(times).all() and np.isfinite(costs).all()):  # NaN orders differently: the plain loop
        keep: list[int] = []
        for i in sorted(range(len(times)), key=lambda i: (times[i], costs[i])):
            if not keep or costs[i] < costs[keep[-1]]:
                keep.append(i)
        return times[keep].copy(), np.asarray(keep, dtype=np.int64)
    order = np.lexsort((costs, times))  # by time, then cost (stable, as sorted())
    c = costs[order]
    # kept: the first, then every option cheaper than all before it (the last one kept is the cheapest so far)
    first = np.ones(len(c), dtype=bool)
    first[1:] = c[1:] < np.minimum.accumulate(c)[:-1]
    keep_ids = order[first].astype(np.int64)
    return times[keep_ids].copy(), keep_ids


@dataclass(frozen=True)
class Evaluation:
    """Real iteration time (s), energy with blocking until that time (J, Eq. 3) and effective energy (J, Eq. 4)."""

    time_s: float
    energy_j: float
    effective_j: float


def earliest(dag: ComputationDag, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start and finish of every node for a batch of node times (``k × n``), as ``k × n`` arrays."""
    return levels.earliest(dag.levels, times)


def evaluate_batch(dag: ComputationDag, table: OptionTable, choice: np.ndarray) -> tuple[np.ndarray, ...]:
    """(time_s, energy_j, effective_j) arrays for a batch of choices (``k × n``)."""
    choice = np.atleast_2d(choice)
    rows = np.arange(choice.shape[1])
    times = table.time_s[rows, choice]
    _, ef = earliest(dag, times)
    makespan = ef.max(axis=1)
    eff = table.row_effective_j[table.row_of[rows], choice].sum(axis=1)  # = table.effective_j[rows, choice]
    return makespan, eff + table.total_blocking_w * makespan, eff


def evaluate_choice(dag: ComputationDag, choice: np.ndarray | list[int],
                    table: OptionTable | None = None) -> Evaluation:
    """Evaluate one choice."""
    t, e, eff = evaluate_batch(dag, table or OptionTable.of(dag), np.asarray(choice)[None, :])
    return Evaluation(float(t[0]), float(e[0]), float(eff[0]))


def fastest_choice(dag: ComputationDag) -> np.ndarray:
    """Every node at its fastest option (all clocks at maximum; ties: the cheaper option)."""
    return dag.fastest_option[dag.spec_of]


def latest(dag: ComputationDag, times: np.ndarray, makespan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latest start and finish of every node for a batch of node times (``k × n``) and makespans (``k``)."""
    return levels.latest(dag.levels, times, np.asarray(makespan, dtype=times.dtype))


def _slow_within(table: OptionTable, choice: np.ndarray, nodes: np.ndarray, limit: np.ndarray) -> bool:
    """Give each of ``nodes``, in every row, its cheapest option not longer than ``limit`` (``k × len(nodes)``)
    when that is cheaper than its current one; True if any changed. Small calls compare every limit with its
    node's padded Pareto times at once; large ones do one binary search per option set."""
    times, ids, count = table.pareto_padded
    rows = table.row_of[nodes]
    if limit.size * times.shape[1] <= _COMPARE_AT_ONCE:
        # slowest Pareto option that fits: how many Pareto times are ≤ the limit, minus one
        k = np.minimum((times[rows][None, :, :] <= (limit * (1 + 1e-12))[:, :, None]).sum(axis=2), count[rows]) - 1
        best = ids[rows[None, :], np.maximum(k, 0)]
        cur = choice[:, nodes]
        eff = table.row_effective_j
        better = (k >= 0) & (eff[rows[None, :], best] < eff[rows[None, :], cur] - 1e-12)
        if better.any():
            choice[:, nodes] = np.where(better, best, cur)
            return True
        return False
    order = np.argsort(rows, kind="stable")
    cuts = np.flatnonzero(np.diff(rows[order])) + 1
    changed = False
    for group in np.split(order, cuts):
        r = int(rows[group[0]])
        times_r, ids_r = table.row_pareto[r]
        idx = nodes[group]
        k = np.searchsorted(times_r, limit[:, group] * (1 + 1e-12), side="right") - 1  # slowest Pareto option that fits
        best = ids_r[np.maximum(k, 0)]
        cur = choice[:, idx]
        eff = table.row_effective_j[r]
        better = (k >= 0) & (eff[best] < eff[cur] - 1e-12)
        if better.any():
            choice[:, idx] = np.where(better, best, cur)
            changed = True
    return changed


def _movable(dag: ComputationDag, table: OptionTable) -> np.ndarray:
    return np.flatnonzero((table.num_options > 1) & dag.computation_mask).astype(np.int64)


def polish_batch(dag: ComputationDag, table: OptionTable, choice: np.ndarray, rounds: int = 1) -> np.ndarray:
    """Slow computations within their *free float* to their cheapest option that fits; never lengthens the
    iteration, effective energy can only drop.

    Forward pass: free float = earliest start of the earliest successor − own earliest finish (sinks: the
    makespan); using it changes no other node's earliest start, so all nodes are updated at once. Backward pass:
    the mirror image on the as-late-as-possible schedule (latest finish − latest finish of the latest
    predecessor). Passes alternate for up to ``rounds`` rounds or until nothing changes.
    """
    choice = np.array(np.atleast_2d(choice), copy=True)
    rows = np.arange(choice.shape[1])
    movable = _movable(dag, table)
    if not len(movable):
        return choice
    succ = dag.levels.succs[movable]
    pred = dag.levels.preds[movable]
    for _ in range(rounds):
        times = table.time_s[rows, choice]
        es, ef = earliest(dag, times)
        makespan = ef.max(axis=1)
        es_x = np.concatenate([es, makespan[:, None]], axis=1)  # column n: a sink's successor starts at the end
        limit = (es_x[:, succ].min(axis=2) if succ.shape[1] else makespan[:, None]) - es[:, movable]
        changed = _slow_within(table, choice, movable, limit)
        times = table.time_s[rows, choice]
        _ls, lf = latest(dag, times, makespan)
        lf_x = np.concatenate([lf, np.zeros((len(lf), 1))], axis=1)  # column n: a source's predecessor ends at 0
        limit = lf[:, movable] - (lf_x[:, pred].max(axis=2) if pred.shape[1] else 0.0)
        changed |= _slow_within(table, choice, movable, limit)
        if not changed:
            break
    return choice


def fit_deadlines(dag: ComputationDag, table: OptionTable, choice: np.ndarray, deadline: np.ndarray) -> np.ndarray:
    """Give every computation the cheapest option that still finishes by its ``deadline`` (s, ``k × n``) when
    started as early as the choices made so far allow (topological order); ``choice`` is kept where nothing
    cheaper fits. With deadlines from a feasible plan this never lengthens it, and it uses the slack that
    predecessors leave when they finish before their planned time."""
    choice = np.array(np.atleast_2d(choice), copy=True)
    k, n = choice.shape
    if k == 1:
        return _fit_one(dag, table, choice, np.asarray(deadline, dtype=float).reshape(1, n)[0], None, None)
    finish = np.zeros((k, n + 1), dtype=float)  # column n: the dummy predecessor, finishing at 0
    movable = np.zeros(n, dtype=bool)
    movable[_movable(dag, table)] = True
    for lv in dag.levels.levels:
        nodes = lv.nodes
        start = finish[:, lv.preds].max(axis=2) if lv.preds.shape[1] else np.zeros((k, len(nodes)))
        m = movable[nodes]
        if m.any():
            _slow_within(table, choice, nodes[m], deadline[:, nodes[m]] - start[:, m])
        finish[:, nodes] = start + table.time_s[nodes, choice[:, nodes]]
    return choice


def fit_releases(dag: ComputationDag, table: OptionTable, choice: np.ndarray, release: np.ndarray,
                 makespan_s: np.ndarray) -> np.ndarray:
    """The mirror image of :func:`fit_deadlines`: in reverse topological order every computation gets the cheapest
    option that still starts at or after its ``release`` (s, ``k × n``) when it finishes as late as the choices
    made after it allow (the last ones at ``makespan_s``, ``k``). With releases from a feasible plan ending by
    ``makespan_s`` this never lengthens it; ``choice`` is kept where nothing cheaper fits."""
    choice = np.array(np.atleast_2d(choice), copy=True)
    k, n = choice.shape
    if k == 1:
        return _fit_one(dag, table, choice, None, np.asarray(release, dtype=float).reshape(1, n)[0],
                        float(np.asarray(makespan_s, dtype=float).reshape(-1)[0]))
    end = np.asarray(makespan_s, dtype=float).reshape(k, 1)
    start = np.repeat(end, n + 1, axis=1)  # column n: the dummy successor, starting at the makespan
    movable = np.zeros(n, dtype=bool)
    movable[_movable(dag, table)] = True
    for lv in reversed(dag.levels.levels):
        nodes = lv.nodes
        finish = start[:, lv.succs].min(axis=2) if lv.succs.shape[1] else np.repeat(end, len(nodes), axis=1)
        m = movable[nodes]
        if m.any():
            _slow_within(table, choice, nodes[m], finish[:, m] - release[:, nodes[m]])
        start[:, nodes] = finish - table.time_s[nodes, choice[:, nodes]]
    return choice


def _fit_one(dag: ComputationDag, table: OptionTable, choice: np.ndarray, deadline: np.ndarray | None,
             release: np.ndarray | None, end: float | None) -> np.ndarray:
    """:func:`fit_deadlines` (``deadline`` given) or :func:`fit_releases` (``release`` and ``end``) of one choice
    (``1 × n``, changed in place and returned), node by node in plain Python: the same starts, finishes, limits and
    comparisons as the level passes (a level's padding adds the dummy node's 0 / ``end``, which changes no maximum /
    minimum: finishes never precede 0 nor follow ``end``), found by bisection in the Pareto times."""
    n = choice.shape[1]
    ch = choice[0].tolist()
    rows = table.row_of.tolist()
    movable = ((table.num_options > 1) & dag.computation_mask).tolist()
    times, ids, count = table.pareto_padded
    p_times = [t[: c].tolist() for t, c in zip(times, count.tolist(), strict=True)]
    p_ids = ids.tolist()
    row_t = table.time_s[np.unique(table.row_of, return_index=True)[1]].tolist()
    row_eff = table.row_effective_j.tolist()
    grow = 1 + 1e-12
    if deadline is not None:
        limits = deadline.tolist()
        finish = [0.0] * n
        for v, ps in enumerate(dag.preds):
            start = 0.0
            for p in ps:
                if finish[p] > start:
                    start = finish[p]
            r = rows[v]
            if movable[v]:
                limit = (limits[v] - start) * grow
                if limit == limit:  # not NaN
                    j = bisect_right(p_times[r], limit) - 1
                    if j >= 0:
                        best = p_ids[r][j]
                        if row_eff[r][best] < row_eff[r][ch[v]] - 1e-12:
                            ch[v] = best
            finish[v] = start + row_t[r][ch[v]]
    else:
        assert release is not None and end is not None
        limits = release.tolist()
        begin = [end] * n
        succs = dag.succs
        for v in range(n - 1, -1, -1):
            fin = end
            for w in succs[v]:
                if begin[w] < fin:
                    fin = begin[w]
            r = rows[v]
            if movable[v]:
                limit = (fin - limits[v]) * grow
                if limit == limit:
                    j = bisect_right(p_times[r], limit) - 1
                    if j >= 0:
                        best = p_ids[r][j]
                        if row_eff[r][best] < row_eff[r][ch[v]] - 1e-12:
                            ch[v] = best
            begin[v] = fin - row_t[r][ch[v]]
    choice[0] = ch
    return choice


def spend_float(dag: ComputationDag, table: OptionTable, choice: np.ndarray, makespan_s: float) -> np.ndarray:
    """Slow computations within their *total* float up to ``makespan_s`` (s): a backward pass (each computation,
    last first, to its cheapest option that still starts at or after its earliest start) and a forward pass (first
    first, to its cheapest option that still finishes by its latest finish), each polished. Where polishing only
    uses the float a computation does not share, these hand the float that a chain of computations shares to the
    first (last) of them that can use it; each pass keeps the iteration within ``makespan_s`` when the choice
    meets it, and effective energy can only drop."""
    choice = np.array(np.atleast_2d(choice), copy=True)
    rows = np.arange(choice.shape[1])
    end = np.full(len(choice), float(makespan_s))
    es, _ = earliest(dag, table.time_s[rows, choice])
    choice = polish_batch(dag, table, fit_releases(dag, table, choice, es, end), rounds=2)
    _, lf = latest(dag, table.time_s[rows, choice], end)
    return polish_batch(dag, table, fit_deadlines(dag, table, choice, lf), rounds=2)


class LongestPath:
    """Earliest finishes and one longest path of ``dag`` under node ``times`` (s), kept up to date when single
    node times change (:meth:`set_time` re-propagates only to the descendants whose finish moves). Ties are broken
    exactly as :func:`critical_path` breaks them, so both give the same path. ``updates`` counts the nodes
    recomputed by :meth:`set_time` so far (its work)."""

    def __init__(self, dag: ComputationDag, times: list[float]) -> None:
        self.dag = dag
        self.times = list(times)
        if any(t != t for t in self.times):  # NaN: no longest path (validated inputs never have one)
            raise ValueError("node times must not be NaN")
        self.updates = 0
        n = len(dag.nodes)
        self.ef = ef = [0.0] * n
        self.arg = arg = [-1] * n
        self._dirty = bytearray(n)  # set_time's work list (all zero between calls)
        self._single = [len(p) == 1 for p in dag.preds]  # one predecessor: recomputed inline by set_time
        # the longest path ends at a sink: finishes never fall along an edge while no time is negative
        self._ends = [v for v, s in enumerate(dag.succs) if not s] if min(self.times, default=0.0) >= 0 else range(n)
        for v, (ps, t) in enumerate(zip(dag.preds, self.times, strict=True)):  # as _update, inlined
            best, b = 0.0, -1
            for p in ps:
                if ef[p] > best:
                    best, b = ef[p], p
            arg[v] = b
            ef[v] = best + t

    def _update(self, v: int) -> bool:
        """Recompute node v from its predecessors; True if its finish changed."""
        ef = self.ef
        best, b = 0.0, -1
        for p in self.dag.preds[v]:
            if ef[p] > best:
                best, b = ef[p], p
        self.arg[v] = b
        new = best + self.times[v]
        changed = new != ef[v]
        ef[v] = new
        return changed

    def set_time(self, v: int, seconds: float) -> None:
        """Change node v's time and propagate (topological order = node id order): v, then in id order every node
        with a predecessor whose finish moved. :meth:`_update` inlined (this loop is most of the greedy repair's
        time); the next node to recompute is found by a C-level search of a byte array of flags."""
        if seconds != seconds:
            raise ValueError("node times must not be NaN")
        self.times[v] = seconds
        if not seconds >= 0:
            self._ends = range(len(self.ef))
        preds, succs = self.dag.preds, self.dag.succs
        ef, arg, times = self.ef, self.arg, self.times
        dirty, single = self._dirty, self._single
        find = dirty.find
        count = 0
        u = v
        while u >= 0:
            dirty[u] = 0
            count += 1
            best, b = 0.0, -1
            for p in preds[u]:
                x = ef[p]
                if x > best:
                    best, b = x, p
            arg[u] = b
            new = best + times[u]
            if new != ef[u] or u == v:
                ef[u] = new
                for w in succs[u]:
                    if not single[w]:
                        dirty[w] = 1
                        continue
                    count += 1  # w's one predecessor is u: recompute it now (every transfer)
                    if new > 0.0:
                        arg[w], new_w = u, new + times[w]
                    else:
                        arg[w], new_w = -1, 0.0 + times[w]
                    if new_w != ef[w]:
                        ef[w] = new_w
                        for x in succs[w]:
                            dirty[x] = 1
            u = find(1, u + 1)
        self.updates += count

    def path(self) -> tuple[list[int], float]:
        """(nodes of one longest path, its length), as :func:`critical_path` returns them."""
        ef = self.ef
        makespan = max([ef[v] for v in self._ends])
        # the first node finishing at the makespan (as ef.index): every such node reaches an end finishing at it
        # through nodes finishing at it too, so it is found walking back from those ends over such predecessors
        found = {v for v in self._ends if ef[v] == makespan}
        todo = list(found)
        preds = self.dag.preds
        while todo:
            for p in preds[todo.pop()]:
                if ef[p] == makespan and p not in found:
                    found.add(p)
                    todo.append(p)
        v = min(found)
        out = []
        while v >= 0:
            out.append(v)
            v = self.arg[v]
        return out, makespan


def critical_path(dag: ComputationDag, times: list[float]) -> tuple[list[int], float]:
    """(nodes of one longest path, its length): follow the predecessor that determines each start."""
    n = len(dag.nodes)
    ef = [0.0] * n
    arg = [-1] * n
    for v, ps in enumerate(dag.preds):
        best, b = 0.0, -1
        for p in ps:
            if ef[p] > best:
                best, b = ef[p], p
        ef[v] = best + times[v]
        arg[v] = b
    v = max(range(n), key=ef.__getitem__)
    makespan = ef[v]
    path = []
    while v >= 0:
        path.append(v)
        v = arg[v]
    return path, makespan
