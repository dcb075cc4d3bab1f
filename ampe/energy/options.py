"""Discrete execution options of one computation: (SM clock, time, energy) triples.

Options come from the analytic DVFS model (:func:`model_options`) or from a measured Perseus/Zeus profile
(:mod:`ampe.energy.profile_csv`). One :class:`OpOptions` is shared by every micro-batch of the same (stage,
instruction).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a measured profile needs neither the catalog nor the DVFS model: imported where modelled
    from ampe.costmodel.catalog import GpuType


@dataclass(frozen=True)
class Option:
    """Run at ``mhz``: takes ``time_s`` seconds and ``energy_j`` joules (all GPUs of the stage together)."""

    mhz: float
    time_s: float
    energy_j: float


@dataclass(frozen=True)
class OpOptions:
    """All options of one kind of computation, sorted by clock (ascending)."""

    options: tuple[Option, ...]

    def __post_init__(self) -> None:
        if not self.options:
            raise ValueError("a computation needs at least one option")
        object.__setattr__(self, "options", tuple(sorted(self.options, key=lambda o: o.mhz)))

    @property
    def fastest(self) -> Option:
        """The option with the shortest time (ties: the cheaper one)."""
        return min(self.options, key=lambda o: (o.time_s, o.energy_j))

    def effective_costs(self, blocking_w: float) -> tuple[float, ...]:
        """Perseus Eq. 4 cost per option: energy − blocking power × time (J)."""
        return tuple(o.energy_j - blocking_w * o.time_s for o in self.options)

    def min_energy(self, blocking_w: float = 0.0) -> Option:
        """The option of minimum effective energy (``blocking_w`` = 0: raw energy valley)."""
        costs = self.effective_costs(blocking_w)
        return self.options[min(range(len(costs)), key=lambda i: (costs[i], self.options[i].time_s))]

    def floored(self, unit_s: float) -> OpOptions:
        """The same options with every time floored to a whole multiple of ``unit_s`` (s); energies unchanged.

        Perseus's time accounting (lowtime ``quant_time = real_time // unit_time``, the same float operation): its
        published frontiers add up floored times, and its effective energy subtracts blocking power over them.
        """
        if not unit_s > 0:
            raise ValueError("unit time must be positive")
        return OpOptions(tuple(Option(o.mhz, (o.time_s // unit_s) * unit_s, o.energy_j)
                               for o in self.options))

    def at_or_below(self, mhz: float) -> Option:
        """The option with the highest clock ≤ ``mhz`` (the lowest clock if none is)."""
        below = [o for o in self.options if o.mhz <= mhz + 1e-9]
        return below[-1] if below else self.options[0]


def constant(time_s: float, energy_j: float = 0.0) -> OpOptions:
    """A computation with a single option (frequency-independent)."""
    return OpOptions((Option(0.0, float(time_s), float(energy_j)),))


def model_options(gpu: GpuType, time_at_max_s: float, gpus: int = 1,
                  clocks_mhz: Iterable[float] | None = None, margin: float = 0.0, act: float = 1.0) -> OpOptions:
    """Options of a computation taking ``time_at_max_s`` at f_max on ``gpus`` GPUs of type ``gpu`` (DVFS model).

    Every catalog clock of the type (``GpuType.sm_clocks_mhz``) unless ``clocks_mhz`` is given; energy covers all
    ``gpus`` GPUs of the stage (tensor-parallel shards run the same computation at the same clock). ``margin``
    (planning guard band, ≥ 0): every option below f_max takes (1 + margin) × its modelled time (and its power for
    that long), so a plan made on these options still fits its slack when slowed computations run up to that much
    longer than modelled; f_max keeps its time (T_min does not change). ``act``: the computation's activity (1: the
    type's reference; a measured power at f_max gives it, :func:`ampe.energy.dvfs.measured_activity`).
    """
    if time_at_max_s < 0:
        raise ValueError(f"negative time {time_at_max_s}")
    if margin < 0:
        raise ValueError(f"negative margin {margin}")
    clocks = tuple(clocks_mhz) if clocks_mhz is not None else _catalog_clocks(gpu)
    return _model_options(gpu, float(time_at_max_s), gpus, clocks, float(margin), float(act))


@lru_cache(maxsize=64)
def _catalog_clocks(gpu: GpuType) -> tuple[float, ...]:
    """``gpu.sm_clocks_mhz()``, once per GPU type."""
    return gpu.sm_clocks_mhz()


@lru_cache(maxsize=1024)  # at most ~12 MB of options
def _model_options(gpu: GpuType, time_at_max_s: float, gpus: int, clocks: tuple[float, ...], margin: float,
                   act: float) -> OpOptions:
    """:func:`model_options`, once per distinct computation (stages of one type and time share their options)."""
    from ampe.energy import dvfs  # here: a measured profile never needs the DVFS model or the catalog

    ratio, watts = dvfs.clock_curve(gpu, clocks, act)
    opts = []
    for f, r, w in zip(clocks, ratio.tolist(), watts.tolist(), strict=True):
        t = time_at_max_s * r
        if margin and f < gpu.sm_clock_max_mhz:
            t *= 1.0 + margin
        opts.append(Option(float(f), t, gpus * w * t))
    return OpOptions(tuple(opts))
