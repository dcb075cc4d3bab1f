"""Evaluate clock assignments on the discrete options: real iteration time and energy (Perseus Eq. 3/4).

A *choice* assigns every DAG node an index into its ``OpOptions.options`` (transfers have one option). Batches of
choices (a ``k × n`` integer array) are evaluated together, vectorised over the batch.

Energy of one iteration of one pipeline whose own critical path takes T and which waits until T' ≥ T::

    E(T') = Σ_i e_i + Σ_s P_block,s · (T' − busy_s)         (Eq. 3; busy_s = Σ computation time on stage s)
          = Σ_i (e_i − P_block,s(i) · t_i) + T' · Σ_s P_block,s   = effective (Eq. 4) + T' · Σ_s P_block,s

Transfers are not computations: their time counts as blocking.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampe.energy.dag import ComputationDag


@dataclass(frozen=True)
class OptionTable:
    """Dense per-node option arrays of a DAG (padded with +inf time where a node has fewer options)."""

    time_s: np.ndarray  # (n, K)
    energy_j: np.ndarray  # (n, K); 0 for transfers
    effective_j: np.ndarray  # (n, K); e − P_block·t for computations, 0 for transfers
    num_options: np.ndarray  # (n,)
    total_blocking_w: float
    pareto: tuple[tuple[np.ndarray, np.ndarray], ...]  # per node: real-time Pareto (times ascending, option ids)

    @classmethod
    def of(cls, dag: ComputationDag) -> OptionTable:
        """Build the table of ``dag``."""
        n = len(dag.nodes)
        k = max(len(s.options) for s in dag.specs)
        t = np.full((n, k), np.inf)
        e = np.zeros((n, k))
        eff = np.zeros((n, k))
        num = np.zeros(n, dtype=np.int64)
        pareto = []
        for v, node in enumerate(dag.nodes):
            opts = dag.specs[node.spec].options
            num[v] = len(opts)
            t[v, : len(opts)] = [o.time_s for o in opts]
            if dag.is_computation(v):
                e[v, : len(opts)] = [o.energy_j for o in opts]
                eff[v, : len(opts)] = [o.energy_j - dag.blocking_w[node.stage] * o.time_s for o in opts]
            pareto.append(_pareto(t[v, : len(opts)], eff[v, : len(opts)]))
        return cls(t, e, eff, num, float(sum(dag.blocking_w)), tuple(pareto))


def _pareto(times: np.ndarray, costs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Options no other option beats in both time and cost: (times ascending, option ids); costs then fall."""
    keep: list[int] = []
    for i in sorted(range(len(times)), key=lambda i: (times[i], costs[i])):
        if not keep or costs[i] < costs[keep[-1]]:
            keep.append(i)
    return times[keep].copy(), np.asarray(keep, dtype=np.int64)


@dataclass(frozen=True)
class Evaluation:
    """Real iteration time (s), energy with blocking until that time (J, Eq. 3) and effective energy (J, Eq. 4)."""

    time_s: float
    energy_j: float
    effective_j: float


def earliest(dag: ComputationDag, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start and finish of every node for a batch of node times (``k × n``), as ``k × n`` arrays."""
    es = np.zeros_like(times)
    ef = np.zeros_like(times)
    for v, ps in enumerate(dag.preds):
        if len(ps) == 1:
            es[:, v] = ef[:, ps[0]]
        elif ps:
            es[:, v] = ef[:, list(ps)].max(axis=1)
        ef[:, v] = es[:, v] + times[:, v]
    return es, ef


def evaluate_batch(dag: ComputationDag, table: OptionTable, choice: np.ndarray) -> tuple[np.ndarray, ...]:
    """(time_s, energy_j, effective_j) arrays for a batch of choices (``k × n``)."""
    choice = np.atleast_2d(choice)
    rows = np.arange(choice.shape[1])
    times = table.time_s[rows, choice]
    _, ef = earliest(dag, times)
    makespan = ef.max(axis=1)
    eff = table.effective_j[rows, choice].sum(axis=1)
    return makespan, eff + table.total_blocking_w * makespan, eff


def evaluate_choice(dag: ComputationDag, choice: np.ndarray | list[int],
                    table: OptionTable | None = None) -> Evaluation:
    """Evaluate one choice."""
    t, e, eff = evaluate_batch(dag, table or OptionTable.of(dag), np.asarray(choice)[None, :])
    return Evaluation(float(t[0]), float(e[0]), float(eff[0]))


def fastest_choice(dag: ComputationDag) -> np.ndarray:
    """Every node at its fastest option (all clocks at maximum)."""
    return np.asarray([dag.specs[n.spec].options.index(dag.specs[n.spec].fastest) for n in dag.nodes])


def latest(dag: ComputationDag, times: np.ndarray, makespan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latest start and finish of every node for a batch of node times (``k × n``) and makespans (``k``)."""
    ls = np.zeros_like(times)
    lf = np.zeros_like(times)
    for v in range(len(dag.nodes) - 1, -1, -1):
        succ = dag.succs[v]
        if len(succ) == 1:
            lf[:, v] = ls[:, succ[0]]
        elif succ:
            lf[:, v] = ls[:, list(succ)].min(axis=1)
        else:
            lf[:, v] = makespan
        ls[:, v] = lf[:, v] - times[:, v]
    return ls, lf


def _slow_within(table: OptionTable, choice: np.ndarray, v: int, limit: np.ndarray) -> bool:
    """Give node v, in every row, its cheapest option not longer than ``limit``; True if any row changed."""
    times, ids = table.pareto[v]
    k = np.searchsorted(times, limit * (1 + 1e-12), side="right") - 1  # slowest Pareto option that fits
    fits = k >= 0
    best = ids[np.maximum(k, 0)]
    better = fits & (table.effective_j[v, best] < table.effective_j[v, choice[:, v]] - 1e-12)
    choice[better, v] = best[better]
    return bool(better.any())


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
    movable = [v for v in range(len(dag.nodes)) if table.num_options[v] > 1 and dag.is_computation(v)]
    for _ in range(rounds):
        changed = False
        times = table.time_s[rows, choice]
        es, ef = earliest(dag, times)
        makespan = ef.max(axis=1)
        for v in movable:
            succ = dag.succs[v]
            limit = (es[:, list(succ)].min(axis=1) if succ else makespan) - es[:, v]
            changed |= _slow_within(table, choice, v, limit)
        times = table.time_s[rows, choice]
        _ls, lf = latest(dag, times, makespan)
        for v in movable:
            preds = dag.preds[v]
            limit = lf[:, v] - (lf[:, list(preds)].max(axis=1) if preds else 0.0)
            changed |= _slow_within(table, choice, v, limit)
        if not changed:
            break
    return choice


def fit_deadlines(dag: ComputationDag, table: OptionTable, choice: np.ndarray, deadline: np.ndarray) -> np.ndarray:
    """Give every computation the cheapest option that still finishes by its ``deadline`` (s, ``k × n``) when
    started as early as the choices made so far allow (topological order); ``choice`` is kept where nothing
    cheaper fits. With deadlines from a feasible plan this never lengthens it, and it uses the slack that
    predecessors leave when they finish before their planned time."""
    choice = np.array(np.atleast_2d(choice), copy=True)
    finish = np.zeros(choice.shape, dtype=float)
    for v, preds in enumerate(dag.preds):
        start = finish[:, list(preds)].max(axis=1) if preds else np.zeros(len(choice))
        if table.num_options[v] > 1 and dag.is_computation(v):
            _slow_within(table, choice, v, deadline[:, v] - start)
        finish[:, v] = start + table.time_s[v, choice[:, v]]
    return choice


class LongestPath:
    """Earliest finishes and one longest path of ``dag`` under node ``times`` (s), kept up to date when single
    node times change (:meth:`set_time` re-propagates only to the descendants whose finish moves). Ties are broken
    exactly as :func:`critical_path` breaks them, so both give the same path."""

    def __init__(self, dag: ComputationDag, times: list[float]) -> None:
        self.dag = dag
        self.times = list(times)
        n = len(dag.nodes)
        self.ef = [0.0] * n
        self.arg = [-1] * n
        for v in range(n):
            self._update(v)

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
        """Change node v's time and propagate (topological order = node id order)."""
        import heapq

        self.times[v] = seconds
        heap = [v]
        queued = {v}
        succs = self.dag.succs
        while heap:
            u = heapq.heappop(heap)
            if self._update(u) or u == v:
                for w in succs[u]:
                    if w not in queued:
                        queued.add(w)
                        heapq.heappush(heap, w)

    def path(self) -> tuple[list[int], float]:
        """(nodes of one longest path, its length), as :func:`critical_path` returns them."""
        makespan = max(self.ef)
        v = self.ef.index(makespan)
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
