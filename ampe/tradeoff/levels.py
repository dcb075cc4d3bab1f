"""Topological levels of a DAG, for longest-path passes vectorised over nodes as well as over a batch.

A node's level is the length (in nodes) of the longest chain of predecessors before it, so every node's
predecessors lie on earlier levels and its successors on later ones: one level's nodes are updated together with one
gather over a padded predecessor (or successor) matrix. A 1F1B pipeline of N stages and M micro-batches has about
2(M + N) levels for 2NM computations, so a pass costs O(M + N) numpy calls instead of O(NM) Python steps.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, eq=False)  # holds arrays
class Level:
    """One level: its ``nodes`` and their predecessors / successors padded with the dummy node id n."""

    nodes: np.ndarray  # (L,) int64
    preds: np.ndarray  # (L, max in-degree) int64, padded with n; width 0 when no node has predecessors
    succs: np.ndarray  # (L, max out-degree) int64, padded with n


@dataclass(frozen=True, eq=False)
class Levels:
    """The levels of a DAG with ``n`` nodes, first to last."""

    n: int
    levels: tuple[Level, ...]
    preds: np.ndarray  # (n, max in-degree): every node's predecessors, padded with n
    succs: np.ndarray  # (n, max out-degree): every node's successors, padded with n
    # The same in level order (for passes over contiguous slices): the nodes level after level, each node's position
    # in that order (n: n), and per level (first, end, predecessor positions, successor positions), padded with n.
    order: np.ndarray
    position: np.ndarray
    slices: tuple[tuple[int, int, np.ndarray, np.ndarray], ...]

    def freeze(self) -> None:
        """Make every array read-only (levels shared by several DAGs)."""
        arrays = [self.preds, self.succs, self.order, self.position]
        for lv in self.levels:
            arrays += [lv.nodes, lv.preds, lv.succs]
        for _, _, p, s in self.slices:
            arrays += [p, s]
        for a in arrays:
            a.flags.writeable = False

    @classmethod
    def of(cls, preds: Sequence[Sequence[int]], succs: Sequence[Sequence[int]]) -> Levels:
        """Levels of the DAG given by predecessor and successor lists (nodes in topological order)."""
        n = len(preds)
        depth = np.zeros(n, dtype=np.int64)
        for v, ps in enumerate(preds):
            if ps:
                depth[v] = max(depth[p] for p in ps) + 1
        order = np.argsort(depth, kind="stable")
        bounds = np.searchsorted(depth[order], np.arange(int(depth.max(initial=-1)) + 2))
        all_preds, all_succs = _padded(list(preds), n), _padded(list(succs), n)
        n_preds = (all_preds < n).sum(axis=1)
        n_succs = (all_succs < n).sum(axis=1)
        out = []
        position = np.empty(n + 1, dtype=np.int64)
        position[order] = np.arange(n)
        position[n] = n
        slices = []
        for a, b in itertools.pairwise(bounds.tolist()):
            nodes = order[a:b]  # each level's matrices: the rows of the whole ones, as wide as the level needs
            lv = Level(nodes, all_preds[nodes, : int(n_preds[nodes].max(initial=0))],
                       all_succs[nodes, : int(n_succs[nodes].max(initial=0))])
            out.append(lv)
            slices.append((a, b, position[lv.preds], position[lv.succs]))
        return cls(n, tuple(out), all_preds, all_succs, order, position, tuple(slices))


def _padded(lists: list[Sequence[int]], fill: int) -> np.ndarray:
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    out = np.full((len(lists), int(lengths.max(initial=0))), fill, dtype=np.int64)
    flat = np.fromiter(itertools.chain.from_iterable(lists), dtype=np.int64, count=int(lengths.sum()))
    starts = np.cumsum(lengths) - lengths
    out[np.repeat(np.arange(len(lists)), lengths), np.arange(len(flat)) - np.repeat(starts, lengths)] = flat
    return out


def earliest(levels: Levels, times: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Earliest start and finish of every node for a batch of node times (``k × n``), as ``k × n`` arrays.
    (Computed in level order, where every level is a contiguous slice; the same sums and maxima as node by node.)"""
    k, n = times.shape
    t = times[:, levels.order]
    es = np.zeros((k, n + 1), dtype=times.dtype)
    ef = np.zeros((k, n + 1), dtype=times.dtype)  # column n: the dummy predecessor, finishing at 0
    for a, b, preds, _ in levels.slices:
        if preds.shape[1]:
            start = ef[:, preds].max(axis=2)
            es[:, a:b] = start
            ef[:, a:b] = start + t[:, a:b]
        else:
            ef[:, a:b] = es[:, a:b] + t[:, a:b]
    pos = levels.position[:n]
    return es[:, pos], ef[:, pos]


def latest(levels: Levels, times: np.ndarray, makespan: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Latest start and finish of every node for a batch of node times (``k × n``) and makespans (``k``)."""
    k, n = times.shape
    t = times[:, levels.order]
    ls = np.zeros((k, n + 1), dtype=times.dtype)
    lf = np.zeros((k, n + 1), dtype=times.dtype)
    ls[:, n] = makespan  # the dummy successor starts at the makespan
    for a, b, _, succs in reversed(levels.slices):
        finish = ls[:, succs].min(axis=2) if succs.shape[1] else makespan[:, None]
        lf[:, a:b] = finish
        ls[:, a:b] = finish - t[:, a:b]
    pos = levels.position[:n]
    return ls[:, pos], lf[:, pos]
