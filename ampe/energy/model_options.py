"""A computation's clock options from the analytic DVFS model (:mod:`ampe.energy.dvfs`), per GPU type."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING

from ampe.tradeoff.options import OpOptions, Option

if TYPE_CHECKING:  # a measured profile needs neither the catalog nor the DVFS model: imported where modelled
    from ampe.costmodel.catalog import GpuType


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
