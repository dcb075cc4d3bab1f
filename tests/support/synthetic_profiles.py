"""Synthetic Perseus-format instruction profiles (test support, also used by ``benchmarks/frontier.py``; not
measurements; moved out of ``ampe/``, which never used them).

Shapes (per-stage forward time at f_max, backward = 2 × forward, then the DVFS model over the type's clocks):

* ``lm_head``: equal stages, the last one 20% heavier (a large vocabulary head; Perseus App. B.1), A100;
* ``random``: stage times drawn uniformly within ±25%, A40 (wide clock range);
* ``hetero``: stages alternate between A100 and V100 (different clock tables and valleys);
* ``noisy``: like ``random`` on A100 with ±3% measurement noise on every time and energy and a quarter of the
  clocks missing (non-convex, partly dominated options: what a real profiler returns).

The DVFS curves are pinned here (:data:`SYNTHETIC_DVFS`, the catalog's fits as of 2026-11-24), not read from the
catalog: tests and benchmarks compare ampe with lowtime on these profiles, and a catalog refit once flattened the
A100 curve's slow end so far that lowtime's exponential fits stopped after one step (its cost change fell below
its 1e-6 tolerance), which silently left the lowtime oracle with nothing to compare.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ampe.costmodel.catalog import CATALOG, GpuType
from ampe.costmodel.dvfs_params import DvfsParams
from ampe.costmodel.schedules import BACKWARD, FORWARD
from ampe.energy.model_options import model_options

SHAPES = ("lm_head", "random", "hetero", "noisy")
HEADER = "stage,instruction,frequency,time,energy"
_PINNED = "pinned for synthetic profiles (catalog fit of 2026-11-24)"
SYNTHETIC_DVFS = {
    "A100-80GB": DvfsParams(0.5176, 0.1509, 501.6, 83.64, sharpness=7.257, static_voltage_share=0.0,
                            voltage_knee=0.7813, power_cap_w=471.4, source=_PINNED),
    "A40": DvfsParams(0.4092, 0.5451, 363.6, 70.38, sharpness=1.0, static_voltage_share=0.5038, voltage_knee=0.5751,
                      power_cap_w=293.2, source=_PINNED),
    "V100-32GB": DvfsParams(0.3969, 0.5773, 270.0, 60.0, sharpness=1.809, static_voltage_share=0.4025,
                            voltage_knee=0.3, power_cap_w=300.0, source=_PINNED),
}


def _gpu(name: str) -> GpuType:
    return dataclasses.replace(CATALOG[name], dvfs=SYNTHETIC_DVFS[name])


def profile_rows(shape: str, num_stages: int, seed: int = 0, base_s: float = 0.03) -> list[str]:
    """CSV lines (header first) of a synthetic profile; ``base_s`` is a typical forward time at f_max."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; known: {', '.join(SHAPES)}")
    rng = np.random.default_rng(seed)
    rows = [HEADER]
    for s in range(num_stages):
        if shape == "lm_head":
            gpu, fwd = _gpu("A100-80GB"), base_s * (1.2 if s == num_stages - 1 else 1.0)
        elif shape == "hetero":
            gpu = _gpu("A100-80GB" if s % 2 == 0 else "V100-32GB")
            fwd = base_s * rng.uniform(0.8, 1.2) * (1.0 if s % 2 == 0 else 1.6)
        else:
            gpu = _gpu("A40" if shape == "random" else "A100-80GB")
            fwd = base_s * rng.uniform(0.75, 1.25)
        for kind, t in ((FORWARD, fwd), (BACKWARD, 2 * fwd)):
            for o in model_options(gpu, t).options:
                time_s, energy = o.time_s, o.energy_j
                if shape == "noisy":
                    if rng.uniform() < 0.25 and o.mhz != gpu.sm_clock_max_mhz:
                        continue
                    time_s *= rng.uniform(0.97, 1.03)
                    energy *= rng.uniform(0.97, 1.03)
                rows.append(f"{s},{kind},{o.mhz:g},{time_s:.6f},{energy:.6f}")
    return rows
