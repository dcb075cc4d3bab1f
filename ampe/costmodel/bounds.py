"""A pipeline stage's memory as a function of the layers it holds: the form of the layer-assignment DP's memory
constraint (:mod:`ampe.dp_assign`), built from the estimate's terms by :mod:`ampe.costmodel.dp_memory`.

Position p (a pipeline stage, or one chunk of an interleaved device) holding layers a..b-1 meets a
:class:`MemoryBound` when::

    max_f (head[f, p, a] + tail[f, p, b]) + max(peak[p, a], …, peak[p, b-1]) <= capacity[p]      (bytes)

each operand f what its first layer a brings plus what its end b brings, and the largest working set of its layers
(one layer's backward runs at a time): the estimate's peak is the largest of a few such sums (training, optimizer
step, gradient all-reduce) plus that working set. A sum over the layers is a head and a tail (``prefix[b] -
prefix[a]``: head ``-prefix``, tail ``prefix``), and so are the pipe buffers of the cuts before and after the stage
and the last stage's logits (:meth:`MemoryBound.of` builds a one-operand bound from such parts). A stage fits when
it meets every bound of a set. Numbers only: nothing here knows what the bytes are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class MemoryBound:
    """One bound every position's memory must meet (module docstring); ``peak``: none when None. Read-only arrays;
    a position's row depends on that position only."""

    head: np.ndarray  # (F, n, L+1) bytes of each operand by the first layer a, at column a
    tail: np.ndarray  # (F, n, L+1) bytes of each operand by the end b (the layer after the last), at column b
    capacity: np.ndarray  # (n,) bytes (inf: no bound)
    peak: np.ndarray | None = None  # (n, L) bytes per layer, of which a segment adds its largest

    @classmethod
    def of(cls, prefix: np.ndarray, capacity: np.ndarray, start: np.ndarray | None = None,
           end: np.ndarray | None = None, peak: np.ndarray | None = None) -> MemoryBound:
        """The one-operand bound ``prefix[b] - prefix[a] + start[a] + end[b] + max(peak[a:b]) <= capacity``
        (``start``, ``end``: 0 when None), read-only."""
        head = -np.asarray(prefix, dtype=float) + (0.0 if start is None else np.asarray(start, dtype=float))
        tail = np.asarray(prefix, dtype=float) + (0.0 if end is None else np.asarray(end, dtype=float))
        cap = np.array(capacity, dtype=float)
        top = None if peak is None else np.array(peak, dtype=float)
        for arr in (head, tail, cap, top):
            if arr is not None:
                arr.setflags(write=False)
        return cls(head[None], tail[None], cap, top)

    def segment_bytes(self, rows: np.ndarray | int, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
        """Bytes of the segments ``lo..hi-1`` (``hi > lo``) on positions ``rows`` (arrays broadcast together)."""
        out = (self.tail[:, rows, hi] + self.head[:, rows, lo]).max(axis=0)
        if self.peak is not None:
            length = np.asarray(hi) - np.asarray(lo)
            k = np.frexp(length)[1] - 1  # ⌊log2(length)⌋: two windows of 2^k layers cover the segment
            levels = self._levels
            out = out + np.maximum(levels[k, rows, lo], levels[k, rows, np.asarray(hi) - (1 << k)])
        return np.asarray(out)

    def fits(self, rows: np.ndarray | int, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
        """Whether the segments ``lo..hi-1`` (``hi > lo``) on positions ``rows`` meet the bound."""
        return self.segment_bytes(rows, lo, hi) <= self.capacity[rows]

    def table(self) -> np.ndarray:
        """(n, L+1, L+1) bytes of every segment ``a..b-1`` at ``[p, a, b]``; entries with ``a ≥ b`` are
        meaningless (finite or -inf)."""
        _, n, cols = self.head.shape
        out = (self.tail[:, :, None, :] + self.head[:, :, :, None]).max(axis=0)
        if self.peak is not None:
            a, b = np.arange(cols)[:, None], np.arange(cols)[None, :]
            inside = np.where(b > a, np.concatenate([np.full((n, 1), -np.inf), self.peak], axis=1)[:, None, :],
                              -np.inf)  # [p, a, b] = peak[p, b-1] for b > a
            out += np.maximum.accumulate(inside, axis=2)
        return out

    @cached_property
    def never_binds(self) -> bool:
        """True when every segment of every position meets the bound, by a sufficient test: the largest head, tail
        and peak of each row together within its capacity."""
        most = (self.head.max(axis=2) + self.tail.max(axis=2)).max(axis=0)
        if self.peak is not None:
            most = most + self.peak.max(axis=1)
        return bool(np.all(most <= self.capacity))

    @cached_property
    def rises(self) -> np.ndarray:
        """(L,) bool: whether a segment starting at layer c+1 may need more bytes than the same segment from c, in
        some position: where an operand's ``head`` rises from column c to c+1 (the largest working set only shrinks
        as the start moves later)."""
        return np.asarray((np.diff(self.head, axis=2) > 0).any(axis=(0, 1)))

    @cached_property
    def _levels(self) -> np.ndarray:
        """(K, n, L) sparse table of ``peak``: ``[k, p, i]`` = the largest of ``peak[p, i .. i + 2^k - 1]``
        (-inf past the end)."""
        assert self.peak is not None
        n, length = self.peak.shape
        levels = [np.asarray(self.peak, dtype=float)]
        width = 1
        while 2 * width <= length:
            last = levels[-1]
            nxt = np.full((n, length), -np.inf)
            nxt[:, : length - width] = np.maximum(last[:, : length - width], last[:, width:])
            levels.append(nxt)
            width *= 2
        return np.stack(levels)


def partition_fits(*options: tuple[MemoryBound, ...]) -> bool:
    """Whether some partition into contiguous non-empty segments, one per position in order, has every segment meet
    every bound of at least one option (each option: the bounds of one way to run a stage; an empty option: every
    segment fits). ``options[o][i]`` are bounds of one shape (n positions, L layers): :func:`fitting_partition`;
    True when there is no bound at all (nothing says how many positions there are)."""
    return not any(options) or fitting_partition(*options) is not None


def fitting_partition(*options: tuple[MemoryBound, ...]) -> tuple[int, ...] | None:
    """A partition (``0 = c_0 < … < c_n = L``) whose every segment meets every bound of at least one option
    (:func:`partition_fits`), or None when there is none; some option must hold a bound.

    Reachable ends are swept position by position. Between the columns where a bound :attr:`~MemoryBound.rises`, a
    later start never needs more bytes, under every bound at once; so for each end only the latest reachable start
    of each such run of columns can fit best, and one vector pass per position and run, over every bound of every
    option together (:class:`_Stacked`), decides it exactly (the search's bounds: one or a few runs, O(positions ·
    L); at worst every column is a run, O(positions · L²)). Each segment's bytes are the same sums, in the same
    order, as the layer-assignment DP's mask (``ampe.dp_assign``), so the answer is the DP's (a last-bit rounding
    difference between two starts at a capacity's edge aside)."""
    _, n_pos, cols = next(bound.head.shape for option in options for bound in option)
    if n_pos > cols - 1:
        return None
    options = tuple(tuple(bound for bound in option if not bound.never_binds) for option in options)
    if any(not option for option in options):  # every segment meets every bound of that option
        return (*range(n_pos), cols - 1)
    stacked = _Stacked(options)
    rises = np.logical_or.reduce([bound.rises for option in options for bound in option])
    run = np.concatenate([[0], np.cumsum(rises)])[:-1]  # (L,) run of each start column 0..L-1
    reach = np.zeros(cols - 1, dtype=bool)  # starts 0..L-1 reachable (ends 1..L: reach shifted by one)
    reach[0] = True
    idx = np.arange(cols - 1)
    ends = np.arange(1, cols)
    via = np.zeros((n_pos, cols - 1), dtype=np.int64)  # [p, b-1]: the start of a fitting segment ending at b
    for p in range(n_pos):
        fits = np.zeros(cols - 1, dtype=bool)  # segments ending at 1..L
        for r in np.unique(run[reach]):
            # the run's latest reachable start < b, b = 1..L (-1: none)
            prev = np.maximum.accumulate(np.where(reach & (run == r), idx, -1))
            ok = prev >= 0
            new = ok & ~fits & stacked.fits(p, np.where(ok, prev, ends - 1))
            via[p, new] = prev[new]
            fits |= new
        if not fits.any() or (p == n_pos - 1 and not fits[-1]):
            return None
        reach[0] = False
        reach[1:] = fits[:-1]  # a segment ending at b is the next one's start b (L starts nothing)
    cuts = [cols - 1]
    for p in range(n_pos - 1, -1, -1):
        cuts.append(int(via[p, cuts[-1] - 1]))
    return tuple(reversed(cuts))


def partition_meets(partition: tuple[int, ...], *options: tuple[MemoryBound, ...]) -> bool:
    """Whether every segment of ``partition`` (as :func:`fitting_partition` returns) meets every bound of at least
    one option: one vector evaluation per bound over every position at once, the same sums as the sweep's."""
    cuts = np.asarray(partition)
    rows = np.arange(len(cuts) - 1)
    lo, hi = cuts[:-1], cuts[1:]
    ok = np.zeros(len(rows), dtype=bool)
    for option in options:
        meets = np.ones(len(rows), dtype=bool)
        for bound in option:
            meets &= bound.fits(rows, lo, hi)
        ok |= meets
    return bool(ok.all())


class _Stacked:
    """Every operand of every bound of every option stacked, for segments of one position at a time: (E, n, L+1)
    heads and tails, (B, n) capacities, and one sparse table per distinct working-set array (bounds that share one,
    as the search's do, share its maxima)."""

    def __init__(self, options: tuple[tuple[MemoryBound, ...], ...]):
        bounds = [bound for option in options for bound in option]
        self.options = np.cumsum([0] + [len(option) for option in options[:-1]])  # each option's first bound
        self.operands = np.cumsum([0] + [len(b.head) for b in bounds[:-1]])  # each bound's first operand
        self.head = np.concatenate([b.head for b in bounds])
        self.tail = np.concatenate([b.tail for b in bounds])
        self.capacity = np.stack([b.capacity for b in bounds])
        owners: dict[int, MemoryBound] = {}
        for b in bounds:
            if b.peak is not None:
                owners.setdefault(id(b.peak), b)
        self.peaks = list(owners.values())  # one bound per distinct working-set array, whose sparse table is used
        self.peak_of = np.array([-1 if b.peak is None else list(owners).index(id(b.peak)) for b in bounds])

    def fits(self, p: int, lo: np.ndarray) -> np.ndarray:
        """(L,) whether the segments ``lo[i]..i`` (ending at b = i+1 > ``lo[i]``) of position ``p`` meet every bound
        of some option."""
        need = np.maximum.reduceat(self.tail[:, p, 1:] + self.head[:, p][:, lo], self.operands, axis=0)
        if self.peaks:
            hi = np.arange(1, need.shape[1] + 1)
            k = np.frexp(hi - lo)[1] - 1
            most = [np.maximum(b._levels[k, p, lo], b._levels[k, p, hi - (1 << k)]) for b in self.peaks]
            most.append(np.zeros(len(lo)))
            need += np.stack(most)[self.peak_of]
        meets = need <= self.capacity[:, p, None]
        return np.asarray(np.logical_and.reduceat(meets, self.options, axis=0).any(axis=0))
