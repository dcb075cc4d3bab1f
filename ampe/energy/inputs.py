"""Plain per-stage inputs of the energy planner and their DAG under the analytic DVFS model.

The planner does not depend on the cost model: it takes per-stage forward/backward seconds per micro-batch at
f_max, per-boundary P2P seconds and the GPU type of every stage. :func:`inputs_from_estimate` adapts the cost
model's ``Estimate`` (``fwd_s``/``bwd_s`` indexed [replica][stage], ``p2p_s`` indexed [replica][boundary]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ampe.costmodel.catalog import GpuType
from ampe.costmodel.stage_energy import ClockOption
from ampe.energy import dvfs
from ampe.energy.dag import ComputationDag, build_dag
from ampe.energy.options import OpOptions, Option, model_options
from ampe.energy.schedules import BACKWARD, FORWARD


@dataclass(frozen=True)
class PipelineInputs:
    """One pipeline replica: times per micro-batch at f_max (s), GPU type and GPU count of every stage."""

    fwd_s: tuple[float, ...]
    bwd_s: tuple[float, ...]
    gpus: tuple[GpuType, ...]
    num_microbatches: int
    p2p_forward_s: tuple[float, ...] = ()  # per boundary b (stage b → b+1); empty: no transfers
    p2p_backward_s: tuple[float, ...] | None = None  # per boundary (b+1 → b); None: same as forward
    gpus_per_stage: tuple[int, ...] = ()  # tensor-parallel GPUs per stage; empty: 1 each
    schedule: str = "1f1b"
    virtual_stages: int = 1  # interleaved 1F1B: the per-stage tuples are per virtual stage (chunk · N + stage)
    # Measured energy (ampe.costmodel.stage_energy), per stage; empty or an empty entry: the DVFS model.
    measured: tuple[tuple[ClockOption, ...], ...] = ()  # per-clock options (all the stage's GPUs)
    power_scale: tuple[float, ...] = ()  # measured / modelled power at the default clock (after the activity)
    activity: tuple[float, ...] = ()  # per stage, from its measured power at the default clock; empty: 1 each
    # Per device stage: what a joule there is worth relative to the others (its site's price or carbon intensity ×
    # PUE, ampe.energy.price): the DAG's energies and blocking powers are multiplied by it, so a frontier traced on
    # it trades time against money or CO2e. Empty: 1 each (plain joules).
    energy_weight: tuple[float, ...] = ()

    def source(self, stage: int) -> str:
        """Where stage ``stage``'s options come from: ``measured``, ``scaled`` or ``model``."""
        if self.measured and self.measured[stage]:
            return "measured"
        scaled = (self.power_scale and self.power_scale[stage] != 1.0) or (self.activity
                                                                         and self.activity[stage] != 1.0)
        return "scaled" if scaled else "model"

    def __post_init__(self) -> None:
        n = len(self.fwd_s)
        if not (len(self.bwd_s) == len(self.gpus) == n) or n == 0:
            raise ValueError("fwd_s, bwd_s and gpus need one entry per stage")
        if self.p2p_forward_s and len(self.p2p_forward_s) != n - 1:
            raise ValueError("p2p_forward_s needs one entry per boundary")
        if self.gpus_per_stage and len(self.gpus_per_stage) != n:
            raise ValueError("gpus_per_stage needs one entry per stage")
        if not all(0 <= t < math.inf for t in (*self.fwd_s, *self.bwd_s, *self.p2p_forward_s)):  # NaN fails too
            raise ValueError("times must be finite and non-negative")
        if self.energy_weight and (len(self.energy_weight) != self.num_stages
                                   or not all(0 <= w < math.inf for w in self.energy_weight)):
            raise ValueError("energy_weight needs one finite, non-negative entry per device stage")

    @property
    def num_stages(self) -> int:
        """Number of pipeline stages (devices); the tuples hold num_stages × virtual_stages entries."""
        return len(self.fwd_s) // self.virtual_stages

    def stage_gpus(self, stage: int) -> int:
        """GPUs working on ``stage`` (its tensor-parallel degree)."""
        return self.gpus_per_stage[stage] if self.gpus_per_stage else 1


def dag_from_inputs(inputs: PipelineInputs, margin: float = 0.0) -> ComputationDag:
    """The computation DAG with DVFS-model options over each stage's catalog clocks (``margin``: the planning guard
    band of :func:`~ampe.energy.options.model_options`; 0 = the model as it is)."""
    specs = []
    blocking = []
    for v, gpu in enumerate(inputs.gpus):
        k = inputs.stage_gpus(v)
        weight = inputs.energy_weight[v % inputs.num_stages] if inputs.energy_weight else 1.0
        if inputs.measured and inputs.measured[v]:
            ms = inputs.measured[v]
            specs.append({FORWARD: _scaled(OpOptions(tuple(Option(float(o.mhz), o.forward_s, o.forward_j)
                                                           for o in ms)), weight),
                          BACKWARD: _scaled(OpOptions(tuple(Option(float(o.mhz), o.backward_s, o.backward_j)
                                                            for o in ms)), weight)})
        else:
            scale = (inputs.power_scale[v] if inputs.power_scale else 1.0) * weight
            act = inputs.activity[v] if inputs.activity else 1.0
            specs.append({FORWARD: _scaled(model_options(gpu, inputs.fwd_s[v], k, margin=margin, act=act), scale),
                          BACKWARD: _scaled(model_options(gpu, inputs.bwd_s[v], k, margin=margin, act=act), scale)})
        if v < inputs.num_stages:  # chunks of one device share its waiting power
            blocking.append(k * dvfs.blocking_power_w(gpu) * weight)
    return build_dag(specs, inputs.num_microbatches, schedule=inputs.schedule, blocking_w=blocking,
                     p2p_forward_s=inputs.p2p_forward_s or None,
                     p2p_backward_s=inputs.p2p_backward_s if inputs.p2p_forward_s else None,
                     virtual_stages=inputs.virtual_stages)


def _scaled(options: OpOptions, scale: float) -> OpOptions:
    """``options`` with every energy × ``scale`` (the measured/modelled power ratio, times the stage's energy
    weight)."""
    if scale == 1.0:
        return options
    return OpOptions(tuple(Option(o.mhz, o.time_s, o.energy_j * scale) for o in options.options))


def power_scales(gpus: Sequence[GpuType], default_energy: Sequence[tuple[float, float] | None]
                 ) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per stage (activities, power scales) from measured default-clock (joules, seconds) of one GPU: the stage's
    activity and the factor on its modelled power (:func:`ampe.energy.dvfs.measured_activity`; docs/energy.md §1,
    "Measured profiles override the model"); (1.0, 1.0) where nothing was measured."""
    acts, scales = [], []
    for gpu, m in zip(gpus, default_energy, strict=False):
        a, k = dvfs.measured_activity(gpu, m[0] / m[1]) if m is not None and m[1] > 0 and m[0] > 0 else (1.0, 1.0)
        acts.append(a)
        scales.append(k)
    return tuple(acts), tuple(scales)


def inputs_from_estimate(estimate: Any, replica: int, gpus: Sequence[GpuType], num_microbatches: int, *,
                         tp: int = 1, schedule: str = "1f1b", virtual_stages: int = 1) -> PipelineInputs:
    """Inputs of data-parallel ``replica`` from a cost-model ``Estimate``.

    ``gpus[s]`` is the GPU type of stage s of that replica (e.g. of its first tensor-parallel shard; a mixed-type
    tensor-parallel group is modelled with that one type). ``estimate.p2p_s[replica][b]`` is used for both the
    activation and the gradient transfer across boundary b. With interleaving (``virtual_stages`` > 1) the estimate
    is per virtual stage and ``gpus`` may list the device stages only; they repeat for every chunk.
    """
    if virtual_stages > 1 and len(gpus) * virtual_stages == len(estimate.fwd_s[replica]):
        gpus = tuple(gpus) * virtual_stages
    p2p = tuple(float(x) for x in getattr(estimate, "p2p_s", [()] * (replica + 1))[replica])
    measured = tuple(getattr(estimate, "clock_options", ()) or ())
    default = tuple(getattr(estimate, "default_energy", ()) or ())
    acts, scales = power_scales(gpus, default[replica]) if default and any(default[replica]) else ((), ())
    return PipelineInputs(
        fwd_s=tuple(float(x) for x in estimate.fwd_s[replica]),
        bwd_s=tuple(float(x) for x in estimate.bwd_s[replica]),
        gpus=tuple(gpus),
        num_microbatches=num_microbatches,
        p2p_forward_s=p2p,
        gpus_per_stage=(tp,) * len(gpus),
        schedule=schedule,
        virtual_stages=virtual_stages,
        measured=measured[replica] if measured and any(measured[replica]) else (),
        power_scale=scales,
        activity=acts,
    )
