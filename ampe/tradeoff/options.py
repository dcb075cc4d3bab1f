"""Discrete execution options of one computation: (SM clock, time, energy) triples.

Options come from the analytic DVFS model (:func:`ampe.energy.model_options.model_options`) or from a measured
Perseus/Zeus profile (:mod:`ampe.energy.profile_csv`). One :class:`OpOptions` is shared by every micro-batch of the
same (stage, instruction).
"""

from __future__ import annotations

from dataclasses import dataclass


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
