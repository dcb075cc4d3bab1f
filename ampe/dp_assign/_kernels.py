"""The hot loops of the exact assignment: one vectorised pass over the stages per call.

Every stage j must own at least one layer and leave one for each later stage, so it ends (exclusive) at a layer in
``j+1 .. j+W`` with ``W = L - pp + 1``. Shifting stage j's coordinates by j gives every stage the same table in
*band* layout: ``seg[j, d, b]`` = cost of the d+1 layers ``j+b-d .. j+b`` (stage j ends at window index b and
starts at window index ``b-d``; ``+inf`` where ``d > b`` or the stage does not fit). Stage j's end index b is stage
j+1's start index, so a pass is ``pp - 1`` broadcast-add-min steps.

Band layout is what makes capped passes cheap: under a cap on stage cost only the first D rows (stage lengths
1..D) can qualify, so a pass costs O(pp·D·W) instead of O(pp·W²); the Pareto walk in ``exact.py`` mostly runs
under tight caps where D ≈ 1.5·L/pp.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.lib.stride_tricks import as_strided

INF = np.inf
# The most entries of one band table (pp·W² float64). A DP keeps about five tables of this size at its peak (time,
# memory mask, option tables, the pass buffer), so 2**25 entries (256 MiB a table) bound it near 1.3 GB. The largest
# real models (~130 layers) need 2**19; 10,000 layers at pp 2 would need 2**27.6.
MAX_BAND_ENTRIES = 1 << 25


def band_entries(num_layers: int, pp: int) -> int:
    """Entries of the (pp, W, W) band table of ``num_layers`` layers over ``pp`` stages (W = L - pp + 1)."""
    w = max(0, num_layers - pp + 1)
    return pp * w * w


@dataclass(frozen=True, eq=False)
class Table:
    """A band-layout cost table and, per stage length d+1, the cheapest entry over all stages and ends."""

    seg: np.ndarray  # (pp, D, W) [j, d, b]: D = W, or fewer rows where the rest could never qualify
    shortest: np.ndarray  # (W,) min over j, b of seg[j, d, b]
    tail: np.ndarray  # (W,) scratch vector each pass step writes its running costs into
    shifted: np.ndarray  # (W, W) read-only view with shifted[d, b] = tail[b - d] (+inf where b < d)
    scratch: list[np.ndarray] = field(default_factory=list)  # the passes' (pp, D, W) work buffer, grown on demand

    @classmethod
    def of(cls, seg: np.ndarray, shortest: np.ndarray | None = None) -> Table:
        """Wrap ``seg`` (taken over, not copied; ``shortest``: its ``min(axis=(0, 2))`` when the caller has it). Not
        for concurrent use: passes share the scratch vector and buffer."""
        w = seg.shape[2]
        buf = np.full(2 * w - 1, INF)
        tail = buf[w - 1:]
        shifted = as_strided(tail, shape=(w, w), strides=(-buf.strides[0], buf.strides[0]), writeable=False)
        return cls(seg, seg.min(axis=(0, 2)) if shortest is None else shortest, tail, shifted)

    def rows_below(self, cap: float) -> int:
        """Number of leading rows D holding every entry ``< cap`` (0 when none)."""
        hit = np.flatnonzero(self.shortest < cap)
        return int(hit[-1]) + 1 if len(hit) else 0

    def work(self, depth: int) -> np.ndarray:
        """A (pp, depth, W) scratch buffer (a view of one kept across passes; contents undefined)."""
        pp, _, w = self.seg.shape
        if not self.scratch or self.scratch[0].shape[1] < depth:
            self.scratch[:] = [np.empty((pp, depth, w))]
        return self.scratch[0][:, :depth]


def band(prefix: np.ndarray, pp: int, rows: np.ndarray | None = None) -> np.ndarray:
    """(pp, W, W) band table of segment sums ``[j, d, b] = prefix[j, j+b+1] - prefix[j, j+b-d]``, +inf if d > b;
    ``rows``: only those stages j (in that order)."""
    num_layers = prefix.shape[1] - 1
    w = num_layers - pp + 1
    if rows is not None:
        sub = prefix[rows[:, None], rows[:, None] + np.arange(w + 1)[None, :]]  # each row's window, as below
        pad = np.full((len(rows), 2 * w), -INF)
        pad[:, w:] = sub[:, :w]
        step = pad.strides[1]
        start = as_strided(pad[:, w:], shape=(len(rows), w, w), strides=(pad.strides[0], -step, step),
                           writeable=False)
        seg = np.subtract(sub[:, None, 1:], start)
        if not np.isfinite(sub).all():
            np.copyto(seg, INF, where=np.tri(w, dtype=bool).T[None, :, :] == 0)
        return seg
    # Stage j's window prefix[j, j .. j+W] (a strided view), padded on the left so that row d of a second strided
    # view reads it shifted by d: one subtraction fills the table, no index arrays.
    # The padding is -inf, so entries with d > b come out as finite - (-inf) = +inf: no mask pass when every
    # prefix value is finite.
    pad = np.full((pp, 2 * w), -INF)
    win = as_strided(prefix, shape=(pp, w + 1), strides=(prefix.strides[0] + prefix.strides[1], prefix.strides[1]))
    pad[:, w:] = win[:, :w]
    step = pad.strides[1]
    start = as_strided(pad[:, w:], shape=(pp, w, w), strides=(pad.strides[0], -step, step), writeable=False)
    seg = np.subtract(win[:, None, 1:], start)
    if not np.isfinite(win).all():
        np.copyto(seg, INF, where=np.tri(w, dtype=bool).T[None, :, :] == 0)
    return seg


def _windows(values: np.ndarray, rows: np.ndarray, offset: int, width: int) -> np.ndarray:
    """(n, width) ``[i, c] = values[j, j + offset + c]`` for each stage j of ``rows``."""
    return values[rows[:, None], rows[:, None] + offset + np.arange(width)[None, :]]


def band_at_start(values: np.ndarray, pp: int, num_layers: int, rows: np.ndarray | None = None) -> np.ndarray:
    """(n, W, W) read-only band view ``[j, d, b] = values[j, j+b-d]``: a per-column (start) or per-layer value at
    the stage's first layer; 0 where d > b. ``rows``: only those stages (all: 0..pp-1)."""
    w = num_layers - pp + 1
    win = _windows(values, np.arange(pp) if rows is None else rows, 0, w)
    pad = np.zeros((win.shape[0], 2 * w))
    pad[:, w:] = win
    step = pad.strides[1]
    return as_strided(pad[:, w:], shape=(win.shape[0], w, w), strides=(pad.strides[0], -step, step),
                      writeable=False)


def band_at_end(values: np.ndarray, pp: int, num_layers: int, rows: np.ndarray | None = None) -> np.ndarray:
    """(n, 1, W) ``[j, 0, b] = values[j, j+b+1]``: a per-column value at the stage's end (the column after its last
    layer), to broadcast over the band's rows."""
    return _windows(values, np.arange(pp) if rows is None else rows, 1, num_layers - pp + 1)[:, None, :]


def band_range_max(values: np.ndarray, pp: int, num_layers: int, rows: np.ndarray | None = None) -> np.ndarray:
    """(n, W, W) ``[j, d, b]`` = the largest of the per-layer ``values[j, j+b-d .. j+b]`` (the stage's layers);
    finite where d > b."""
    return np.maximum.accumulate(band_at_start(values, pp, num_layers, rows), axis=1)


def window_transfer(transfer: np.ndarray, pp: int, num_layers: int) -> np.ndarray:
    """(pp-1, W) cut costs ``[j, a]`` = boundary j when stage j+1 starts at layer j+1+a."""
    w = num_layers - pp + 1
    cols = np.arange(1, pp)[:, None] + np.arange(w)[None, :]
    return np.take_along_axis(transfer, cols, axis=1)


@dataclass(frozen=True)
class Caps:
    """Strict caps: stage cost ``< time`` and, when a sync table is given, stage sync ``< sync``."""

    time: float = INF
    sync: float = INF
    syncs: Table | None = None


def _capped(table: Table, caps: Caps) -> tuple[np.ndarray, int]:
    """The first D rows of every stage with entries over a cap set to +inf, and D (rows beyond D all fail a cap)."""
    depth = table.rows_below(caps.time)
    syncs = caps.syncs if caps.sync < INF else None
    if syncs is not None:
        depth = min(depth, syncs.rows_below(caps.sync))
    rows = table.seg[:, :depth]
    if depth and caps.time < INF:
        rows = np.where(rows < caps.time, rows, INF)
    if depth and syncs is not None:
        rows = np.where(syncs.seg[:, :depth] < caps.sync, rows, INF)
    return rows, depth


def min_sum(table: Table, cut: np.ndarray, caps: Caps = Caps()) -> tuple[float, np.ndarray]:
    """Minimum of Σ stage cost + Σ cut cost over partitions whose every stage satisfies ``caps``.

    Returns (value, starts) where ``starts[j]`` is stage j's window start index (starts[0] = 0), or (inf, empty)
    when no partition qualifies. This is the hot loop: three numpy calls per stage, no per-layer Python (the
    running costs live in the table's scratch vector; each stage's candidates are kept, and the chosen start is
    read back only along the optimal path: the first minimum, as ``argmin`` over every column would give).
    """
    pp, _, w = table.seg.shape
    seg, depth = _capped(table, caps)
    if depth == 0:
        return INF, np.zeros(0, dtype=np.int64)
    tail, shifted = table.tail, table.shifted[:depth]
    _first_stage(tail, seg, depth)
    ms = table.work(depth)
    add, least = np.add, np.minimum.reduce
    for j in range(1, pp):
        m = ms[j]
        add(tail, cut[j - 1], out=tail)
        add(seg[j], shifted, out=m)
        least(m, axis=0, out=tail)
    value = float(tail[w - 1])
    if value == INF:
        return value, np.zeros(0, dtype=np.int64)
    starts = np.zeros(pp, dtype=np.int64)
    b = w - 1
    for j in range(pp - 1, 0, -1):
        b -= int(ms[j, :, b].argmin())
        starts[j] = b
    return value, starts


def min_max(table: Table, caps: Caps = Caps()) -> float:
    """Smallest achievable largest stage cost over partitions whose stages satisfy ``caps`` (inf if none)."""
    pp, _, w = table.seg.shape
    seg, depth = _capped(table, caps)
    if depth == 0:
        return INF
    tail, shifted = table.tail, table.shifted[:depth]
    _first_stage(tail, seg, depth)
    m = table.work(depth)[0]
    big, least = np.maximum, np.minimum.reduce
    for j in range(1, pp):
        big(seg[j], shifted, out=m)
        least(m, axis=0, out=tail)
    return float(tail[w - 1])


def _first_stage(out: np.ndarray, seg: np.ndarray, depth: int) -> None:
    """Stage 0 starts at layer 0, so it ends at b with d = b: the diagonal, +inf where capped or beyond D (into
    ``out``)."""
    out.fill(INF)
    out[:depth] = np.diagonal(seg[0])[:depth]


def stage_values(seg: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Per-stage entries of a band table for the partition given by window start indices."""
    pp, _, w = seg.shape
    ends = np.append(starts[1:], w - 1)
    return seg[np.arange(pp), ends - starts, ends]


def boundaries(starts: np.ndarray, num_layers: int) -> tuple[int, ...]:
    """DeepSpeed ``parts`` from window start indices."""
    pp = len(starts)
    return (0, *tuple(int(j + starts[j]) for j in range(1, pp)), num_layers)
