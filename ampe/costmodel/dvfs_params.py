"""Parameters of the DVFS model of one GPU type (the numbers only; the model is ``ampe.energy.dvfs``).

They live here, beside the GPU catalog, because a cluster spec's ``gpu_types:`` block may carry them (``dvfs:``,
as ``ampe dvfs fit`` writes it) and cluster specs are read by the cost model, which may not import ``ampe.energy``.
See ``docs/energy.md`` §1 for the model and each catalog type's provenance.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DvfsParams:
    """Time and power of a computation against the SM clock, x = f / f_max (docs/energy.md §1).

    Time T(x) ∝ ((α/x)^n + (1−α)^n)^(1/n): a smooth roofline, α the compute-bound share at f_max, n its sharpness
    (n = 1: the additive α/x + 1 − α). Power = busy_w · (s·(1 − σ + σ·v) + m·T(1)/T(x) + (1 − s − m)·x·v²) with the
    relative voltage v = max(x_v, x): flat below the knee x_v, ∝ f above it; s the static share at f_max (the
    card's, in watts s·busy_w whatever runs), σ the part of static power that follows the voltage, m the memory
    share (a computation's DRAM energy is fixed, so its power falls as the computation stretches). Above
    ``power_cap_w`` the card throttles to the clock whose power is the cap.
    """

    compute_share: float  # α
    static_share: float  # s
    busy_w: float  # watts computing at f_max, before any cap
    blocking_w: float  # watts while waiting on communication (clock-independent)
    sharpness: float = 1.0  # n
    static_voltage_share: float = 0.0  # σ
    voltage_knee: float = 0.0  # x_v (0: voltage ∝ f over the whole range)
    memory_share: float = 0.0  # m (s + m ≤ 1)
    activity_slope: float = 0.0  # β: a computation of activity a has compute share α + β·(a − 1)
    activity_memory_slope: float = 0.0  # γ: … and memory share m + γ·(a − 1)
    power_cap_w: float | None = None  # board power limit that throttles the clock; None: never reached
    source: str = field(default="", compare=False)  # provenance: "fitted to …" or "assumed: …"

    @property
    def assumed(self) -> bool:
        """True when no measurement backs these numbers (the source says "assumed")."""
        return not self.source.startswith(("fitted", "measured"))


@dataclass(frozen=True)
class KernelPower:
    """Power of a GPU type at f_max while its kernels are bound by each resource (docs/energy.md §1, *Power from the
    kernels*): a computation's energy is the seconds its kernels spend on tensor-core products, SIMT products and
    memory traffic, each at its power, plus the rest of its time at ``idle_w`` (W). Only f_max is measured: the
    shape below it is the type's DVFS model's."""

    idle_w: float  # awake at f_max, no kernel running (the host has not launched the next one yet)
    tensor_w: float  # tensor-core-bound products (16-bit, TF32)
    simt_w: float  # products on the SIMT cores (fp32, or unaligned 16-bit)
    memory_w: float  # memory-bound kernels (element-wise passes, the eager attention's s² traffic, thin products)
    source: str = field(default="", compare=False)

    def watts(self) -> tuple[float, float, float]:
        """(tensor, simt, memory) W in the order of ``ampe.costmodel.compute.BOUNDS``."""
        return self.tensor_w, self.simt_w, self.memory_w


def scaled_kernel_power(p: KernelPower, base: str, k: float) -> KernelPower:
    """``p`` of catalog type ``base`` for a variant whose TDP is ``k`` × the base's: every watt × k, as the DVFS
    model's watts of a variant are (``ampe.energy.dvfs.derived_params``)."""
    return KernelPower(p.idle_w * k, p.tensor_w * k, p.simt_w * k, p.memory_w * k,
                       source=f"derived from {base}: its power by kernel bound × {k:.4g} (TDP ratio)")
