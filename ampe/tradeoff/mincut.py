"""Minimum s–t cut with lower bounds on the critical DAG (Perseus Eq. 7–8, Algorithm 3), warm-started.

The capacity DAG has nodes s = 0, t = 1 and, for every critical operation v, in_v = 2 + 2k, out_v = 3 + 2k.
Arcs: in_v → out_v with bounds (l_v, u_v); out_u → in_v for every critical dependency, s → in_v for critical
operations starting at 0 and out_v → t for those ending at the makespan, all (0, ∞). The cut minimises
Σ_{S→T} u − Σ_{T→S} l.

Given a feasible flow f0 (l ≤ f0 ≤ u, conserved), every cut of the residual network (forward u − f0, backward
f0 − l) has capacity equal to its lower-bound cut value minus the constant value of f0, so a plain max flow on
the residual network finds the min cut. f0 is the previous step's max flow: after a step a sped-up (S→T)
operation carried f = u, which becomes its new lower bound when it crosses a hull vertex; a slowed-down (T→S) one
carried f = l, its new upper bound; arcs joining the critical DAG carry 0 and have lower bound 0 (a non-critical
operation is always at its longest duration). Only the small change of flow is augmented, which is what makes a
step cheap. When that argument does not hold (an arc carrying flow left the critical DAG, or a bound moved past
the flow), a feasible flow is first rebuilt with Algorithm 3's auxiliary max flow (s', t', t → s).
All capacities are integers below 2³¹ (scipy's max flow is int32); costs are scaled by the caller.

Small networks (≤ ``py_max_entries`` residual entries, :data:`PY_MAX_ENTRIES` by default; a caller sets it per
trace, e.g. to 0 to send every network to scipy) use a pure-Python Dinic: on them scipy's per-call overhead (about a
dozen sparse-matrix constructions and checks, ~1 ms) is most of a min cut's time, and not importing scipy saves
~0.2 s of start-up for the small pipelines (docs/energy.md §8). Both find a maximum flow; the min cut taken is the
set of nodes reachable from s in the final residual network, the unique source-minimal min cut, so the cut (and the
whole frontier) does not depend on which max flow was found.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INF_CAP = 1 << 30  # "infinite" capacity; finite capacities stay far below it
PY_MAX_ENTRIES = 3000  # residual entries (2 per arc) up to which the pure-Python max flow is used


class _Arcs:
    """CSR layout of arcs ``tails[i] → heads[i]`` plus their reverses, computed once per arc set."""

    def __init__(self, tails: np.ndarray, heads: np.ndarray, m: int, python: bool | None = None,
                 py_max_entries: int = PY_MAX_ENTRIES) -> None:
        self.tails, self.heads, self.m = tails, heads, m
        rows = np.concatenate([tails, heads])
        cols = np.concatenate([heads, tails])
        self.order = np.argsort(rows * m + cols, kind="stable")  # CSR position → arc entry
        self.indptr = np.zeros(m + 1, dtype=np.int32)
        np.cumsum(np.bincount(rows, minlength=m), out=self.indptr[1:])
        self.indices = cols[self.order].astype(np.int32)
        self.python = len(rows) <= py_max_entries if python is None else python
        if self.python:
            a = len(tails)
            position = np.empty(2 * a, dtype=np.int64)  # arc entry → CSR position
            position[self.order] = np.arange(2 * a)
            self._position = position
            self._py = (self.indptr.tolist(), self.indices.tolist(), rows[self.order].tolist(),
                        position[(self.order + a) % (2 * a)].tolist())

    def max_flow(self, fwd: np.ndarray, bwd: np.ndarray, s: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """Max flow from s to t with forward capacities ``fwd`` and reverse capacities ``bwd`` (one per arc).

        Returns (net flow on every arc, mask of nodes reachable from s in the final residual network).
        """
        if self.python:
            indptr, heads, tails, pair = self._py
            cap = np.concatenate([fwd, bwd]).astype(np.int64)
            res, seen = _dinic(indptr, heads, tails, pair, cap[self.order].tolist(), s, t)
            net = cap[: len(self.tails)] - np.asarray(res, dtype=np.int64)[self._position[: len(self.tails)]]
            return net, np.asarray(seen, dtype=bool)
        from scipy.sparse import csr_array  # lazily: ~0.2 s of imports that small pipelines never need
        from scipy.sparse.csgraph import breadth_first_order, maximum_flow

        m = self.m
        cap = np.concatenate([fwd, bwd])[self.order].astype(np.int32)
        flow = maximum_flow(csr_array((cap, self.indices, self.indptr), shape=(m, m)), s, t).flow
        if flow.nnz != len(cap) or not np.array_equal(flow.indices, self.indices):
            raise RuntimeError("unexpected max-flow structure")  # scipy merged or dropped arcs
        net = np.empty(len(cap), dtype=np.int64)
        net[self.order] = flow.data
        keep = cap.astype(np.int64) > flow.data  # residual arcs
        kept = np.concatenate([[0], np.cumsum(keep)])[self.indptr].astype(np.int32)
        residual = csr_array((np.ones(int(kept[-1]), dtype=np.int8), self.indices[keep], kept), shape=(m, m))
        reach = np.zeros(m, dtype=bool)
        reach[breadth_first_order(residual, s, directed=True, return_predecessors=False)] = True
        return net[: len(self.tails)], reach


def _dinic(indptr: list[int], heads: list[int], tails: list[int], pair: list[int], res: list[int], s: int,
           t: int) -> tuple[list[int], list[bool]]:
    """Dinic's max flow on a residual network in CSR order (``pair[p]``: the reverse entry of entry p), in place on
    the residual capacities ``res``. Returns (``res`` at the end, mask of nodes reachable from s in it)."""
    n = len(indptr) - 1
    while True:
        level = [-1] * n
        level[s] = 0
        queue = [s]
        for u in queue:  # breadth-first levels over positive residual capacity
            nxt = level[u] + 1
            for p in range(indptr[u], indptr[u + 1]):
                if res[p] > 0 and level[heads[p]] < 0:
                    level[heads[p]] = nxt
                    queue.append(heads[p])
        if level[t] < 0:
            return res, [lv >= 0 for lv in level]
        cur = indptr[:-1]  # current arc of every node (blocking flow: each arc is tried once per phase)
        path: list[int] = []
        u = s
        while True:
            if u == t:
                delta = min(map(res.__getitem__, path))
                cut = -1  # the first arc the augmentation saturates: the walk resumes from its tail
                for i, p in enumerate(path):
                    res[p] -= delta
                    res[pair[p]] += delta
                    if cut < 0 and res[p] == 0:
                        cut = i
                u = tails[path[cut]]
                del path[cut:]
                continue
            end = indptr[u + 1]
            p = cur[u]
            nxt = level[u] + 1
            while p < end and (res[p] <= 0 or level[heads[p]] != nxt):
                p += 1
            cur[u] = p
            if p < end:
                path.append(p)
                u = heads[p]
                continue
            if u == s:
                break
            level[u] = -1  # dead end for this phase
            back = path.pop()
            u = tails[back]
            cur[u] += 1


@dataclass
class _Structure:
    """Arc layout of one critical DAG (rebuilt only when the critical DAG changes)."""

    crit: np.ndarray  # critical operation ids
    dep: np.ndarray  # critical edge ids
    src_ops: np.ndarray  # critical operations starting at 0
    snk_ops: np.ndarray  # critical operations ending at the makespan
    arcs: _Arcs


class WarmMinCut:
    """Min cuts of a sequence of capacity DAGs, each warm-started from the previous max flow; networks of at most
    ``py_max_entries`` residual entries go to the pure-Python max flow."""

    def __init__(self, num_ops: int, edge_src: np.ndarray, edge_dst: np.ndarray,
                 py_max_entries: int = PY_MAX_ENTRIES) -> None:
        self.n = num_ops
        self.py_max_entries = py_max_entries
        self.edge_src = edge_src
        self.edge_dst = edge_dst
        self.f_op = np.zeros(num_ops, dtype=np.int64)  # flow through each operation (in_v → out_v)
        self.f_dep = np.zeros(len(edge_src), dtype=np.int64)  # through each dependency (out_u → in_v)
        self.f_src = np.zeros(num_ops, dtype=np.int64)  # s → in_v
        self.f_snk = np.zeros(num_ops, dtype=np.int64)  # out_v → t
        self.cold_starts = 0
        self._key: tuple | None = None
        self._st: _Structure | None = None
        self._same = False  # the last structure is the one before it: the flow lies on its arcs only

    def _structure(self, crit: np.ndarray, crit_edge: np.ndarray, src_ops: np.ndarray,
                   snk_ops: np.ndarray) -> _Structure:
        key = (crit.tobytes(), crit_edge.tobytes(), src_ops.tobytes(), snk_ops.tobytes())
        if key == self._key and self._st is not None:
            self._same = True
            return self._st
        self._same = False
        c = np.flatnonzero(crit)
        k = len(c)
        slot = np.full(self.n, -1, dtype=np.int64)
        slot[c] = np.arange(k)
        node_in = 2 + 2 * np.arange(k)
        dep = np.flatnonzero(crit_edge)
        tails = np.concatenate([node_in, node_in[slot[self.edge_src[dep]]] + 1, np.zeros(len(src_ops), np.int64),
                                node_in[slot[snk_ops]] + 1])
        heads = np.concatenate([node_in + 1, node_in[slot[self.edge_dst[dep]]], node_in[slot[src_ops]],
                                np.ones(len(snk_ops), np.int64)])
        self._key = key
        arcs = _Arcs(tails, heads, 2 + 2 * k, py_max_entries=self.py_max_entries)
        self._st = _Structure(c, dep, src_ops, snk_ops, arcs)
        return self._st

    def solve(self, crit: np.ndarray, crit_edge: np.ndarray, src_ops: np.ndarray, snk_ops: np.ndarray,
              lb: np.ndarray, ub: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Min cut of the capacity DAG: (S→T operations, T→S operations, mask of operations whose in-node is
        on the T side). ``lb``/``ub``: integer bounds of every operation (``INF_CAP`` = unbounded)."""
        st = self._structure(crit, crit_edge, src_ops, snk_ops)
        c = st.crit
        if not self._warm_flow_valid(st, lb, ub):
            self.cold_starts += 1
            self._feasible_flow(st, lb, ub)
        k = len(c)
        f_op = self.f_op[c]
        u = ub[c]
        n_inf = len(st.arcs.tails) - k
        fwd = np.concatenate([np.where(u >= INF_CAP, INF_CAP, u - f_op), np.full(n_inf, INF_CAP)])
        bwd = np.concatenate([f_op - lb[c], self.f_dep[st.dep], self.f_src[st.src_ops], self.f_snk[st.snk_ops]])
        g, reach = st.arcs.max_flow(fwd, bwd, 0, 1)
        self._add(st, g)
        node_in = 2 + 2 * np.arange(k)
        a, b = reach[node_in], reach[node_in + 1]
        late = np.zeros(self.n, dtype=bool)
        late[c] = ~a
        return c[a & ~b], c[b & ~a], late

    def _add(self, st: _Structure, g: np.ndarray) -> None:
        k, nd, ns = len(st.crit), len(st.dep), len(st.src_ops)
        self.f_op[st.crit] += g[:k]
        self.f_dep[st.dep] += g[k: k + nd]
        self.f_src[st.src_ops] += g[k + nd: k + nd + ns]
        self.f_snk[st.snk_ops] += g[k + nd + ns:]

    def _warm_flow_valid(self, st: _Structure, lb: np.ndarray, ub: np.ndarray) -> bool:
        """The stored flow is feasible on this critical DAG: conserved (no flow left on dropped arcs) and bounded."""
        c = st.crit
        f = self.f_op[c]
        if not ((f >= lb[c]) & (f <= ub[c])).all():
            return False
        if self._same:  # every flow so far was added on this structure's arcs: nothing left elsewhere
            return True
        total = int(self.f_op.sum() + self.f_dep.sum() + self.f_src.sum() + self.f_snk.sum())
        kept = int(self.f_op[c].sum() + self.f_dep[st.dep].sum() + self.f_src[st.src_ops].sum()
                   + self.f_snk[st.snk_ops].sum())
        return kept == total

    def _feasible_flow(self, st: _Structure, lb: np.ndarray, ub: np.ndarray) -> None:
        """Algorithm 3, first phase: a flow meeting every lower bound, via s' and t' and an infinite t → s arc."""
        self.f_op[:] = 0
        self.f_dep[:] = 0
        self.f_src[:] = 0
        self.f_snk[:] = 0
        c = st.crit
        k = len(c)
        l = lb[c]
        u = ub[c]
        a = st.arcs
        m = a.m
        excess = np.zeros(m, dtype=np.int64)
        np.add.at(excess, a.heads[:k], l)
        np.subtract.at(excess, a.tails[:k], l)
        pos = np.flatnonzero(excess > 0)
        neg = np.flatnonzero(excess < 0)
        s2, t2 = m, m + 1
        aux = _Arcs(np.concatenate([a.tails, np.full(len(pos), s2), neg, [1]]),
                    np.concatenate([a.heads, pos, np.full(len(neg), t2), [0]]), m + 2,
                    py_max_entries=self.py_max_entries)
        fwd = np.concatenate([np.where(u >= INF_CAP, INF_CAP, u - l), np.full(len(a.tails) - k, INF_CAP),
                              excess[pos], -excess[neg], [INF_CAP]])
        g, _ = aux.max_flow(fwd, np.zeros(len(fwd), dtype=np.int64), s2, t2)
        n_arcs = len(a.tails)
        if int(g[n_arcs: n_arcs + len(pos)].sum()) != int(excess[pos].sum()):
            raise RuntimeError("no flow meets the lower bounds: the current schedule is not optimal")
        g = g[:n_arcs].copy()
        g[:k] += l
        self._add(st, g)

