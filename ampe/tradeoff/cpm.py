"""Critical-path bookkeeping for Phillips–Dessouky, updated incrementally (the hot loop of the planner).

For integer durations d, ``es[v]`` is the earliest start of operation v and ``tail[v]`` the longest path from v's
start to the end of the DAG (including d[v]); v is critical iff es[v] + tail[v] equals the makespan.

A full recomputation is a Python pass over every operation. After a PD step most values are known in closed form
instead: a critical operation whose start lies on the T side of the cut starts δ units earlier, one on the S side
keeps its start, and its tail is the new makespan minus its start. Only *non-critical* operations are recomputed
in Python, and they are few once PD has slowed everything with slack down (an energy-optimal schedule leaves
almost no slack). The closed form can be wrong in tie cases (a cut that crosses a dependency T→S, or "slows" an
operation already at its longest duration); every update is therefore verified exactly and vectorised: each
value must satisfy all its edge constraints and be attained by one of them. A failed check falls back to the
full pass, so results never depend on the shortcut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# DAGs up to this many operations are re-timed by a full Python pass per PD step: for them the vectorised checks of
# the incremental update (a few dozen numpy calls) cost more than the pass itself (break-even near 256, measured)
_FULL_PASS_MAX = 128


@dataclass(frozen=True)
class Graph:
    """Operations 0..n−1 in topological order; edge i runs ``src[i] → dst[i]`` with a constant ``lag[i]``."""

    n: int
    src: np.ndarray
    dst: np.ndarray
    lag: np.ndarray

    @classmethod
    def of(cls, preds: tuple[tuple[int, ...], ...], lags: tuple[tuple[int, ...], ...]) -> Graph:
        """Build from per-operation predecessor and lag tuples."""
        return cls(len(preds),
                   np.asarray([u for ps in preds for u in ps], dtype=np.int64),
                   np.asarray([v for v, ps in enumerate(preds) for _ in ps], dtype=np.int64),
                   np.asarray([x for ls in lags for x in ls], dtype=np.int64))


class _Grouped:
    """Edges grouped by one endpoint, for vectorised per-node maxima (``np.maximum.reduceat``)."""

    def __init__(self, key: np.ndarray, n: int) -> None:
        self.order = np.argsort(key, kind="stable")
        k = key[self.order]
        self.nodes = np.flatnonzero(np.bincount(k, minlength=n))  # sorted keys (np.unique imports numpy.ma)
        self.starts = np.searchsorted(k, self.nodes)
        self.has = np.zeros(n, dtype=bool)
        self.has[self.nodes] = True

    def max(self, values: np.ndarray, n: int) -> np.ndarray:
        """Per-node maximum of ``values`` (one per edge); 0 for nodes without edges."""
        out = np.zeros(n, dtype=np.int64)
        if len(self.nodes):
            out[self.nodes] = np.maximum.reduceat(values[self.order], self.starts)
        return out


class Schedule:
    """Earliest starts, tails, makespan and critical set of a DAG under integer durations."""

    def __init__(self, graph: Graph, durations: np.ndarray) -> None:
        self.graph = graph
        n = graph.n
        self._preds: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        self._succs: list[list[tuple[int, int]]] = [[] for _ in range(n)]
        for u, v, lag in zip(graph.src.tolist(), graph.dst.tolist(), graph.lag.tolist(), strict=False):
            self._preds[v].append((u, lag))
            self._succs[u].append((v, lag))
        self._by_dst = _Grouped(graph.dst, n)
        self._by_src = _Grouped(graph.src, n)
        self.full_passes = 0
        self.recompute(np.asarray(durations, dtype=np.int64))

    # -- full passes -------------------------------------------------------------------------------------------
    def _forward(self, d: list[int], es: list[int], nodes) -> None:
        preds = self._preds
        for v in nodes:
            best = 0
            for u, lag in preds[v]:
                x = es[u] + d[u] + lag
                if x > best:
                    best = x
            es[v] = best

    def _backward(self, d: list[int], tail: list[int], nodes) -> None:
        succs = self._succs
        for v in nodes:
            best = 0
            for s, lag in succs[v]:
                x = lag + tail[s]
                if x > best:
                    best = x
            tail[v] = d[v] + best

    def recompute(self, durations: np.ndarray) -> None:
        """Full forward and backward pass."""
        self.full_passes += 1
        n = self.graph.n
        d = durations.tolist()
        es = [0] * n
        tail = [0] * n
        self._forward(d, es, range(n))
        self._backward(d, tail, range(n - 1, -1, -1))
        self._set(durations, np.asarray(es, dtype=np.int64), np.asarray(tail, dtype=np.int64))

    def _set(self, d: np.ndarray, es: np.ndarray, tail: np.ndarray) -> None:
        self.d = d
        self.es = es
        self.tail = tail
        self.makespan = int((es + d).max()) if len(d) else 0
        self.critical = es + tail == self.makespan

    # -- incremental update ------------------------------------------------------------------------------------
    def _exact_starts(self, d: np.ndarray, es: np.ndarray) -> bool:
        """True iff ``es`` are the earliest starts under ``d``: feasible on every edge and attained (or 0)."""
        g = self.graph
        arrive = es[g.src] + d[g.src] + g.lag
        if (arrive > es[g.dst]).any():
            return False
        return bool(np.array_equal(self._by_dst.max(arrive, g.n), es))

    def _exact_tails(self, d: np.ndarray, tail: np.ndarray) -> bool:
        """True iff ``tail`` are the longest paths to the end under ``d`` (same test, backwards)."""
        g = self.graph
        return bool(np.array_equal(d + self._by_src.max(g.lag + tail[g.dst], g.n), tail))

    def advance(self, durations: np.ndarray, late: np.ndarray, delta: int) -> bool:
        """Adopt ``durations`` after a PD step of ``delta`` units in which the critical operations marked ``late``
        (start on the T side of the cut) start δ units earlier. Returns False, leaving the state unchanged, if the
        makespan would not drop by exactly ``delta`` (a non-critical path overtook: δ was too large)."""
        if self.graph.n <= _FULL_PASS_MAX:
            return self._advance_full(durations, delta)
        crit = self.critical
        loose = np.flatnonzero(~crit)
        es = self.es - delta * (crit & late)
        if len(loose):
            es_l = es.tolist()
            self._forward(durations.tolist(), es_l, loose.tolist())
            es = np.asarray(es_l, dtype=np.int64)
        if not self._exact_starts(durations, es):
            self.full_passes += 1
            es_l = [0] * self.graph.n
            self._forward(durations.tolist(), es_l, range(self.graph.n))
            es = np.asarray(es_l, dtype=np.int64)
        makespan = int((es + durations).max())
        if makespan != self.makespan - delta:
            return False
        tail = np.where(crit, makespan - es, 0)
        if len(loose):
            tail_l = tail.tolist()
            self._backward(durations.tolist(), tail_l, loose[::-1].tolist())
            tail = np.asarray(tail_l, dtype=np.int64)
        if not self._exact_tails(durations, tail):
            self.full_passes += 1
            tail_l = [0] * self.graph.n
            self._backward(durations.tolist(), tail_l, range(self.graph.n - 1, -1, -1))
            tail = np.asarray(tail_l, dtype=np.int64)
        self._set(durations, es, tail)
        return True

    def _advance_full(self, durations: np.ndarray, delta: int) -> bool:
        """:meth:`advance` by one full pass in Python: cheaper than the verified incremental update on small DAGs."""
        self.full_passes += 1
        n = self.graph.n
        d = durations.tolist()
        es = [0] * n
        self._forward(d, es, range(n))
        makespan = max(map(int.__add__, es, d)) if n else 0
        if makespan != self.makespan - delta:
            return False
        tail = [0] * n
        self._backward(d, tail, range(n - 1, -1, -1))
        self._set(durations, np.asarray(es, dtype=np.int64), np.asarray(tail, dtype=np.int64))
        return True

    # -- queries -----------------------------------------------------------------------------------------------
    def critical_edges(self) -> np.ndarray:
        """Mask of the edges on some critical path (both ends critical and the edge tight)."""
        g = self.graph
        return (self.critical[g.src] & self.critical[g.dst]
                & (self.es[g.src] + self.d[g.src] + g.lag == self.es[g.dst]))

    def longest_path(self, durations: np.ndarray) -> tuple[int, list[int]]:
        """Makespan under ``durations`` and one longest path (operation ids, source to sink)."""
        d = durations.tolist()
        n = self.graph.n
        es = [0] * n
        self._forward(d, es, range(n))
        v = max(range(n), key=lambda x: es[x] + d[x])
        total = es[v] + d[v]
        path = [v]
        while es[v] > 0:
            v = next(u for u, lag in self._preds[v] if es[u] + d[u] + lag == es[v])
            path.append(v)
        return total, path[::-1]

    def lag(self, u: int, v: int) -> int:
        """Lag of the edge u → v."""
        return next(lag for x, lag in self._preds[v] if x == u)
