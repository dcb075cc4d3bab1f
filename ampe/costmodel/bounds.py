"""A pipeline stage's memory as a function of the layers it holds: the form of the layer-assignment DP's memory
constraint (:mod:`ampe.dp_assign`), built from the estimate's terms by :mod:`ampe.costmodel.dp_memory`.

Position p (a pipeline stage, or one chunk of an interleaved device) holding layers a..b-1 meets a
:class:`MemoryBound` when::

    prefix[p, b] - prefix[p, a] + start[p, a] + end[p, b] + max(peak[p, a], …, peak[p, b-1]) <= capacity[p]

in bytes: what adds up over its layers (states, kept activations), what its first layer brings (the pipe buffers
of the cut before it), what its end brings (the buffers of the cut after it; the last stage's logits) and the
largest working set of its layers (one layer's backward runs at a time). The estimate's peak is the largest of a
few such sums (training, optimizer step, gradient all-reduce), so a stage fits when it meets every bound of a set.
Numbers only: nothing here knows what the bytes are.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True, eq=False)
class MemoryBound:
    """One bound every position's memory must meet (module docstring); ``start``, ``end``, ``peak``: 0 when None.
    Read-only arrays; a position's row depends on that position only."""

    prefix: np.ndarray  # (n, L+1) bytes of layers 0..c-1 at column c
    capacity: np.ndarray  # (n,) bytes (inf: no bound)
    start: np.ndarray | None = None  # (n, L+1) bytes by the first layer a, at column a
    end: np.ndarray | None = None  # (n, L+1) bytes by the end b (the layer after the last), at column b
    peak: np.ndarray | None = None  # (n, L) bytes per layer, of which a segment adds its largest

    def segment_bytes(self, rows: np.ndarray | int, lo: np.ndarray | int, hi: np.ndarray | int) -> np.ndarray:
        """Bytes of the segments ``lo..hi-1`` (``hi > lo``) on positions ``rows`` (arrays broadcast together)."""
        out = self.prefix[rows, hi] - self.prefix[rows, lo]
        if self.start is not None:
            out = out + self.start[rows, lo]
        if self.end is not None:
            out = out + self.end[rows, hi]
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
        n, cols = self.prefix.shape
        out = self.prefix[:, None, :] - self.prefix[:, :, None]
        if self.start is not None:
            out += self.start[:, :, None]
        if self.end is not None:
            out += self.end[:, None, :]
        if self.peak is not None:
            a, b = np.arange(cols)[:, None], np.arange(cols)[None, :]
            inside = np.where(b > a, np.concatenate([np.full((n, 1), -np.inf), self.peak], axis=1)[:, None, :],
                              -np.inf)  # [p, a, b] = peak[p, b-1] for b > a
            out += np.maximum.accumulate(inside, axis=2)
        return out

    @cached_property
    def never_binds(self) -> bool:
        """True when every segment of every position meets the bound, by a sufficient test: rows that never
        decrease, and their total + the largest start, end and peak within the capacity."""
        whole = self.prefix[:, -1] - self.prefix[:, 0]
        for extra in (self.start, self.end, self.peak):
            if extra is not None:
                whole = whole + extra.max(axis=1)
        return bool(np.all(np.diff(self.prefix, axis=1) >= 0) and np.all(whole <= self.capacity))

    @cached_property
    def start_monotone(self) -> bool:
        """True when no segment needs more bytes than a longer one with the same end: rows that never decrease,
        and no start entry rising by more than the layer it passes adds (``start - prefix`` never increases)."""
        rising = bool(np.all(np.diff(self.prefix, axis=1) >= 0))
        return rising and (self.start is None or bool(np.all(np.diff(self.start - self.prefix, axis=1) <= 0)))

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
    segment fits). ``options[o][i]`` are (n, L+1) bounds of one shape.

    Reachable ends are swept position by position. Where every bound is :attr:`MemoryBound.start_monotone`, a
    segment ending at b fits best from the latest reachable start, under every option, so one vector pass per
    position, option and bound decides it exactly; otherwise each position tries every reachable start against
    every end (O(L²) per position), exactly too."""
    shapes = [bound.prefix.shape for option in options for bound in option]
    if not shapes:
        return True  # (no bound at all: nothing to say how many positions there are)
    n_pos, cols = shapes[0]
    if n_pos > cols - 1:
        return False
    options = tuple(tuple(bound for bound in option if not bound.never_binds) for option in options)
    if any(not option for option in options):
        return True  # every segment meets every bound of that option
    monotone = all(bound.start_monotone for option in options for bound in option)
    reach = np.zeros(cols, dtype=bool)
    reach[0] = True
    idx = np.arange(cols)
    for p in range(n_pos):
        if monotone:
            # latest reachable start < b (-1: none), from the latest reachable start ≤ b-1
            prev = np.full(cols, -1, dtype=np.int64)
            np.maximum.accumulate(np.where(reach[:-1], idx[:-1], -1), out=prev[1:])
            ok = prev >= 0
            start = np.where(ok, prev, 0)
            end = np.where(ok, idx, 1)
            fits = np.zeros(cols, dtype=bool)
            for option in options:
                fits |= np.logical_and.reduce([bound.fits(p, start, end) for bound in option])
            reach = ok & fits
        else:
            starts = np.flatnonzero(reach[:-1])[:, None]  # (a start at L begins no segment)
            ends = idx[None, :]
            later = ends > starts
            hi = np.where(later, ends, starts + 1)  # (entries with b ≤ a are masked out below)
            fits = np.zeros(later.shape, dtype=bool)
            for option in options:
                fits |= np.logical_and.reduce([bound.fits(p, starts, hi) for bound in option])
            reach = np.asarray((later & fits).any(axis=0))
        if not reach.any():
            return False
    return bool(reach[-1])
