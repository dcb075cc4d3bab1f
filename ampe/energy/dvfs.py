"""Analytic DVFS model: how time and power of one forward/backward computation change with the SM clock.

Model (per GPU type, x = f / f_max)::

    time_ratio(x) = α / x + (1 − α)                      t(f) / t(f_max) ≥ 1
    power(x)      = P_busy · (s + (1 − s) · x^γ)          watts while computing
    energy(x)     = power(x) · t_max · time_ratio(x)

* α, the *compute-bound fraction*: the share of a computation's time at f_max that scales with 1/f; the rest
  (memory-bound kernels, fixed overheads) does not change with the SM clock.
* s, the *static share* of busy power at f_max (leakage, HBM, board); the dynamic rest rises as x^γ.
* γ = 3: dynamic power ∝ f·V² with V roughly ∝ f inside the DVFS range.
* P_busy = ``busy_share`` · TDP: power of a training computation at f_max.

Because time grows like 1/f at low clocks while power falls towards the static floor, energy has a *valley*. We
pin the raw-energy valley of each type to a documented clock and derive s from it (closed form in
:func:`static_share_for_valley`); see ``docs/energy.md`` for every number's source. Where no measurement was
available the value is an assumption and says so.

A *blocking power* (GPU waiting on P2P/NCCL) applies while a stage waits; it does not depend on the clock
(Perseus's assumption, repo default 70 W).
"""

from __future__ import annotations

from dataclasses import dataclass

from ampe.costmodel.catalog import GpuType

EXPONENT = 3.0


@dataclass(frozen=True)
class DvfsParams:
    """Parameters of the analytic model for one GPU type (see the module docstring)."""

    compute_fraction: float  # α: share of time at f_max that scales with 1/f
    valley_mhz: float  # SM clock of minimum raw energy for a busy GPU
    busy_share: float  # P_busy / TDP at f_max
    blocking_w: float  # watts while blocked on communication
    exponent: float = EXPONENT  # γ
    source: str = ""

    def static_share(self, f_max_mhz: float) -> float:
        """s, derived so that the energy valley sits at ``valley_mhz``."""
        return static_share_for_valley(self.valley_mhz / f_max_mhz, self.compute_fraction, self.exponent)


def static_share_for_valley(x: float, alpha: float, gamma: float = EXPONENT) -> float:
    """Static power share s that puts the minimum of (s + (1−s)x^γ)(α/x + 1−α) at ``x`` (0 < x ≤ 1).

    Setting the derivative to zero gives (1−s)·A = α·s with A = γαx^γ + γ(1−α)x^{γ+1} − αx^γ.
    """
    if not 0.0 < x <= 1.0:
        raise ValueError(f"valley must lie inside the clock range (x={x})")
    a = gamma * alpha * x**gamma + gamma * (1.0 - alpha) * x ** (gamma + 1.0) - alpha * x**gamma
    return a / (alpha + a)


_ENVPIPE = "EnvPipe (ATC'23) §2.2: valley ≈{} MHz; §4.2: a unit stretches 20–25% at the valley"
_ASSUMED = "assumption: no published valley; x = f/f_max ≈ {:.2f}, α = {}"

#: Model parameters per catalog type. ``blocking_w``: Perseus repo default 70 W (A100/A40 testbeds); EnvPipe
#: measured ≈100 W bubble power on RTX3090; other types use max(idle, 0.2·TDP) (assumption).
PARAMS: dict[str, DvfsParams] = {
    # α from the 20–25% stretch at the valley: 1 + α(1530/1020 − 1) = 1.225 → α = 0.45.
    "V100-16GB": DvfsParams(0.45, 1020, 0.9, 60.0, source=_ENVPIPE.format(1020) + "; blocking assumed 0.2·TDP"),
    "V100-32GB": DvfsParams(0.45, 1020, 0.9, 60.0, source=_ENVPIPE.format(1020) + "; blocking assumed 0.2·TDP"),
    # 1 + α(2100/1350 − 1) = 1.225 → α ≈ 0.405.
    "RTX3090": DvfsParams(0.405, 1350, 0.9, 100.0, source=_ENVPIPE.format(1350) + "; EnvPipe §4.5.2: bubble ≈100 W"),
    "A100-40GB": DvfsParams(0.5, 990, 0.9, 70.0, source=_ASSUMED.format(0.70, 0.5) + "; Perseus repo P_blocking 70 W"),
    "A100-80GB": DvfsParams(0.5, 990, 0.9, 70.0, source=_ASSUMED.format(0.70, 0.5) + "; Perseus repo P_blocking 70 W"),
    "A40": DvfsParams(0.5, 1130, 0.9, 70.0, source=_ASSUMED.format(0.65, 0.5) + "; Perseus repo P_blocking 70 W"),
    "H100-80GB": DvfsParams(0.5, 1325, 0.9, 140.0, source=_ASSUMED.format(0.67, 0.5) + "; blocking assumed 0.2·TDP"),
    "T4": DvfsParams(0.5, 1035, 0.9, 14.0, source=_ASSUMED.format(0.65, 0.5) + "; blocking assumed 0.2·TDP"),
    # One CPU core: modelled only (no cpufreq/RAPL where ampe was written); labelled so in every output.
    "cpu": DvfsParams(0.6, 1800, 1.0, 5.0, source="modelled CPU core: α 0.6, valley 0.6·f_max, blocking = idle"),
}


def params_for(gpu: GpuType) -> DvfsParams:
    """The model parameters of ``gpu``: the table entry for its name, else generic assumed defaults.

    Generic defaults (for cluster-spec types not in the catalog): α = 0.5, valley at 0.67·f_max, busy power
    0.9·TDP, blocking max(idle, 0.2·TDP).
    """
    p = PARAMS.get(gpu.name)
    if p is not None and gpu.sm_clock_min_mhz <= p.valley_mhz <= gpu.sm_clock_max_mhz:
        return p
    valley = max(gpu.sm_clock_min_mhz, 0.67 * gpu.sm_clock_max_mhz)
    return DvfsParams(0.5, valley, 0.9, max(gpu.idle_w, 0.2 * gpu.tdp_w), source="generic assumed defaults")


def _x(gpu: GpuType, mhz: float) -> float:
    if not mhz > 0:
        raise ValueError(f"SM clock must be positive, got {mhz}")
    return min(float(mhz), gpu.sm_clock_max_mhz) / gpu.sm_clock_max_mhz


def time_ratio(gpu: GpuType, mhz: float) -> float:
    """t(f) / t(f_max) of a computation on ``gpu`` at SM clock ``mhz`` (≥ 1; clocks above f_max count as f_max)."""
    p = params_for(gpu)
    return p.compute_fraction / _x(gpu, mhz) + (1.0 - p.compute_fraction)


def power_w(gpu: GpuType, mhz: float) -> float:
    """Busy power of ``gpu`` computing at SM clock ``mhz``, in watts."""
    p = params_for(gpu)
    s = p.static_share(gpu.sm_clock_max_mhz)
    return p.busy_share * gpu.tdp_w * (s + (1.0 - s) * _x(gpu, mhz) ** p.exponent)


def blocking_power_w(gpu: GpuType) -> float:
    """Power of ``gpu`` while it waits on communication (pipeline bubbles, P2P), in watts; clock-independent."""
    return params_for(gpu).blocking_w


def energy_valley_mhz(gpu: GpuType) -> int:
    """The catalog clock of minimum raw energy (power × time) of a busy ``gpu``."""
    return min(gpu.sm_clocks_mhz(), key=lambda f: power_w(gpu, f) * time_ratio(gpu, f))
