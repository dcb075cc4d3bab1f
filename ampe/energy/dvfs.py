"""Analytic DVFS model: how time and power of one forward/backward computation change with the SM clock.

Model (per GPU type, x = f / f_max; parameters in :class:`ampe.costmodel.dvfs_params.DvfsParams`)::

    T(x)     = ((α_a/x)^n + (1 − α_a)^n)^(1/n)                smooth roofline: compute part ∝ 1/f, memory part fixed
    v(x)     = max(x_v, x)                                    relative voltage: flat below the knee, ∝ f above
    p(x)     = s·(1 − σ + σ·v) + a·(m_a·T(1)/T(x) + (1 − s − m_a)·x·v²)   relative power: static (partly ∝ V) +
                                                   activity × (memory: fixed joules, spread over T; dynamic ∝ f·V²)
    α_a      = α + β·(a − 1),  m_a = m + γ·(a − 1)            shares of a computation of activity a (1: the reference)
    x_e      = min(x, x_cap),  busy_w · p(x_cap) = power_cap_w    a capped card throttles to the cap's clock
    time_ratio(x) = T(x_e) / T(x_e(1))       power(x) = busy_w · p(x_e)

The activity a of a computation is its clock-dependent power over the type's reference computation's, fixed by its
measured power at f_max (:func:`activity`); without a measurement a = 1. n = 1, σ = 0, x_v = 0, m = 0, β = γ = 0 and
no cap is the earlier model (α/x + 1 − α, s + (1 − s)·x³). Measured types (A100, A40,
V100) carry parameters fitted to real clock sweeps by :mod:`ampe.energy.dvfs_fit`; the others are assumptions
and say so (``DvfsParams.source``); ``docs/energy.md`` §1 gives provenance and fit error per type.

A *blocking power* (GPU waiting on P2P/NCCL) applies while a stage waits; it does not depend on the clock
(Perseus's assumption and its measured values: 83.64 W on A100, 70.38 W on A40).
"""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import numpy as np

from ampe.costmodel.catalog import CATALOG, GpuType
from ampe.costmodel.dvfs_params import DvfsParams

__all__ = ["PARAMS", "DvfsParams", "activity", "blocking_power_w", "clock_curve", "compute_share", "derived_params",
           "energy_valley_mhz", "measured_activity", "memory_share", "params_for", "power_w", "relative_power",
           "relative_time", "static_power", "time_ratio"]


def compute_share(p: DvfsParams, act: np.ndarray | float = 1.0) -> np.ndarray:
    """α_a = α + β·(a − 1), clipped to [0, 1]: the compute share of a computation of activity ``a`` (its
    clock-dependent power over the type's reference computation's; 1: the reference, whose share is α)."""
    a = np.asarray(act, dtype=float)
    if not p.activity_slope:
        return np.full(a.shape, p.compute_share)
    return np.clip(p.compute_share + p.activity_slope * (a - 1.0), 0.0, 1.0)


def memory_share(p: DvfsParams, act: np.ndarray | float = 1.0) -> np.ndarray:
    """m_a = m + γ·(a − 1), clipped to [0, 1 − s]: the memory share of a computation of activity ``a`` (1: the
    type's reference computation, whose share is m)."""
    a = np.asarray(act, dtype=float)
    if not p.activity_memory_slope:
        return np.full(a.shape, p.memory_share)
    return np.clip(p.memory_share + p.activity_memory_slope * (a - 1.0), 0.0, 1.0 - p.static_share)


def relative_time(p: DvfsParams, x: np.ndarray | float, act: np.ndarray | float = 1.0) -> np.ndarray:
    """T(x) of the module docstring (uncapped, not normalised); ``x`` = f / f_max > 0, ``act`` the computation's
    activity (:func:`compute_share`; 1: the type's reference computation)."""
    x = np.asarray(x, dtype=float)
    a, n = compute_share(p, act), p.sharpness
    return ((a / x) ** n + (1.0 - a) ** n) ** (1.0 / n)


def static_power(p: DvfsParams, x: np.ndarray | float) -> np.ndarray:
    """The static part s·(1 − σ + σ·v) of p(x), relative to ``busy_w``: the card's, whatever computation runs."""
    v = np.maximum(p.voltage_knee, np.asarray(x, dtype=float))
    return p.static_share * (1.0 - p.static_voltage_share + p.static_voltage_share * v)


def relative_power(p: DvfsParams, x: np.ndarray | float, act: np.ndarray | float = 1.0) -> np.ndarray:
    """p(x) of the module docstring: busy power at x relative to ``busy_w`` (uncapped; 1 at x = 1 for the
    reference computation). A computation of activity ``act`` draws the card's static power plus ``act`` × the
    clock-dependent rest (memory + dynamic), its memory power spread over its own time."""
    x = np.asarray(x, dtype=float)
    v = np.maximum(p.voltage_knee, x)
    m = memory_share(p, act)
    rest = np.maximum(0.0, 1.0 - p.static_share - m) * x * v * v
    if p.memory_share or p.activity_memory_slope:
        rest = rest + m * relative_time(p, 1.0, act) / relative_time(p, x, act)
    return static_power(p, x) + np.asarray(act, dtype=float) * rest


def _p(p: DvfsParams, x: float, act: float) -> float:
    return float(relative_power(p, x, act))


@functools.lru_cache(maxsize=1024)
def cap_x(p: DvfsParams, act: float = 1.0) -> float:
    """The relative clock at which busy power (of a computation of activity ``act``) reaches ``power_cap_w`` (inf
    when the cap is never reached).

    p(x) rises strictly with x, so bisection finds it; a cap below the static floor throttles to the lowest
    relative clock considered (1e-3).
    """
    if p.power_cap_w is None:
        return float("inf")
    target = p.power_cap_w / p.busy_w
    if _p(p, 1.0, act) <= target:
        return float("inf")
    lo, hi = 1e-3, 1.0
    if _p(p, lo, act) >= target:
        return lo
    for _ in range(50):
        mid = 0.5 * (lo + hi)
        if _p(p, mid, act) < target:
            lo = mid
        else:
            hi = mid
    return lo


def ratios(p: DvfsParams, x: np.ndarray | float, act: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(t(x) / t(1), busy power in watts) at relative clocks ``x`` of a computation of activity ``act`` (1: the
    type's reference computation), both after the cap (vectorised)."""
    xc = cap_x(p, float(act))
    xe = np.minimum(np.asarray(x, dtype=float), xc)
    t = relative_time(p, xe, act) / relative_time(p, min(1.0, xc), act)
    return t, p.busy_w * relative_power(p, xe, act)


# ---------------------------------------------------------------------------------------------------------------
# The catalog's parameters. Fitted ones come from `ampe dvfs fit` on the shipped data (tests/data/perseus,
# tests/data/zeus_power_limit; `benchmarks/dvfs_fit.py` prints the table and tests/energy/test_dvfs_fit.py refits).

_A100_SRC = ("fitted to Perseus SOSP'24 A100 SXM per-clock profiles (gpt3-175b, bloom; 32 computations × 38 clocks "
             "855-1410 MHz); fitted busy 496 W, throttled at 472 W; blocking 83.64 W = Perseus's measured P2P power")
_A40_SRC = ("fitted to Perseus SOSP'24 A40 per-clock profiles (gpt3-175b, bloom; 32 computations × 60 clocks "
            "855-1740 MHz) and Zeus NSDI'23 A40 power-limit traces jointly, with activity slopes; fitted cap "
            "293.2 W (300 W board); blocking 70.38 W = Perseus's measured P2P power")
_V100_SRC = ("fitted to Zeus NSDI'23 V100 power-limit traces (busy workloads, 100-250 W limits); busy power and "
             "cap assumed (0.9·TDP, TDP); blocking assumed 0.2·TDP")
_GH100_SRC = ("assumed below f_max: A100's fitted shape (no clock may be changed on a lent GPU, so nothing below f_max "
              "is measured); fitted at f_max only: busy power {busy:g} W (tensor-core-bound kernels, at most the "
              "board limit) and blocking {idle:g} W (awake, no kernel), from NVML energy on the H100 and H200 "
              "records (the catalog's kernel_power, benchmarks/power_fit.py); {cap:g} W cap")
_ENVPIPE = "assumed: EnvPipe (ATC'23) §2.2 valley ≈{} MHz, §4.2 20–25% stretch at the valley; blocking {}"
_ASSUMED = "assumed: no published measurement; valley at x ≈ {:.2f}, α 0.5, busy 0.9·TDP; blocking 0.2·TDP"

# `benchmarks/dvfs_fit.py` output, rounded (tests/energy/test_dvfs_fit.py refits and checks these; docs/energy.md).
_A100 = DvfsParams(0.5105, 0.0937, 495.5, 83.64, sharpness=8.0, static_voltage_share=0.0, voltage_knee=0.7847,
                   memory_share=0.1183, power_cap_w=471.5, source=_A100_SRC)
_A40 = DvfsParams(0.4250, 0.3097, 371.7, 70.38, sharpness=2.082, static_voltage_share=0.6389, voltage_knee=0.6215,
                  memory_share=0.2279, activity_slope=0.2423, activity_memory_slope=-0.3655, power_cap_w=293.2,
                  source=_A40_SRC)
_V100 = DvfsParams(0.1596, 0.3545, 270.0, 60.0, sharpness=1.173, static_voltage_share=0.9996, voltage_knee=0.3378,
                   memory_share=0.6131, power_cap_w=300.0, source=_V100_SRC)

def _old(alpha: float, valley_x: float, busy_w: float, blocking_w: float, source: str) -> DvfsParams:
    """The earlier model (α/x + 1 − α, s + (1 − s)x³) with s derived so that raw energy is lowest at ``valley_x``."""
    a = 3 * alpha * valley_x**3 + 3 * (1 - alpha) * valley_x**4 - alpha * valley_x**3
    return DvfsParams(alpha, a / (alpha + a), busy_w, blocking_w, source=source)


def _gh100(gpu: GpuType) -> DvfsParams:
    """A GH100 card's model: A100's fitted shape below f_max (assumed), busy and blocking power at f_max fitted
    (its ``kernel_power``: tensor-core-bound kernels, and awake without a kernel), its 700 W cap."""
    kp = gpu.kernel_power
    assert kp is not None
    busy = min(kp.tensor_w, gpu.tdp_w)  # the fit's tensor power exceeds the limit; the H200's GEMM-bound blocks drew it
    return DvfsParams(_A100.compute_share, _A100.static_share, busy, kp.idle_w, sharpness=_A100.sharpness,
                      static_voltage_share=_A100.static_voltage_share, voltage_knee=_A100.voltage_knee,
                      memory_share=_A100.memory_share, power_cap_w=gpu.tdp_w,
                      source=_GH100_SRC.format(busy=busy, idle=kp.idle_w, cap=gpu.tdp_w))


PARAMS: dict[str, DvfsParams] = {
    "A100-40GB": _A100,
    "A100-80GB": _A100,
    "A40": _A40,
    "V100-16GB": _V100,
    "V100-32GB": _V100,
    # H100 SXM and H200: the same GH100 die and 700 W limit, one fit at f_max for both (docs/energy.md §1)
    "H100-80GB": _gh100(CATALOG["H100-80GB"]),
    "H200": _gh100(CATALOG["H200"]),
    # 1 + α(2100/1350 − 1) = 1.225 → α ≈ 0.405 (EnvPipe's stretch at its measured valley).
    "RTX3090": _old(0.405, 1350 / 2100, 0.9 * 350, 100.0, _ENVPIPE.format(1350, "≈100 W (EnvPipe §4.5.2)")),
    "T4": _old(0.5, 0.65, 0.9 * 70, 14.0, _ASSUMED.format(0.65)),
    # One CPU core: modelled only (no cpufreq/RAPL where ampe was written); labelled so in every output.
    "cpu": _old(0.6, 0.6, 15.0, 5.0, "assumed: modelled CPU core, α 0.6, valley 0.6·f_max, blocking = idle"),
}


def params_for(gpu: GpuType) -> DvfsParams:
    """The model parameters of ``gpu``: its own (a cluster spec's ``dvfs:``), the catalog's, a catalog type's derived
    to this one's TDP, else generic ones.

    * A catalog type, or a cluster spec's override of one that keeps its TDP: the catalog's parameters.
    * A variant (a spec type with ``base:``, ``GpuType.dvfs_base``; or an override of a catalog type with another
      TDP): the base's parameters with every watt scaled to this type's TDP (:func:`derived_params`).
    * Anything else (cluster-spec types without ``dvfs:`` or ``base:``): the earlier model with α = 0.5, the valley at
      0.67·f_max, busy power 0.9·TDP, blocking max(idle, 0.2·TDP), labelled "generic assumed defaults".
    """
    gpu = gpu.healthy()  # a straggler (GpuType.slowed) draws as its healthy type
    if gpu.dvfs is not None:
        return gpu.dvfs
    base_name = gpu.dvfs_base or gpu.name
    p = PARAMS.get(base_name)
    base = CATALOG.get(base_name)
    if p is None or base is None:
        return _generic(gpu.name, gpu.tdp_w, gpu.idle_w)
    if gpu.name == base_name and gpu.tdp_w == base.tdp_w:
        return p
    return derived_params(p, base_name, base.tdp_w, gpu.tdp_w)


@functools.lru_cache(maxsize=64)
def derived_params(p: DvfsParams, base_name: str, base_tdp_w: float, tdp_w: float) -> DvfsParams:
    """The DVFS model of a variant of catalog type ``base_name`` (parameters ``p``, TDP ``base_tdp_w`` W) whose own TDP
    is ``tdp_w`` W (docs/energy.md §1, *Derived types*).

    The shape carries over: compute and memory shares, sharpness, static share and its voltage part, voltage knee,
    activity slopes, all against x = f / f_max of the variant's own clock range (as the catalog's H100 carries A100's).
    The watts follow the TDP: busy and blocking power × k = tdp_w / base_tdp_w, and the cap is the base's × k but at
    most ``tdp_w`` (a card never draws above its own limit: A100's fitted 471.5 W cap, above its 400 W datasheet TDP
    because Perseus's boards ran at 500 W, becomes 300 W on a 300 W card; A40's, 2 % under its limit, stays 2 % under).
    A variant with the base's TDP has the base's numbers exactly. The source says "derived from <base>", and the
    parameters count as assumed.
    """
    k = tdp_w / base_tdp_w
    cap = p.power_cap_w
    if cap is not None and k != 1.0:
        cap = min(cap * k, tdp_w)
    kind = "assumed" if p.assumed else "fitted"
    source = (f"derived from {base_name}: its {kind} DVFS shape, watts × {k:.4g} ({tdp_w:g} W / {base_tdp_w:g} W TDP)"
              + (f", cap {cap:.4g} W" if cap is not None else ""))
    return replace(p, busy_w=p.busy_w * k, blocking_w=p.blocking_w * k, power_cap_w=cap, source=source)


@functools.lru_cache(maxsize=64)
def _generic(name: str, tdp_w: float, idle_w: float) -> DvfsParams:
    return _old(0.5, 0.67, 0.9 * tdp_w, max(idle_w, 0.2 * tdp_w), "generic assumed defaults")


def _x(gpu: GpuType, mhz: float) -> float:
    if not mhz > 0:
        raise ValueError(f"SM clock must be positive, got {mhz}")
    return min(float(mhz), gpu.sm_clock_max_mhz) / gpu.sm_clock_max_mhz


def time_ratio(gpu: GpuType, mhz: float, act: float = 1.0) -> float:
    """t(f) / t(f_max) of a computation of activity ``act`` (1: the type's reference) on ``gpu`` at SM clock ``mhz``
    (≥ 1; clocks above f_max count as f_max)."""
    return float(ratios(params_for(gpu), _x(gpu, mhz), act)[0])


def power_w(gpu: GpuType, mhz: float, act: float = 1.0) -> float:
    """Busy power of ``gpu`` computing (activity ``act``; 1: the type's reference) at SM clock ``mhz``, in watts (at
    most the power cap)."""
    return float(ratios(params_for(gpu), _x(gpu, mhz), act)[1])


def activity(p: DvfsParams, watts: np.ndarray | float) -> np.ndarray:
    """A computation's activity from its measured power ``watts`` (W, uncapped) at f_max: the factor on the type's
    clock-dependent power (memory + dynamic) that gives it, the card's static watts unchanged (1: the type's
    reference computation; at least 1e-3, for one measured at or below the static floor)."""
    top = np.asarray(watts, dtype=float) / p.busy_w
    return np.maximum((top - p.static_share) / max(1.0 - p.static_share, 1e-9), 1e-3)


# A capped card's average power sits a little below its limit (Perseus's gpt3-175b A40 stages: 292.1 W against the
# fitted 293.2 W), so power within this share below the cap does not tell how active a computation is.
CAP_BAND = 0.03


@functools.lru_cache(maxsize=4096)  # pure; a 16,384-GPU plan asks it ~10⁵ times for a few dozen (type, watts)
def measured_activity(gpu: GpuType, watts: float) -> tuple[float, float]:
    """(activity, power scale) of a computation measured drawing ``watts`` (W) at ``gpu``'s default clock f_max.

    Where the cap does not bind at f_max, or well below it, the computation is not throttled: its activity is
    :func:`activity` and its power curve meets ``watts`` at f_max (scale 1). At or above a binding cap, the cap hides
    how active it is: the type's reference curve (activity 1) scaled to ``watts``. In the :data:`CAP_BAND` just below
    the cap the activity moves linearly from the unthrottled value to 1, so a watt more or less never flips a plan
    (docs/energy.md §1).
    """
    p = params_for(gpu)
    fmax = gpu.sm_clock_max_mhz
    top = power_w(gpu, fmax)
    capped = p.power_cap_w is not None and top >= p.power_cap_w * (1 - 1e-9)
    low = (1.0 - CAP_BAND) * top if capped else math.inf
    if watts < low:
        a = float(activity(p, watts))
    elif watts < top:
        a_low = float(activity(p, low))
        a = a_low + (watts - low) / (top - low) * (1.0 - a_low)
    else:
        return 1.0, watts / top
    return a, watts / power_w(gpu, fmax, a)


@functools.lru_cache(maxsize=4096)
def _curve(p: DvfsParams, fmax: float, clocks: tuple[float, ...], act: float) -> tuple[np.ndarray, np.ndarray]:
    t, w = ratios(p, np.minimum(np.asarray(clocks, dtype=float), fmax) / fmax, act)
    t.setflags(write=False)
    w.setflags(write=False)
    return t, w


def clock_curve(gpu: GpuType, clocks_mhz: tuple[float, ...], act: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(:func:`time_ratio`, :func:`power_w`) at every clock of ``clocks_mhz`` at once (read-only arrays, cached)."""
    if any(not f > 0 for f in clocks_mhz):
        raise ValueError(f"SM clock must be positive, got {min(clocks_mhz)}")
    return _curve(params_for(gpu), float(gpu.sm_clock_max_mhz), tuple(float(f) for f in clocks_mhz), float(act))


def blocking_power_w(gpu: GpuType) -> float:
    """Power of ``gpu`` while it waits on communication (pipeline bubbles, P2P), in watts; clock-independent."""
    return params_for(gpu).blocking_w


def energy_valley_mhz(gpu: GpuType) -> int:
    """The catalog clock of minimum raw energy (power × time) of a busy ``gpu``."""
    clocks = np.asarray(gpu.sm_clocks_mhz(), dtype=float)
    t, pw = ratios(params_for(gpu), np.minimum(clocks, gpu.sm_clock_max_mhz) / gpu.sm_clock_max_mhz)
    return int(clocks[int(np.argmin(t * pw))])
