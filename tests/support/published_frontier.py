"""Compare ampe's frontier with a published one: Perseus's ``time,energy`` CSV (one row per frontier point). Test
support, also used by ``benchmarks/frontier_real.py`` (moved out of ``ampe/``, which never used it).

Perseus's published frontier is in its own accounting: times are sums of per-computation times floored to the
unit time τ, energy = Σ (e − P_block · t) + Σ_s P_block,s · T. ampe reproduces that accounting by planning on the
profile with floored times (:meth:`~ampe.energy.profile_csv.InstructionProfile.floored`); :func:`match` then
asks, at every published point (T, E), for ampe's cheapest point not slower than T, its energy counted while
waiting until T (so both run for T seconds).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ampe.errors import InputError
from ampe.io import csv_records, read_text


@dataclass(frozen=True, eq=False)  # holds arrays
class PublishedFrontier:
    """A published frontier: iteration times (s) and energies (J), sorted by time (fastest first)."""

    time_s: np.ndarray
    energy_j: np.ndarray
    source: str

    @property
    def t_min_s(self) -> float:
        """Fastest published iteration time (s)."""
        return float(self.time_s[0])

    @property
    def unit_s(self) -> float:
        """The time step between neighbouring points (s): Perseus's τ, rounded to 1 µs."""
        steps = np.diff(self.time_s)
        steps = steps[steps > 1e-9]
        return round(float(steps.min()), 6) if len(steps) else 1e-3


def load_published_frontier(path: str | Path) -> PublishedFrontier:
    """Read a ``time,energy`` CSV; bad input raises InputError naming the file and the field."""
    source = str(path)
    rows = []
    for line, row in csv_records(source, read_text(path), ("time", "energy")):
        vals = []
        for col in ("time", "energy"):
            try:
                x = float(row[col])
            except (TypeError, ValueError):
                raise InputError(source, f"row {line}.{col}", f"not a number: {row[col]!r}") from None
            if not math.isfinite(x) or x <= 0:
                raise InputError(source, f"row {line}.{col}", f"must be a positive number, got {row[col]!r}")
            vals.append(x)
        rows.append(vals)
    if not rows:
        raise InputError(source, "(rows)", "no frontier points")
    a = np.asarray(sorted(rows))
    return PublishedFrontier(a[:, 0], a[:, 1], source)


@dataclass(frozen=True)
class Match:
    """How a realized frontier compares with a published one.

    ``t_min_excess``: (ampe's fastest time / published T_min) − 1; ``worst_excess`` / ``mean_excess``: over the
    published points, (ampe's energy / published energy) − 1 (fractions; negative: ampe cheaper); ``unmatched``:
    published points faster than every ampe point (their excess counts as +inf).
    """

    t_min_excess: float
    worst_excess: float
    mean_excess: float
    unmatched: int
    points: int


def match(times_s: Sequence[float] | np.ndarray, effective_j: Sequence[float] | np.ndarray, blocking_w: float,
          published: PublishedFrontier) -> Match:
    """Compare realized points (times in s, Eq. 4 effective energies in J; ``blocking_w``: Σ over stages of the
    blocking power, W) with ``published``: at each published time T, the cheapest point not slower than T."""
    t = np.asarray(times_s, dtype=float)
    eff = np.asarray(effective_j, dtype=float)
    order = np.argsort(t, kind="stable")
    t, best = t[order], np.minimum.accumulate(eff[order])  # cheapest point at or before each time
    k = np.searchsorted(t, published.time_s * (1 + 1e-9), side="right") - 1
    ok = k >= 0
    excess = np.full(len(k), np.inf)
    energy = best[np.maximum(k, 0)] + blocking_w * published.time_s
    excess[ok] = energy[ok] / published.energy_j[ok] - 1
    finite = excess[ok]
    return Match(float(t[0] / published.t_min_s - 1) if len(t) else math.inf,
                 float(excess.max()), float(finite.mean()) if len(finite) else math.inf, int((~ok).sum()),
                 len(excess))
