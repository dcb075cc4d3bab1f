"""Fitting the DVFS model (:mod:`ampe.energy.dvfs`) to measured clock sweeps, and its error on them.

Two kinds of measurement:

* :class:`ClockSweep`: one computation measured at several SM clocks (time and energy per clock), as in the Perseus
  per-clock stage profiles (``stage,instruction,frequency,time,energy``) that ``ampe dvfs fit`` reads;
* :class:`LimitSweep`: one training workload run under several power limits (time and average power, no clocks),
  as in the Zeus NSDI'23 traces. Each run's clock is the one at which the workload's power curve meets its measured
  average power, never below the card's lowest clock. The curve: the card's static watts (the type's, whatever
  runs) plus the type's clock-dependent part (memory and dynamic) scaled by the workload's *activity*, which its
  power at the highest limit (taken as f_max) fixes; the activity also sets the workload's compute and memory
  shares (slopes β, γ: a less active workload is more memory-bound).

Errors are relative to each sweep's own fastest setting (highest clock or limit): |predicted / measured − 1| of the
time ratio and of the energy ratio, averaged over every measured point. The *best saving* of a sweep is
1 − min(energy / energy at the top setting) over its settings, measured and predicted on the same settings.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.dvfs_params import DvfsParams
from ampe.energy import dvfs
from ampe.errors import InputError
from ampe.io import csv_records, read_text

BUSY_SHARE_OF_LIMIT = 0.6  # a power-limit workload counts as busy when it draws ≥ 60 % of its highest limit


@dataclass(frozen=True)
class ClockSweep:
    """One computation measured at several SM clocks: MHz, seconds and joules per run, same length."""

    label: str
    mhz: np.ndarray
    time_s: np.ndarray
    energy_j: np.ndarray


@dataclass(frozen=True)
class LimitSweep:
    """One workload trained under several power limits: limit (W), seconds per epoch, average power (W)."""

    label: str
    limit_w: np.ndarray
    time_s: np.ndarray
    power_w: np.ndarray


@dataclass(frozen=True)
class FitError:
    """Error of a model on some sweeps: mean |relative error| of time and energy ratios, and best savings."""

    points: int
    sweeps: int
    time_err: float  # mean |t_pred / t_meas − 1| of the ratios to each sweep's top setting
    energy_err: float
    measured_saving: float  # mean over sweeps of the measured best saving (fraction)
    predicted_saving: float  # the same from the model, on the same settings


# ---------------------------------------------------------------------------------------------------------------
# Readers


def _rows(path: str, required: Sequence[str]) -> list[tuple[int, dict[str, str]]]:
    """(row number, cells by column) of every data row of the CSV at ``path``; at least one."""
    rows = list(csv_records(path, read_text(path), required))
    if not rows:
        raise InputError(path, "(rows)", "no measurements")
    return rows


def _number(path: str, row: int, key: str, value: str | None, positive: bool = True) -> float:
    try:
        v = float(value if value is not None else "")
    except ValueError:
        raise InputError(path, f"row {row}.{key}", f"not a number: {value!r}") from None
    if not math.isfinite(v) or (positive and v <= 0):
        raise InputError(path, f"row {row}.{key}", f"must be a positive finite number, got {value}")
    return v


def read_clock_profile(path: str) -> list[ClockSweep]:
    """Per-clock sweeps of a Perseus/Zeus profile CSV (``stage,instruction,frequency,time,energy``; MHz, s, J).

    One sweep per (stage, instruction) and, where present, ``rank``; extra columns are ignored. A sweep needs at
    least two clocks. Raises :class:`InputError` naming the file and the field.
    """
    rows = _rows(path, ("stage", "instruction", "frequency", "time", "energy"))
    groups: dict[tuple[str, ...], dict[float, tuple[float, float]]] = {}
    for i, r in rows:
        key: tuple[str, ...] = (r["stage"], r["instruction"], r.get("rank", ""))
        if not key[0] or not key[1]:
            raise InputError(path, f"row {i}.{'stage' if not key[0] else 'instruction'}", "empty")
        f = _number(path, i, "frequency", r["frequency"])
        t = _number(path, i, "time", r["time"])
        e = _number(path, i, "energy", r["energy"])
        g = groups.setdefault(key, {})
        if f in g:
            raise InputError(path, f"row {i}.frequency", f"clock {f:g} MHz appears twice for stage {key[0]} "
                             f"{key[1]}")
        g[f] = (t, e)
    out = []
    for key, g in groups.items():
        if len(g) < 2:
            raise InputError(path, "frequency", f"stage {key[0]} {key[1]} has one clock; a fit needs a sweep")
        mhz = np.array(sorted(g))
        label = f"{path}:{key[0]}/{key[1]}" + (f"/rank{key[2]}" if key[2] else "")
        out.append(ClockSweep(label, mhz, np.array([g[f][0] for f in mhz]), np.array([g[f][1] for f in mhz])))
    return out


def read_power_limit_trace(path: str) -> list[LimitSweep]:
    """Busy workloads of a Zeus power-limit trace (``dataset,network,batch_size,optimizer,power_limit,
    time_per_epoch,average_power``; W, s, W).

    A workload is kept when it has at least three limits and draws ≥ 60 % of its highest limit there (a lighter
    one never meets the limits, so they tell nothing about its clocks).
    """
    cols = ("dataset", "network", "batch_size", "optimizer", "power_limit", "time_per_epoch", "average_power")
    rows = _rows(path, cols)
    groups: dict[tuple[str, ...], list[tuple[float, float, float]]] = {}
    for i, r in rows:
        key = tuple(r[c] for c in cols[:4])
        groups.setdefault(key, []).append((_number(path, i, "power_limit", r["power_limit"]),
                                           _number(path, i, "time_per_epoch", r["time_per_epoch"]),
                                           _number(path, i, "average_power", r["average_power"])))
    out = []
    for key, pts in groups.items():
        pts.sort()
        if len(pts) < 3 or pts[-1][2] < BUSY_SHARE_OF_LIMIT * pts[-1][0]:
            continue
        a = np.array(pts)
        out.append(LimitSweep(f"{path}:{'/'.join(key)}", a[:, 0], a[:, 1], a[:, 2]))
    return out


# ---------------------------------------------------------------------------------------------------------------
# Predictions


def predict_clock_sweep(p: DvfsParams, gpu: GpuType, sweep: ClockSweep) -> tuple[np.ndarray, np.ndarray]:
    """Predicted (time ratio, energy ratio) of ``sweep``'s clocks to its highest clock."""
    x = np.minimum(sweep.mhz, gpu.sm_clock_max_mhz) / gpu.sm_clock_max_mhz
    t, pw = dvfs.ratios(p, x)
    return t / t[-1], (t * pw) / (t[-1] * pw[-1])


def _workload_power(p: DvfsParams, x: np.ndarray, activity: np.ndarray) -> np.ndarray:
    """Relative power (to ``busy_w``) of a computation whose clock-dependent part is ``activity`` × the type's."""
    return dvfs.relative_power(p, x, activity)


def activity(p: DvfsParams, top_w: np.ndarray | float) -> np.ndarray:
    """A workload's activity from its power ``top_w`` (W) at f_max (:func:`ampe.energy.dvfs.activity`)."""
    return dvfs.activity(p, top_w)


def _inverse_power(p: DvfsParams, target: np.ndarray, act: np.ndarray, x_min: float) -> np.ndarray:
    """Relative clocks where the workload's power (``act``, :func:`activity`) is ``target`` × ``busy_w``, clamped
    to [x_min, 1]; it rises strictly with x, so bisection."""
    lo = np.full_like(target, x_min)
    hi = np.ones_like(target)
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        below = _workload_power(p, mid, act) < target
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    x = 0.5 * (lo + hi)
    x = np.where(target >= _workload_power(p, np.ones_like(target), act), 1.0, x)
    return np.where(_workload_power(p, np.full_like(target, x_min), act) >= target, x_min, x)


def predict_limit_sweep(p: DvfsParams, gpu: GpuType, sweep: LimitSweep) -> tuple[np.ndarray, np.ndarray]:
    """Predicted (time ratio, energy ratio) of ``sweep``'s limits to its highest limit.

    No clock is recorded, so each run's clock is inferred from its measured average power (as the trace's README
    advises: a limit caps peaks, the average sits below it): the x at which the workload's power — the card's
    static watts plus its :func:`activity` × the type's clock-dependent power, the activity fixed by its power at
    the highest limit, taken as f_max — meets it (never below the card's lowest clock). The energy ratio is the
    measured power ratio × the predicted time ratio, so on traces the model's time-against-power curve is what is
    tested.
    """
    act = np.full(sweep.power_w.shape, float(activity(p, sweep.power_w[-1])))
    x = _inverse_power(p, sweep.power_w / p.busy_w, act, gpu.sm_clock_min_mhz / gpu.sm_clock_max_mhz)
    x[-1] = 1.0
    t = dvfs.relative_time(p, x, act) / dvfs.relative_time(p, 1.0, act)
    return t, t * sweep.power_w / sweep.power_w[-1]


def _measured(sweep: ClockSweep | LimitSweep) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(sweep, ClockSweep):
        return sweep.time_s / sweep.time_s[-1], sweep.energy_j / sweep.energy_j[-1]
    e = sweep.time_s * sweep.power_w
    return sweep.time_s / sweep.time_s[-1], e / e[-1]


def _predict(p: DvfsParams, gpu: GpuType, sweep: ClockSweep | LimitSweep) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(sweep, ClockSweep):
        return predict_clock_sweep(p, gpu, sweep)
    return predict_limit_sweep(p, gpu, sweep)


def fit_error(p: DvfsParams, gpu: GpuType, sweeps: Sequence[ClockSweep | LimitSweep]) -> FitError:
    """Mean relative error of ``p`` on ``sweeps`` (every point but each sweep's reference), and best savings."""
    if not sweeps:
        raise ValueError("no sweeps to evaluate")
    te: list[np.ndarray] = []
    ee: list[np.ndarray] = []
    ms, ps = [], []
    for s in sweeps:
        mt, me = _measured(s)
        pt, pe = _predict(p, gpu, s)
        te.append(np.abs(pt[:-1] / mt[:-1] - 1.0))
        ee.append(np.abs(pe[:-1] / me[:-1] - 1.0))
        ms.append(1.0 - float(np.min(me)))
        ps.append(1.0 - float(np.min(pe)))
    t, e = np.concatenate(te), np.concatenate(ee)
    return FitError(int(t.size), len(sweeps), float(t.mean()), float(e.mean()), float(np.mean(ms)),
                    float(np.mean(ps)))


# ---------------------------------------------------------------------------------------------------------------
# Fitting

_SHAPE = ("compute_share", "sharpness", "static_share", "static_voltage_share", "voltage_knee")
_LOWER = (0.01, 1.0, 0.0, 0.0, 0.0, 0.0)
_UPPER = (1.0, 8.0, 0.95, 1.0, 0.99, 0.95)
# Bounds of the activity slopes, signed as physics has it: a less active computation (less clock-dependent power than
# the reference) is more memory-bound, so its compute share is lower (β ≥ 0) and its memory share higher (γ ≤ 0).
_SLOPE = (0.0, 2.0)
_MEMORY_SLOPE = (-1.0, 0.0)


def _with(p: DvfsParams, v: np.ndarray, power: bool, slope: bool = False) -> DvfsParams:
    """``v``: the shape, the memory share as a fraction of the non-static power (so s + m ≤ 1 holds inside the
    bounds), then with clock sweeps (``power``) busy power and cap (W), then with power-limit traces (``slope``) the
    activity slopes β and γ."""
    kw: dict[str, Any] = dict(zip(_SHAPE, (float(a) for a in v[:5]), strict=True))
    kw["memory_share"] = float(v[5]) * (1.0 - kw["static_share"])
    if power:
        kw["busy_w"] = float(v[6])
        kw["power_cap_w"] = float(v[7]) if v[7] < v[6] else None
    if slope:
        kw["activity_slope"] = float(v[-2])
        kw["activity_memory_slope"] = float(v[-1])
    return replace(p, **kw)


@dataclass(frozen=True)
class _Stacked:
    """Every sweep's points in flat arrays, so one residual evaluation is a few vector operations."""

    x: np.ndarray  # clock sweeps: relative clock of each point
    x_top: np.ndarray  # … and of its sweep's reference (highest) clock
    watts: np.ndarray  # … measured power (W)
    limit_w: np.ndarray  # limit sweeps: measured average power (W)
    top_w: np.ndarray  # … and its sweep's power at the highest limit (W)
    mt: np.ndarray  # measured time ratios: clock points, then limit points (references left out)
    me: np.ndarray  # measured energy ratios, same order
    keep_c: np.ndarray  # clock points that are not a reference
    keep_l: np.ndarray  # limit points that are not a reference


def _stack(gpu: GpuType, clock_sweeps: Sequence[ClockSweep], limit_sweeps: Sequence[LimitSweep]) -> _Stacked:
    fmax = gpu.sm_clock_max_mhz
    cx = [np.minimum(s.mhz, fmax) / fmax for s in clock_sweeps]
    both: list[ClockSweep | LimitSweep] = [*clock_sweeps, *limit_sweeps]
    meas = [_measured(s) for s in both]
    ref_c = [np.arange(len(s.mhz)) < len(s.mhz) - 1 for s in clock_sweeps]
    ref_l = [np.arange(len(s.limit_w)) < len(s.limit_w) - 1 for s in limit_sweeps]
    cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0))  # noqa: E731
    keep = [*ref_c, *ref_l]
    return _Stacked(
        x=cat(cx), x_top=cat([np.full(len(x), x[-1]) for x in cx]),
        watts=cat([s.energy_j / s.time_s for s in clock_sweeps]),
        limit_w=cat([s.power_w for s in limit_sweeps]),
        top_w=cat([np.full(len(s.power_w), s.power_w[-1]) for s in limit_sweeps]),
        mt=cat([m[0][k] for m, k in zip(meas, keep, strict=True)]),
        me=cat([m[1][k] for m, k in zip(meas, keep, strict=True)]),
        keep_c=cat(ref_c).astype(bool), keep_l=cat(ref_l).astype(bool))


def _residuals(p: DvfsParams, gpu: GpuType, d: _Stacked) -> np.ndarray:
    pt, pe, pw = [], [], []
    if d.x.size:
        t, w = dvfs.ratios(p, d.x)
        t0, w0 = dvfs.ratios(p, d.x_top)
        pt.append((t / t0)[d.keep_c])
        pe.append((t * w / (t0 * w0))[d.keep_c])
        pw.append(0.5 * (w / d.watts - 1.0))  # absolute power: places busy power and the cap
    if d.limit_w.size:
        act = activity(p, d.top_w)
        x = _inverse_power(p, d.limit_w / p.busy_w, act, gpu.sm_clock_min_mhz / gpu.sm_clock_max_mhz)
        x = np.where(d.keep_l, x, 1.0)
        t = dvfs.relative_time(p, x, act) / dvfs.relative_time(p, 1.0, act)
        pt.append(t[d.keep_l])
        pe.append((t * d.limit_w / d.top_w)[d.keep_l])
    return np.concatenate([np.concatenate(pt) / d.mt - 1.0, np.concatenate(pe) / d.me - 1.0, *pw])


def fit(gpu: GpuType, clock_sweeps: Sequence[ClockSweep] = (), limit_sweeps: Sequence[LimitSweep] = (), *,
        blocking_w: float | None = None, source: str = "", activity_slope: bool = True) -> DvfsParams:
    """Least-squares fit (scipy) of the DVFS parameters of ``gpu`` to measured sweeps.

    The shape (α, n, s, σ, x_v, m) is fitted to the time and energy ratios of every sweep. With clock sweeps, the
    busy power at f_max (watts) and a power cap are fitted too, from the absolute power at each clock; a cap the
    fit places above the busy power is no cap (None). Without clock sweeps busy power and cap stay the catalog
    model's (and the shape is loosely determined: traces give time against power, not against the clock).
    With power-limit traces (and ``activity_slope``) the activity slopes β ∈ [0, 2] and γ ∈ [−1, 0] are fitted too:
    the traces' workloads span activities (their power at the top limit), and a computation of activity a has
    compute share α + β·(a − 1) and memory share m + γ·(a − 1). They need clock sweeps beside the traces: those
    are the reference (a = 1) and fix busy power, without which a = 1 is only an assumed wattage (V100) and the
    slopes are not determined (on V100 they lower the in-sample error but raise a held-out one); otherwise
    β = γ = 0. ``blocking_w`` (watts) defaults to the catalog model's. Robust loss (soft L1) so a few noisy clocks
    do not pull the curve; several starting points, the best kept.
    """
    from scipy.optimize import least_squares  # lazily: only fitting needs it

    if not clock_sweeps and not limit_sweeps:
        raise ValueError("nothing to fit")
    base = dvfs.params_for(gpu)
    power = bool(clock_sweeps)
    start = DvfsParams(0.5, 0.4, base.busy_w, base.blocking_w if blocking_w is None else blocking_w,
                       power_cap_w=base.power_cap_w, source=source)
    d = _stack(gpu, clock_sweeps, limit_sweeps)
    top_w = float(d.watts.max()) if d.watts.size else gpu.tdp_w
    slope = bool(limit_sweeps) and bool(clock_sweeps) and activity_slope
    lower, upper = list(_LOWER), list(_UPPER)
    if power:
        lower += [0.5 * top_w, 0.5 * top_w]
        upper += [3.0 * top_w, 3.0 * top_w]
    if slope:
        lower += [_SLOPE[0], _MEMORY_SLOPE[0]]
        upper += [_SLOPE[1], _MEMORY_SLOPE[1]]
    starts = []
    for a0 in (0.5, 0.85):
        for k0 in (0.3, 0.75):
            v0 = [a0, 2.0, 0.4, 0.5, k0, 0.2] + ([1.1 * top_w, 1.05 * top_w] if power else [])
            starts.append(v0 + ([0.1, -0.1] if slope else []))
    # ... and the catalog's own curve, so the fit never ends worse than the model it would replace (by its own
    # objective): which of the generic starts a local solver converges from differs between scipy releases
    shape = [getattr(base, k) for k in _SHAPE] + [base.memory_share / max(1e-9, 1.0 - base.static_share)]
    starts.append(shape + ([base.busy_w, base.power_cap_w or 1.05 * base.busy_w] if power else [])
                  + ([base.activity_slope, base.activity_memory_slope] if slope else []))
    best = None
    for v0 in starts:
        r = least_squares(lambda v: _residuals(_with(start, v, power, slope), gpu, d),
                          np.clip(v0, lower, upper), bounds=(lower, upper), loss="soft_l1", f_scale=0.02,
                          x_scale="jac")
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return _with(start, best.x, power, slope)


def gpu_types_block(gpu: GpuType, p: DvfsParams) -> dict[str, dict[str, dict[str, float | str | None]]]:
    """The cluster spec ``gpu_types:`` entry that gives ``gpu`` the parameters ``p`` (rounded for reading)."""
    d: dict[str, float | str | None] = {
        "compute_share": round(p.compute_share, 4),
        "sharpness": round(p.sharpness, 4),
        "static_share": round(p.static_share, 4),
        "static_voltage_share": round(p.static_voltage_share, 4),
        "voltage_knee": round(p.voltage_knee, 4),
        "memory_share": round(p.memory_share, 4),
        "activity_slope": round(p.activity_slope, 4),
        "activity_memory_slope": round(p.activity_memory_slope, 4),
        "busy_w": round(p.busy_w, 2),
        "power_cap_w": None if p.power_cap_w is None else round(p.power_cap_w, 2),
        "blocking_w": round(p.blocking_w, 2),
        "source": p.source,
    }
    return {gpu.name: {"dvfs": d}}


@dataclass(frozen=True)
class ProfileFit:
    """``ampe dvfs fit``'s result: the fitted parameters, their error on the profile, and the spec block."""

    gpu: GpuType
    params: DvfsParams
    error: FitError

    def gpu_types_yaml(self) -> str:
        """The ``gpu_types:`` block for a cluster spec, as YAML text."""
        import yaml  # lazily: only the CLI writes YAML

        return str(yaml.safe_dump({"gpu_types": gpu_types_block(self.gpu, self.params)}, sort_keys=False,
                                   allow_unicode=True))


FLAT_SHARE = 0.01  # a sweep whose time and energy both change less than this over its clocks says nothing of them


def _check_identifiable(path: str, sweeps: Sequence[ClockSweep]) -> None:
    """Refuse a profile where no computation's time or energy moves with the clock (by :data:`FLAT_SHARE` or more):
    the model's parameters would be unidentified, and a "0.0 % error" fit of them would mean nothing."""
    def spread(x: np.ndarray) -> float:
        return float(x.max() / x.min() - 1.0)

    if all(spread(s.time_s) < FLAT_SHARE and spread(s.energy_j) < FLAT_SHARE for s in sweeps):
        lo = min(float(s.mhz[0]) for s in sweeps)
        hi = max(float(s.mhz[-1]) for s in sweeps)
        raise InputError(path, "time", f"flat: in every computation time and energy change by less than "
                         f"{100 * FLAT_SHARE:g} % from {lo:g} to {hi:g} MHz, so the clock's effect cannot be "
                         "identified (was the clock applied while profiling?)")


def fit_profile(path: str, gpu_name: str, blocking_w: float | None = None, gpus: int = 1) -> ProfileFit:
    """Fit the DVFS model of catalog type ``gpu_name`` to a per-clock profile CSV (MHz, s, J); see :func:`fit`.

    ``gpus``: GPUs whose joules each row sums (a tensor-parallel stage's), so busy power is per GPU.

    Raises :class:`InputError` for an unknown type (field ``--gpu``), a bad file, or clocks outside the type's
    range (field ``frequency``).
    """
    from ampe.costmodel.catalog import CATALOG

    gpu = CATALOG.get(gpu_name)
    if gpu is None:
        raise InputError("--gpu", "", f"unknown GPU type {gpu_name!r} (catalog: {', '.join(sorted(CATALOG))})")
    if gpus < 1:
        raise InputError("--gpus", "", f"must be ≥ 1, got {gpus}")
    sweeps = [replace(s, energy_j=s.energy_j / gpus) for s in read_clock_profile(path)]
    lo = min(float(s.mhz[0]) for s in sweeps)
    hi = max(float(s.mhz[-1]) for s in sweeps)
    if lo < gpu.sm_clock_min_mhz or hi > gpu.sm_clock_max_mhz:
        raise InputError(path, "frequency", f"clocks {lo:g}-{hi:g} MHz outside {gpu.name}'s range "
                         f"{gpu.sm_clock_min_mhz:g}-{gpu.sm_clock_max_mhz:g} MHz")
    _check_identifiable(path, sweeps)
    p = fit(gpu, sweeps, blocking_w=blocking_w, source="fitted")
    err = fit_error(p, gpu, sweeps)
    src = (f"fitted by ampe dvfs fit to {path}: {len(sweeps)} computations, {err.points} points {lo:g}-{hi:g} MHz; "
           f"mean error time {100 * err.time_err:.1f}%, energy {100 * err.energy_err:.1f}%")
    return ProfileFit(gpu, replace(p, source=src), err)
