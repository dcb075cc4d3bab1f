"""Energy of a whole training run: per-iteration joules × iterations, in kWh, at the plan and at all-max clocks.

What a person paying the power bill compares: ``ampe search --iterations N`` (or ``--tokens T``, iterations =
⌈T / (global batch × sequence length)⌉) reports, per strategy, the run's kWh and hours with the frequency plan and
with every clock at its maximum, and the kWh saved. The same accounting as one iteration (docs/energy.md §10.1):
all devices, blocking power while waiting, the tail at blocking power.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

J_PER_KWH = 3.6e6


@dataclass(frozen=True)
class TrainingRun:
    """A training run of ``iterations`` iterations: kWh and hours with the plan and with all clocks at maximum."""

    iterations: int
    energy_kwh: float
    energy_max_clock_kwh: float
    hours: float
    hours_max_clock: float
    tokens: int | None = None  # the run's tokens when it was given in tokens

    @property
    def saved_kwh(self) -> float:
        """kWh the plan saves against all clocks at maximum (negative if it costs more)."""
        return self.energy_max_clock_kwh - self.energy_kwh


def iterations_for_tokens(tokens: int, global_batch: int, seq_len: int) -> int:
    """Iterations that train on at least ``tokens`` tokens, ``global_batch`` sequences of ``seq_len`` tokens each."""
    if tokens <= 0 or global_batch <= 0 or seq_len <= 0:
        raise ValueError("tokens, global batch and sequence length must be positive")
    return math.ceil(tokens / (global_batch * seq_len))


def training_run(iterations: int, energy_j: float, energy_max_clock_j: float, time_s: float,
                 max_clock_time_s: float, tokens: int | None = None) -> TrainingRun:
    """A run of ``iterations`` iterations from one iteration's joules and seconds, with the plan and at all-max."""
    if iterations <= 0:
        raise ValueError("iterations must be positive")
    return TrainingRun(iterations, iterations * energy_j / J_PER_KWH, iterations * energy_max_clock_j / J_PER_KWH,
                       iterations * time_s / 3600.0, iterations * max_clock_time_s / 3600.0, tokens)
