"""Plausible ranges of the physical quantities ampe reads: one place, used by every field that holds one.

A value outside its range is refused with one line naming the field and the range (``FILE: FIELD: 1e-300 Gbit/s is
outside 0.001 to 1,000,000 Gbit/s (link bandwidth)``). The ranges are generous — from far below the slowest hardware
anyone plans on to far above the fastest announced — but physical: they refuse typos in the exponent and values that
would overflow later (5e-324 Gbit/s makes every transfer infinite; 1e308 GB of memory overflows a byte count). The
table is in docs/reference/cluster_spec.md ("Plausible ranges").
"""

from __future__ import annotations

from dataclasses import dataclass

from ampe.errors import InputError


@dataclass(frozen=True)
class Quantity:
    """The plausible values ``lo`` .. ``hi`` of one physical quantity, in the ``unit`` ampe's files give it."""

    name: str  # what it is, in words ("link bandwidth")
    unit: str  # as written after the number ("Gbit/s")
    lo: float
    hi: float

    def text(self) -> str:
        """The range in words: ``0.001 to 100,000 Gbit/s``."""
        return f"{_num(self.lo)} to {_num(self.hi)} {self.unit}"

    def problem(self, value: float) -> str | None:
        """Why ``value`` is implausible, or None (NaN is implausible too)."""
        if self.lo <= value <= self.hi:
            return None
        return f"{value:g} {self.unit} is outside {self.text()} ({self.name})"

    def check(self, value: float, source: str, field: str) -> float:
        """``value``, or an InputError naming ``source`` and ``field`` with the range."""
        why = self.problem(value)
        if why:
            raise InputError(source, field, why)
        return value

    def validate(self, value: float) -> float:
        """``value``, or a ValueError with the range in words (for pydantic's validators)."""
        why = self.problem(value)
        if why:
            raise ValueError(why)
        return value


def _num(x: float) -> str:
    return f"{x:,.0f}" if x >= 1 and x == int(x) else f"{x:g}"


# Links between devices: 1 Mbit/s (a throttled management network) to 1 Pbit/s (NVLink 5 is 14.4 Tbit/s a GPU;
# CPU ranks sharing one host's memory are modelled as 10^6).
BANDWIDTH_GBPS = Quantity("link bandwidth", "Gbit/s", 1e-3, 1e6)
# Memory bandwidth of one device: 1 GB/s (an old DDR channel) to 100 TB/s (HBM3e parts reach 8 TB/s).
MEMORY_BANDWIDTH_GBS = Quantity("memory bandwidth", "GB/s", 1.0, 1e5)
# Latency of one message: 0 to 1 s (a cross-continent link is 0.1 s).
LATENCY_US = Quantity("link latency", "µs", 0.0, 1e6)
# Peak compute of one device: 1 GFLOP/s (one slow CPU core) to 100 PFLOP/s (a B200 is 2.25 PFLOP/s dense fp16).
TFLOPS = Quantity("peak compute", "TFLOP/s", 1e-3, 1e5)
# Memory of one device: 10 MB to 100 TB (a CPU "device" may be a whole host).
MEMORY_GB = Quantity("device memory", "GB", 1e-2, 1e5)
# Memory beside the model's tensors (context, library workspaces): 0 to 100 TB.
EXTRA_MEMORY_GB = Quantity("memory beside the model's tensors", "GB", 0.0, 1e5)
# Power of one device: 0 to 5 kW (a GB200 superchip draws about 2.7 kW).
POWER_W = Quantity("power per device", "W", 0.0, 5000.0)
# SM clocks: 1 MHz to 10 GHz (GPUs run at 0.2-3 GHz).
CLOCK_MHZ = Quantity("clock", "MHz", 1.0, 10_000.0)
# Fixed costs per layer, per GEMM, per pipeline operation or per iteration: 0 to 10 s (real ones are µs to ms).
OVERHEAD_S = Quantity("fixed overhead", "s", 0.0, 10.0)
# One training iteration, predicted or measured: 1 ns to 11.6 days (a real step is milliseconds or more; a test
# double's empty step is a fraction of a microsecond).
ITERATION_S = Quantity("iteration time", "s", 1e-9, 1e6)

# Prices, in whatever currency the spec names: a GPU-hour 0 to 10^6 units (an H100 rents for about 2-4 USD, about
# 40,000 IDR), a kWh 0 to 10^4 units (0.05-0.40 USD, about 1,500 IDR).
PRICE_PER_HOUR = Quantity("price per GPU-hour", "currency units", 0.0, 1e6)
ENERGY_PRICE = Quantity("electricity price per kWh", "currency units", 0.0, 1e4)
# Carbon intensity of a grid: 0 to 2,000 g CO2e/kWh (lignite plants emit about 1,100-1,300).
CARBON_G_PER_KWH = Quantity("carbon intensity", "g CO2e/kWh", 0.0, 2000.0)
# Power usage effectiveness: 1 (every watt reaches the IT load) to 10 (no data centre is near 3).
PUE = Quantity("power usage effectiveness: facility power over IT power", "× IT power", 1.0, 10.0)

QUANTITIES = (BANDWIDTH_GBPS, MEMORY_BANDWIDTH_GBS, LATENCY_US, TFLOPS, MEMORY_GB, EXTRA_MEMORY_GB, POWER_W, CLOCK_MHZ,
              OVERHEAD_S, ITERATION_S, PRICE_PER_HOUR, ENERGY_PRICE, CARBON_G_PER_KWH, PUE)
