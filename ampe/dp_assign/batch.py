""":func:`~ampe.dp_assign.exact.reaches_bands` for many band tables of one shape at once, with the same answers.

At pp = 32 a bound walk is numpy-call-bound: each pass is three small numpy calls per stage. Here every table runs
the same walk as :func:`~ampe.dp_assign.exact.reaches_bands` (written as a generator that asks for its passes), and
the passes asked for at the same step by several tables run as one pass over the tables stacked on a leading axis:
the stage loop runs once for all of them. Each table's pass sees its own rows and caps; rows one table lacks
(another has more) are +inf, which changes no minimum and no first minimum, so every value and every partition
read back equals the single pass's, and so does every answer.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ampe.dp_assign import _kernels as K
from ampe.dp_assign.exact import _SLACK, Bands, reaches_bands, stage_ceiling

# A pass asked for: (kind "sum" | "max", table "t" | "y", time cap, sync cap or inf (none)).
_Ask = tuple[str, str, float, float]
_Walk = Generator[_Ask, object, float]


class _Item:
    """One table's walk state: its band tables (unpadded) and what the batched passes read of it."""

    def __init__(self, b: Bands, limit: float) -> None:
        self.b = b
        self.seg_t = b.seg_t
        self.short_t = b.shortest_t if b.shortest_t is not None else b.seg_t.min(axis=(0, 2))
        self.seg_y: np.ndarray | None = None
        self.short_y: np.ndarray | None = None
        self.gas = b.gas
        self.ceiling = stage_ceiling(limit, b.gas) if limit < K.INF else K.INF
        self.floor = -K.INF

    def syncs(self) -> np.ndarray:
        if self.seg_y is None:
            y = self.b.seg_y
            assert y is not None
            self.seg_y = y if isinstance(y, np.ndarray) else y()
            self.short_y = self.seg_y.min(axis=(0, 2))
        return self.seg_y


def _rows_below(shortest: np.ndarray, cap: float) -> int:
    hit = np.flatnonzero(shortest < cap)
    return int(hit[-1]) + 1 if len(hit) else 0


def _eq5(it: _Item, sync: float, stop_at: float, outer: bool = False
         ) -> Generator[_Ask, object, tuple[float, np.ndarray, bool]]:
    """``exact._solve_eq5`` with ``bound_only`` (the same steps), asking for its passes; ``outer``: the first walk
    (no sync caps: its B* is the later walks' floor)."""
    pp, _, _ = it.seg_t.shape
    gas1 = it.gas - 1
    r = yield ("sum", "t", min(K.INF, it.ceiling), sync)
    assert isinstance(r, tuple)
    g, starts = r
    if g == K.INF:
        return K.INF, starts, True
    b = float(K.stage_values(it.seg_t, starts).max())
    best, best_starts = gas1 * b + g, starts
    if gas1 == 0 or pp == 1:
        return best, best_starts, True
    if gas1 * it.floor + g >= stop_at:
        return stop_at, best_starts, False
    b_star = yield ("max", "t", min(float(np.nextafter(b, K.INF)), it.ceiling), sync)
    assert isinstance(b_star, float)
    if outer:
        it.floor = max(it.floor, b_star)
    if b_star < b and gas1 * b_star + g < min(best, stop_at):
        cap, g_last = b, g
        while True:
            bound = min(best, stop_at)
            cap = min(cap, (bound - g_last + _SLACK * abs(bound)) / gas1)
            if cap <= b_star:
                break
            r = yield ("sum", "t", min(cap, it.ceiling), sync)
            assert isinstance(r, tuple)
            g, starts = r
            if g == K.INF:
                break
            b = float(K.stage_values(it.seg_t, starts).max())
            if gas1 * b + g < best:
                best, best_starts = gas1 * b + g, starts
            cap, g_last = b, g
    if best < stop_at:
        return best, best_starts, True
    return stop_at, best_starts, False


def _walk(it: _Item, limit: float) -> _Walk:
    """``exact.reaches_bands`` on non-negative tables: the Eq. 5 walk, then the sync walk when needed; returns the
    value the single walk compares with ``limit``."""
    first = yield from _eq5(it, K.INF, limit, outer=True)
    if first[0] >= limit or it.b.seg_y is None:
        return first[0]
    seg_y = it.syncs()
    h, starts, exact = first
    if h == K.INF:
        return K.INF
    if not exact:
        return h
    y = float(K.stage_values(seg_y, starts).max())
    best = h + y
    y_star = yield ("max", "y", float(np.nextafter(y, K.INF)), K.INF)
    assert isinstance(y_star, float)
    if y_star >= y:
        return best
    if h + y_star >= limit:
        return h + y_star
    cap, h_last = y, h
    while True:
        bound = min(best, limit)
        cap = min(cap, bound - h_last + _SLACK * abs(bound))
        if cap <= y_star:
            return best
        h, starts, exact = yield from _eq5(it, cap, bound - y_star)
        if h == K.INF or not exact:
            return best
        y = float(K.stage_values(seg_y, starts).max())
        best = min(best, h + y)
        cap, h_last = y, h


def _stack(segs: list[np.ndarray], depth: int) -> np.ndarray:
    """(n, pp, depth, W) of the tables' first ``depth`` rows, +inf rows where a table has fewer."""
    pp, _, w = segs[0].shape
    out = np.full((len(segs), pp, depth, w), K.INF)
    for i, s in enumerate(segs):
        d = min(depth, s.shape[1])
        out[i, :, :d] = s[:, :d]
    return out


def _shifted(n: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(n, W) running-cost rows and a read-only (n, W, W) view with ``[i, d, b] = tail[i, b - d]`` (+inf, b < d)."""
    buf = np.full((n, 2 * w - 1), K.INF)
    tail = buf[:, w - 1:]
    shifted = as_strided(tail, shape=(n, w, w), strides=(buf.strides[0], -buf.strides[1], buf.strides[1]),
                         writeable=False)
    return tail, shifted


class _Stacks:
    """The tables of one batch stacked once: (n, pp, D, W) segment times, and syncs when first asked for (+inf rows
    where a table has fewer)."""

    def __init__(self, items: list[_Item]) -> None:
        self.items = items
        self.t = _stack([it.seg_t for it in items], max(it.seg_t.shape[1] for it in items))
        self.y: np.ndarray | None = None
        self.cut = np.stack([it.b.cut for it in items])

    def syncs(self) -> np.ndarray:
        if self.y is None:
            segs = [it.syncs() if it.b.seg_y is not None else np.full_like(it.seg_t, K.INF) for it in self.items]
            self.y = _stack(segs, self.t.shape[2])
        return self.y


def _depth(it: _Item, ask: _Ask) -> int:
    """Rows of ``it``'s table that a pass for ``ask`` reads (``_kernels._capped``'s D)."""
    _, table, tcap, scap = ask
    if table == "y" or scap < K.INF:
        it.syncs()
    d = _rows_below(it.short_t if table == "t" else it.short_y, tcap)  # type: ignore[arg-type]
    if scap < K.INF:
        d = min(d, _rows_below(it.short_y, scap))  # type: ignore[arg-type]
    return d


def _run_passes(st: _Stacks, idx: list[int], asks: list[_Ask]) -> list[object]:
    """One batched pass for ``asks`` of the items ``idx`` of ``st`` (all of one kind, table and with or without
    sync caps)."""
    items = [st.items[i] for i in idx]
    kind, table, _, _ = asks[0]
    with_sync = asks[0][3] < K.INF
    depth = max(_depth(it, a) for it, a in zip(items, asks, strict=True))
    n = len(items)
    pp, w = st.t.shape[1], st.t.shape[3]
    if depth == 0:
        return [(K.INF, np.zeros(0, dtype=np.int64)) if kind == "sum" else K.INF for _ in items]
    every = len(idx) == len(st.items)
    sel = np.asarray(idx)
    full = st.t if table == "t" else st.syncs()
    seg = full[:, :, :depth] if every else full[sel, :, :depth]
    tcaps = np.array([a[2] for a in asks])[:, None, None, None]
    if np.any(tcaps < K.INF):
        seg = np.where(seg < tcaps, seg, K.INF)
    if with_sync:
        ys = st.syncs()[:, :, :depth] if every else st.syncs()[sel, :, :depth]
        seg = np.where(ys < np.array([a[3] for a in asks])[:, None, None, None], seg, K.INF)
    tail, shifted = _shifted(n, w)
    shifted = shifted[:, :depth]
    tail[:, :depth] = np.diagonal(seg[:, 0], axis1=1, axis2=2)[:, :depth]
    least = np.minimum.reduce
    if kind == "max":
        m = np.empty((n, depth, w))
        for j in range(1, pp):
            np.maximum(seg[:, j], shifted, out=m)
            least(m, axis=1, out=tail)
        return [float(v) for v in tail[:, w - 1]]
    cut = st.cut if every else st.cut[sel]
    ms = np.empty((n, pp, depth, w))
    for j in range(1, pp):
        np.add(tail, cut[:, j - 1], out=tail)
        np.add(seg[:, j], shifted, out=ms[:, j])
        least(ms[:, j], axis=1, out=tail)
    values = tail[:, w - 1].copy()
    starts = np.zeros((n, pp), dtype=np.int64)
    b = np.full(n, w - 1, dtype=np.int64)
    rows = np.arange(n)
    for j in range(pp - 1, 0, -1):
        b = np.maximum(b - ms[rows, j, :, b].argmin(axis=1), 0)
        starts[:, j] = b
    return [(float(v), np.zeros(0, dtype=np.int64)) if v == K.INF else (float(v), starts[i].copy())
            for i, v in enumerate(values)]


def reaches_bands_many(tables: Sequence[Bands], limit: float) -> list[bool]:
    """``[reaches_bands(b, limit) for b in tables]`` (the same answers): tables of one shape (pp, W) with every
    cost ≥ 0 walk together, their passes batched; any other table walks alone."""
    out: list[bool | None] = [None] * len(tables)
    shapes = {(b.seg_t.shape[0], b.seg_t.shape[2]) for b in tables if b.nonnegative}
    shape = next(iter(shapes)) if len(shapes) == 1 else None
    batched: list[int] = []
    for i, b in enumerate(tables):
        if (not b.nonnegative or limit >= K.INF or shape is None or b.seg_t.shape[0] < 2
                or (b.seg_t.shape[0], b.seg_t.shape[2]) != shape):
            out[i] = reaches_bands(b, limit)
        else:
            batched.append(i)
    if not batched:
        return [bool(o) for o in out]
    items = [_Item(tables[i], limit) for i in batched]
    st = _Stacks(items)
    walks = [_walk(it, limit) for it in items]
    asks: dict[int, _Ask] = {}
    done: list[bool | None] = [None] * len(items)
    for k, walk in enumerate(walks):
        _advance(k, walk, None, asks, done, limit, first=True)
    while asks:
        groups: dict[tuple[str, str, bool, int], list[int]] = {}
        for k, a in asks.items():  # (k ascending: sorted below); similar depths together (less padding)
            groups.setdefault((a[0], a[1], a[3] < K.INF, _depth(items[k], a).bit_length()), []).append(k)
        for idx in groups.values():
            idx.sort()
            results = _run_passes(st, idx, [asks[k] for k in idx])
            for k, r in zip(idx, results, strict=True):
                del asks[k]
                _advance(k, walks[k], r, asks, done, limit)
    for k, i in enumerate(batched):
        out[i] = done[k]
    assert all(o is not None for o in out)
    return [bool(o) for o in out]


def _advance(i: int, walk: _Walk, result: object, asks: dict[int, _Ask], out: list[bool | None], limit: float,
             first: bool = False) -> None:
    try:
        asks[i] = next(walk) if first else walk.send(result)
    except StopIteration as stop:
        out[i] = bool(stop.value >= limit)
