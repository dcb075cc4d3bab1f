"""Measured energy of a pipeline stage from a per-layer profile: per-clock options, or a power scale.

* A profile with per-clock rows (``ampe profile --clocks``: ``sm_clock_mhz``, ``forward_j``, ``backward_j``) gives
  each stage its measured (clock, seconds, joules) options: the sums over the stage's layers at every clock where all
  of them were measured. Times are scaled so the highest clock's forward and backward equal the cost model's stage
  times (which add per-instruction overheads the per-layer rows do not hold); energy scales with them (same power).
* A profile with energy only at the default clock (``forward_j``/``backward_j``, no clock) gives each stage its
  measured (joules, seconds); the energy planner divides by the DVFS model's joules for the same seconds at f_max
  and scales the model's power by that ratio at every clock.

Energy covers every GPU of the stage's tensor-parallel group (each shard measured the same computation).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ampe.costmodel.model import Model
from ampe.costmodel.profile import Profile
from ampe.costmodel.strategy import Strategy


@dataclass(frozen=True)
class ClockOption:
    """One measured clock of one stage, per micro-batch: seconds and joules (all the stage's GPUs)."""

    mhz: int
    forward_s: float
    forward_j: float
    backward_s: float
    backward_j: float


def stage_clock_options(profile: Profile, model: Model, gpu: str, tp: int, mbs: int, layers: range, gpus: int,
                        forward_s: float, backward_s: float) -> tuple[ClockOption, ...]:
    """Measured options of a stage holding ``layers`` on ``gpus`` GPUs of type ``gpu`` at (``tp``, ``mbs``);
    ``forward_s``/``backward_s`` are the cost model's stage times at the highest clock. Empty when the profile has
    no complete per-clock energy for these layers."""
    out = []
    for mhz in profile.clocks(model.name, gpu, tp):
        got = [profile.layer_at_clock(model.name, gpu, tp, i, mbs, mhz) for i in layers]
        samples = [x for x in got if x is not None and x.forward_j is not None and x.backward_j is not None]
        if not samples or len(samples) < len(got):
            continue
        out.append(ClockOption(mhz, sum(x.forward_s for x in samples), gpus * sum(x.forward_j or 0.0 for x in samples),
                               sum(x.backward_s for x in samples),
                               gpus * sum(x.backward_j or 0.0 for x in samples)))
    if not out:
        return ()
    top = max(out, key=lambda o: o.mhz)
    rf = forward_s / top.forward_s if top.forward_s > 0 else 1.0
    rb = backward_s / top.backward_s if top.backward_s > 0 else 1.0
    return tuple(ClockOption(o.mhz, o.forward_s * rf, o.forward_j * rf, o.backward_s * rb, o.backward_j * rb)
                 for o in sorted(out, key=lambda o: o.mhz))


def stage_default_energy(profile: Profile, model: Model, gpu: str, tp: int, mbs: int, layers: range
                         ) -> tuple[float, float] | None:
    """(joules, seconds) of one micro-batch's forward+backward through ``layers`` on one GPU at the default clock,
    measured; None without complete energy columns for them."""
    joules = seconds = 0.0
    for i in layers:
        s = profile.layer_sample(model.name, gpu, tp, i, mbs)
        if s is None or s.forward_j is None or s.backward_j is None:
            return None
        joules += s.forward_j + s.backward_j
        seconds += s.forward_s + s.backward_s
    return (joules, seconds) if seconds > 0 and layers else None


def measured_energy(profile: Profile | None, model: Model, s: Strategy, pace: list[tuple[str, ...]],
                    fwd: np.ndarray, bwd: np.ndarray) -> tuple[tuple, tuple]:
    """Per replica class and position of ``s``: the stage's measured per-clock options and default-clock (joules,
    seconds) (``pace``: GPU type names, ``fwd``/``bwd``: seconds per micro-batch, indexed by class); empty where
    the profile has no energy.

    Args:
        profile: the cost model's profile (rows of its model), or None.
        model: the model.
        s: the completed strategy.
        pace: [class][position] the pace-setting GPU type.
        fwd: (classes, positions) forward seconds per micro-batch.
        bwd: (classes, positions) backward seconds per micro-batch.

    Returns:
        (options, default): [class][position] of :func:`stage_clock_options` and :func:`stage_default_energy`.
    """
    if profile is None or not profile.has_energy:
        return (), ()
    assert s.partition is not None
    opts, default = [], []
    for r, names in enumerate(pace):
        o_r, d_r = [], []
        for pos, gpu in enumerate(names):
            layers = range(s.partition[pos], s.partition[pos + 1])
            o_r.append(stage_clock_options(profile, model, gpu, s.tp, s.mbs, layers, s.tp, float(fwd[r, pos]),
                                           float(bwd[r, pos])))
            d_r.append(stage_default_energy(profile, model, gpu, s.tp, s.mbs, layers))
        opts.append(tuple(o_r))
        default.append(tuple(d_r))
    return tuple(opts), tuple(default)
