"""A stage's energy at f_max from what bounds its kernels, where the GPU type has a fitted power per bound
(``GpuType.kernel_power``: H100 and H200, docs/energy.md §1 *Power from the kernels*).

The roofline (:mod:`ampe.costmodel.compute`) knows which kernels are bound by tensor-core products, by SIMT products
and by memory traffic, and for how long (:func:`~ampe.costmodel.compute.busy_seconds`). A computation of ``T``
seconds (the cost model's stage time: measured profile or roofline) is charged::

    E = Σ_bound P_bound · k · busy_bound + P_idle · (T − k · Σ busy),   k = min(1, T / Σ busy)

each bound at its power, and the rest of the time — overheads, the host not keeping up, tensor-parallel all-reduces
inside the stage time — at the idle power; busy seconds beyond ``T`` (a roofline slower than the time used) are
scaled down. Recomputation adds the forward's busy seconds to the backward, as it adds the forward's time
(:func:`~ampe.costmodel.compute.recompute_extra_s`). The energy planner takes the resulting power as it takes a
profile's measured power at f_max (an activity on the type's DVFS shape, :func:`ampe.energy.dvfs.measured_activity`).
"""

from __future__ import annotations

import numpy as np

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.compute import BOUNDS, attention_share, busy_seconds, recompute_extra_s
from ampe.costmodel.dvfs_params import KernelPower
from ampe.costmodel.model import Model
from ampe.costmodel.strategy import Strategy

#: (GPU type, tp, mbs, recompute) → :func:`cumulative_busy` (a cost model keeps one)
BusyCache = dict[tuple[str, int, int, str], tuple[np.ndarray, np.ndarray]]


def energy_at_fmax(power: KernelPower, busy: np.ndarray, seconds: float) -> float:
    """Joules of one computation of ``seconds`` s whose kernels are busy ``busy`` s by bound (:data:`BOUNDS`
    order), at f_max (see the module docstring)."""
    total = float(busy.sum())
    k = min(1.0, seconds / total) if total > 0 else 0.0
    return power.idle_w * (seconds - k * total) + k * float(np.dot(busy, power.watts()))


def cumulative_busy(model: Model, gpu: GpuType, tp: int, mbs: int, recompute: str) -> tuple[np.ndarray, np.ndarray]:
    """(forward, backward) (L + 1, 3) running sums over the layers of their busy seconds by bound for one micro-batch
    on one tp rank, the backward with ``recompute``'s extra forward work: a stage of layers a..b-1 is row b − row a."""
    fwd, bwd = busy_seconds(model, gpu, tp, mbs)
    if recompute != "none":
        share = attention_share(model, gpu, tp, mbs) if recompute == "selective" else None
        bwd = bwd + np.stack([recompute_extra_s(model, fwd[:, c], recompute, share) for c in range(len(BOUNDS))],
                             axis=1)
    zero = np.zeros((1, len(BOUNDS)))
    return np.vstack([zero, np.cumsum(fwd, axis=0)]), np.vstack([zero, np.cumsum(bwd, axis=0)])


def stage_energy(power: KernelPower, cum: tuple[np.ndarray, np.ndarray], layers: range, forward_s: float,
                 backward_s: float) -> tuple[float, float]:
    """(joules, seconds) of one micro-batch's forward and backward through ``layers`` at f_max on one GPU, from the
    running busy sums ``cum`` (:func:`cumulative_busy`) and the stage's forward and backward seconds."""
    f_busy = cum[0][layers.stop] - cum[0][layers.start]
    b_busy = cum[1][layers.stop] - cum[1][layers.start]
    joules = energy_at_fmax(power, f_busy, forward_s) + energy_at_fmax(power, b_busy, backward_s)
    return joules, forward_s + backward_s


def strategy_kernel_energy(model: Model, types: dict[str, GpuType], cache: BusyCache, s: Strategy,
                           pace: list[tuple[str, ...]], fwd: np.ndarray, bwd: np.ndarray
                           ) -> tuple[tuple[tuple[float, float] | None, ...], ...]:
    """Per replica class and position of partitioned ``s``: (joules, seconds) of one micro-batch at f_max from the
    stage's kernels where its pace-setting type (``pace``, names in ``types``) has a power by kernel bound, else
    None; () when no stage's has. ``fwd``/``bwd``: the stages' seconds per micro-batch, [class, position]."""
    if not any(types[name].kernel_power is not None for names in pace for name in names):
        return ()
    assert s.partition is not None
    out = []
    for r, names in enumerate(pace):
        row: list[tuple[float, float] | None] = []
        for pos, name in enumerate(names):
            gpu = types[name]
            if gpu.kernel_power is None:
                row.append(None)
                continue
            key = (name, s.tp, s.mbs, s.recompute_at(pos % s.pp))
            cum = cache.get(key)
            if cum is None:
                cum = cache[key] = cumulative_busy(model, gpu, s.tp, s.mbs, key[3])
            row.append(stage_energy(gpu.kernel_power, cum, range(s.partition[pos], s.partition[pos + 1]),
                                    float(fwd[r, pos]), float(bwd[r, pos])))
        out.append(tuple(row))
    return tuple(out)
